// Reference tensor-core GEMMs for the tests (declared in gemm_oracle.cuh): the per-element instruction
// sequences of kernels/gemm_tile.cuh, written as plainly as possible so that they are obviously the
// sequences that file's NUMERICS comment states. One warp computes one 16 x 8 output block, loading
// every mma.sync fragment element straight from global memory (canonical layouts: the activation
// codes in Fp8CodeOrder::Canonical), with no shared memory, no pipelining and no scale shortcuts:
// - bf16: acc = mma(A[., 16s ..], B[., 16s ..], acc), s = 0 .. 2 * ceil(K / 32) - 1, zeros beyond K.
// - block-scaled: per 32-block P = mma(h1, mma(h0, +0)), acc = acc + (P * sa) * sw (three IEEE
//   roundings), on exact fp16 values of the codes (weight NaN codes as +-480, the value the fast
//   kernels' widening gives them; activation NaN codes as NaN: they only occur in NaN-marker blocks).
// Slow by design; the fast kernels must match it bit for bit.
#include <cuda_fp16.h>

#include "common.cuh"
#include "gemm.cuh"
#include "gemm_oracle.cuh"

namespace ds4r::kern {

namespace {

enum class OracleB : int { BF16 = 0, E4M3 = 1, E2M1 = 2 };

struct OracleParams {
    const uint8_t* a;        // bf16 [M, K] (pitch lda elements) or e4m3 codes [M, K] (pitch K)
    int64_t lda, a_zstride;  // elements
    const uint8_t* sa;       // e8m0 [M, K / 32] (block-scaled)
    const uint8_t* b;        // bf16 [N, K] (pitch ldw) / e4m3 [N, K] / packed e2m1 [N, K / 2]
    int64_t ldw, b_zstride;  // elements (bf16) / bytes per row (e4m3: K, e2m1: K / 2)
    const uint8_t* sb;       // e8m0: e4m3 [ceil(N / 32), K / 32]; e2m1 [N, K / 32]
    uint8_t* y;              // bf16 / f32 [M, N] (pitch ldc elements)
    int64_t ldc, y_zstride;
    bool y_f32;
    int64_t M, N, K;
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // exact for every value used here
    return *reinterpret_cast<const uint32_t*>(&h);
}
// Exact fp16 value of an e4m3 code; the NaN codes as NaN (activations) or +-480 (weights).
__device__ __forceinline__ float e4m3_value(uint8_t code, bool nan_as_480) {
    if (nan_as_480 && (code & 0x7f) == 0x7f) return (code & 0x80) ? -480.0f : 480.0f;
    return e4m3_to_f32(code);
}

template <OracleB kB>
__global__ void __launch_bounds__(32) oracle_kernel(const OracleParams p) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 16, c0 = static_cast<int64_t>(blockIdx.x) * 8;
    const int64_t z = blockIdx.z;
    const int64_t KB = (p.K + 31) / 32;
    const int64_t ra = r0 + g, rb = r0 + g + 8, n = c0 + g;  // fragment rows / column of this lane

    // one fragment element pair (k, k + 1) of A row r / B column n, as the bits mma.sync takes
    // (bf16: the raw bits; block-scaled: exact fp16 values; zero beyond the matrix)
    auto a_pair = [&](int64_t r, int64_t k) -> uint32_t {
        if constexpr (kB == OracleB::BF16) {
            const uint16_t* row = reinterpret_cast<const uint16_t*>(p.a) + z * p.a_zstride + r * p.lda;
            uint32_t bits = 0;
            for (int i = 0; i < 2; ++i)
                if (r < p.M && k + i < p.K) bits |= static_cast<uint32_t>(row[k + i]) << (16 * i);
            return bits;
        } else {
            float v[2] = {0.0f, 0.0f};
            for (int i = 0; i < 2; ++i)
                if (r < p.M && k + i < p.K) v[i] = e4m3_value(p.a[r * p.K + k + i], false);
            return pack_half2(v[0], v[1]);
        }
    };
    auto b_pair = [&](int64_t k) -> uint32_t {
        if constexpr (kB == OracleB::BF16) {
            const uint16_t* row = reinterpret_cast<const uint16_t*>(p.b) + z * p.b_zstride + n * p.ldw;
            uint32_t bits = 0;
            for (int i = 0; i < 2; ++i)
                if (n < p.N && k + i < p.K) bits |= static_cast<uint32_t>(row[k + i]) << (16 * i);
            return bits;
        } else {
            float v[2] = {0.0f, 0.0f};
            for (int i = 0; i < 2; ++i) {
                if (n >= p.N || k + i >= p.K) continue;
                if constexpr (kB == OracleB::E4M3) {
                    v[i] = e4m3_value(p.b[n * p.ldw + k + i], true);
                } else {
                    const uint8_t byte = p.b[n * p.ldw + (k + i) / 2];
                    v[i] = e2m1_to_f32(((k + i) & 1) ? (byte >> 4) : (byte & 15u));
                }
            }
            return pack_half2(v[0], v[1]);
        }
    };

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t kb = 0; kb < KB; ++kb) {
        uint32_t a[2][4], b[2][2];
        for (int h = 0; h < 2; ++h) {
            const int64_t k0 = kb * 32 + h * 16;
            a[h][0] = a_pair(ra, k0 + 2 * t);
            a[h][1] = a_pair(rb, k0 + 2 * t);
            a[h][2] = a_pair(ra, k0 + 2 * t + 8);
            a[h][3] = a_pair(rb, k0 + 2 * t + 8);
            b[h][0] = b_pair(k0 + 2 * t);
            b[h][1] = b_pair(k0 + 2 * t + 8);
        }
        if constexpr (kB == OracleB::BF16) {
            for (int h = 0; h < 2; ++h)
                asm volatile(
                    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                    "{%8, %9}, {%0, %1, %2, %3};\n"
                    : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                    : "r"(a[h][0]), "r"(a[h][1]), "r"(a[h][2]), "r"(a[h][3]), "r"(b[h][0]), "r"(b[h][1]));
        } else {
            float P[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int h = 0; h < 2; ++h)
                asm volatile(
                    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                    "{%8, %9}, {%0, %1, %2, %3};\n"
                    : "+f"(P[0]), "+f"(P[1]), "+f"(P[2]), "+f"(P[3])
                    : "r"(a[h][0]), "r"(a[h][1]), "r"(a[h][2]), "r"(a[h][3]), "r"(b[h][0]), "r"(b[h][1]));
            const int64_t KBs = p.K / 32;  // scale pitch
            for (int e = 0; e < 4; ++e) {
                const int64_t r = r0 + g + 8 * (e >> 1), c = c0 + 2 * t + (e & 1);
                const float sa = r < p.M ? e8m0_to_f32(p.sa[r * KBs + kb]) : 1.0f;
                float sw = 1.0f;
                if (c < p.N) sw = e8m0_to_f32(p.sb[(kB == OracleB::E4M3 ? c / 32 : c) * KBs + kb]);
                acc[e] = __fadd_rn(acc[e], __fmul_rn(__fmul_rn(P[e], sa), sw));
            }
        }
    }
    for (int e = 0; e < 4; ++e) {
        const int64_t r = r0 + g + 8 * (e >> 1), c = c0 + 2 * t + (e & 1);
        if (r >= p.M || c >= p.N) continue;
        if (p.y_f32)
            reinterpret_cast<float*>(p.y)[z * p.y_zstride + r * p.ldc + c] = acc[e];
        else
            reinterpret_cast<uint16_t*>(p.y)[z * p.y_zstride + r * p.ldc + c] = f32_to_bf16_bits(acc[e]);
    }
}

template <OracleB kB>
cudaError_t launch_oracle(const OracleParams& p, int64_t groups, cudaStream_t stream) {
    if (p.M == 0 || p.N == 0 || groups == 0) return cudaSuccess;
    const int64_t gx = (p.N + 7) / 8, gy = (p.M + 15) / 16;
    if (gx > 0x7fffffffLL || gy > 65535 || groups > 65535) return cudaErrorInvalidValue;
    oracle_kernel<kB>
        <<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(groups)), 32, 0,
           stream>>>(p);
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gemm_bf16_oracle(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w,
                                    int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                                    int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                                    cudaStream_t stream) {
    OracleParams p{};
    p.a = reinterpret_cast<const uint8_t*>(x);
    p.lda = lda;
    p.a_zstride = x_goff;
    p.b = reinterpret_cast<const uint8_t*>(w);
    p.ldw = ldw;
    p.b_zstride = w_goff;
    p.y = static_cast<uint8_t*>(y);
    p.ldc = ldc;
    p.y_zstride = y_goff;
    p.y_f32 = y_f32;
    p.M = M;
    p.N = N;
    p.K = K;
    return launch_oracle<OracleB::BF16>(p, groups, stream);
}

cudaError_t launch_gemm_fp8_oracle(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                   uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                   cudaStream_t stream) {
    if (K % 32 != 0) return cudaErrorInvalidValue;
    OracleParams p{};
    p.a = q;
    p.sa = sa;
    p.b = w;
    p.ldw = K;
    p.sb = sw;
    p.y = reinterpret_cast<uint8_t*>(y);
    p.ldc = ldc;
    p.M = M;
    p.N = N;
    p.K = K;
    return launch_oracle<OracleB::E4M3>(p, 1, stream);
}

cudaError_t launch_gemm_fp4_oracle(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                   uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                   cudaStream_t stream) {
    if (K % 32 != 0) return cudaErrorInvalidValue;
    OracleParams p{};
    p.a = q;
    p.sa = sa;
    p.b = w;
    p.ldw = K / 2;
    p.sb = sw;
    p.y = reinterpret_cast<uint8_t*>(y);
    p.ldc = ldc;
    p.M = M;
    p.N = N;
    p.K = K;
    return launch_oracle<OracleB::E2M1>(p, 1, stream);
}

}  // namespace ds4r::kern
