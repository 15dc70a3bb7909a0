// Activation-quantization kernels (docs/MODEL.md 5.1, 5.2). Each thread owns 8 consecutive elements; a
// quantization block of 32 (16) elements is 4 (2) consecutive lanes that share the amax by shuffles.
// Every arithmetic step is the CPU twin's (cpu_ref.h), with explicit IEEE intrinsics, so the outputs
// are bit identical (NaN payloads aside: the GPU's NaNs are canonical).
#include "gemm_tile.cuh"  // gemm::e4m3x8_to_f16x8: the GEMM converters' own widening
#include "quant.cuh"
#include "quant_device.cuh"

namespace ds4r::kern {

namespace {

enum class QuantMode : int {
    Fp8Codes,          // q + scale bytes (reference bytes)
    Fp8CodesGemm,      // q + scale bytes (NaN/inf blocks -> 0xFF, see Fp8ScaleBytes)
    Fp8CodesGemmFrag,  // as Fp8CodesGemm, codes in Fp8CodeOrder::GemmFragment
    Fp8Inplace,        // bf16 round trip
    Fp4E8m0Inplace,    // blocks of 32, power-of-two scales
    Fp4E4m3Inplace,    // blocks of 16, e4m3 scales
};

constexpr int kThreads = 256;

// x [n_groups * 8] bf16 (rows * K, contiguous); q [n_groups * 8]; s [n_groups * 8 / 32].
template <QuantMode kMode, bool kVec>
__global__ void __launch_bounds__(kThreads) quant_kernel(uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                                                         uint8_t* __restrict__ s, int64_t n_groups) {
    constexpr int kLanes = kMode == QuantMode::Fp4E4m3Inplace ? 2 : 4;  // lanes per block
    const int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const bool active = g < n_groups;  // inactive lanes still take part in the shuffles
    float v[8];
    if (active) {
        if constexpr (kMode == QuantMode::Fp8CodesGemmFrag)
            load_bf16x8_gemm_fragment<kVec>(x, g, v);  // amax and scale do not depend on the order
        else
            load_bf16x8<kVec>(x + g * 8, v);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    const float amax = group_amax<kLanes>(v);
    if (!active) return;

    if constexpr (kMode == QuantMode::Fp8Codes || kMode == QuantMode::Fp8CodesGemm ||
                  kMode == QuantMode::Fp8CodesGemmFrag) {
        const float sc = fp8_block_scale(amax);
        uint8_t b[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) b[i] = fp8_code(v[i], sc);
        store_u8x8<kVec>(q + g * 8, b);
        if ((g & 3) == 0) {
            uint8_t byte = e8m0_of_pow2(sc);
            if (kMode != QuantMode::Fp8Codes && !(amax <= __int_as_float(0x7f7fffff)))
                byte = 0xff;  // NaN or inf
            s[g >> 2] = byte;
        }
    } else if constexpr (kMode == QuantMode::Fp8Inplace) {
        const float sc = fp8_block_scale(amax);
        uint16_t h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = f32_to_bf16_bits(__fmul_rn(e4m3_to_f32(fp8_code(v[i], sc)), sc));
        store_bf16x8<kVec>(x + g * 8, h);
    } else {
        const float sc = fp4_block_scale(amax, kMode == QuantMode::Fp4E4m3Inplace);
        uint16_t h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = f32_to_bf16_bits(__fmul_rn(e2m1_to_f32(fp4_code(v[i], sc)), sc));
        store_bf16x8<kVec>(x + g * 8, h);
    }
}

template <QuantMode kMode>
cudaError_t launch(uint16_t* x, uint8_t* q, uint8_t* s, int64_t rows, int64_t K, cudaStream_t stream) {
    const int64_t n_groups = rows * K / 8;
    if (n_groups == 0) return cudaSuccess;
    const int64_t blocks = (n_groups + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    // 16-byte vector accesses when every pointer allows them (rows of K % 32 == 0 keep the alignment).
    const bool vec = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (reinterpret_cast<uintptr_t>(q) % 8 == 0);
    if (vec)
        quant_kernel<kMode, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, q, s, n_groups);
    else
        quant_kernel<kMode, false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, q, s, n_groups);
    return cudaGetLastError();
}

// out[i] = bf16(e4m3(w[i]) * e8m0(s[row / 32, col / 32])); one thread per element.
__global__ void __launch_bounds__(kThreads)
    dequant_fp8_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ s, int64_t rows,
                       int64_t cols, uint16_t* __restrict__ out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (i >= rows * cols) return;
    const int64_t r = i / cols, c = i % cols;
    const int64_t s_cols = (cols + 31) / 32;
    out[i] = f32_to_bf16_bits(__fmul_rn(e4m3_to_f32(w[i]), e8m0_to_f32(s[(r >> 5) * s_cols + (c >> 5)])));
}

}  // namespace

cudaError_t launch_dequant_fp8_bf16(const uint8_t* w, const uint8_t* s, int64_t rows, int64_t cols,
                                    uint16_t* out, cudaStream_t stream) {
    const int64_t n = rows * cols;
    if (n == 0) return cudaSuccess;
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    dequant_fp8_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(w, s, rows, cols, out);
    return cudaGetLastError();
}

// The weight copies' kernels and launch shapes (file-local).
namespace {

// 16 packed bytes -> 32 e5m2 bytes per thread. e2m1 magnitude m (3 bits) -> e5m2 byte 0x00, 0x38, 0x3C,
// 0x3E, 0x40, 0x42, 0x44, 0x46 (0, 0.5, 1, 1.5, 2, 3, 4, 6); the sign moves from bit 3 to bit 7.
__device__ __forceinline__ uint32_t e2m1x4_to_e5m2x4(uint32_t nib16) {  // 4 codes in the low 16 bits
    const uint32_t mag = __byte_perm(0x3E3C3800u, 0x46444240u, nib16 & 0x7777u);
    const uint32_t s = nib16 & 0x8888u;
    return mag | ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
}

// The weight copies below widen 16 input bytes into 32 output bytes per thread:
// w [n16 * 16] bytes -> out [n16 * 32] bytes (two uint4 per input uint4).
struct Fp4ToE5m2 {
    __device__ static void widen(uint4 v, uint4& lo, uint4& hi) {
        const uint32_t in[4] = {v.x, v.y, v.z, v.w};
        uint32_t o[8];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            o[2 * t] = e2m1x4_to_e5m2x4(in[t] & 0xFFFFu);
            o[2 * t + 1] = e2m1x4_to_e5m2x4(in[t] >> 16);
        }
        lo = make_uint4(o[0], o[1], o[2], o[3]);
        hi = make_uint4(o[4], o[5], o[6], o[7]);
    }
};
struct E4m3ToF16 {
    __device__ static void widen(uint4 v, uint4& lo, uint4& hi) {
        lo = gemm::e4m3x8_to_f16x8(v.x, v.y);
        hi = gemm::e4m3x8_to_f16x8(v.z, v.w);
    }
};
template <class Widen>
__global__ void widen16_kernel(const uint4* __restrict__ w, int64_t n16, uint4* __restrict__ out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n16) return;
    Widen::widen(w[i], out[2 * i], out[2 * i + 1]);
}
// The launch of a weight copy of `bytes` input bytes (a multiple of 16, both pointers 16-byte aligned,
// else cudaErrorInvalidValue), one thread per `unit` input bytes: *n units, *blocks of kThreads threads
// (0: nothing to copy).
cudaError_t copy_grid(const void* w, const void* out, int64_t bytes, int64_t unit, int64_t* n, unsigned* blocks) {
    if (bytes < 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(out) % 16 != 0)
        return cudaErrorInvalidValue;
    *n = bytes / unit;
    const int64_t b = (*n + kThreads - 1) / kThreads;
    if (b > 0x7fffffffLL) return cudaErrorInvalidValue;
    *blocks = static_cast<unsigned>(b);
    return cudaSuccess;
}
template <class Widen>
cudaError_t launch_widen16(const uint8_t* w, int64_t bytes, void* out, cudaStream_t stream) {
    int64_t n16 = 0;
    unsigned blocks = 0;
    const cudaError_t err = copy_grid(w, out, bytes, 16, &n16, &blocks);
    if (err != cudaSuccess || blocks == 0) return err;
    widen16_kernel<Widen><<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(w), n16,
                                                           reinterpret_cast<uint4*>(out));
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fp4_to_e5m2(const uint8_t* w, int64_t bytes, uint8_t* out, cudaStream_t stream) {
    return launch_widen16<Fp4ToE5m2>(w, bytes, out, stream);
}

namespace {

// Chunks of 16 packed bytes (one 32-wide K block of one row: chunk c's scale is s[c]) -> 64 bytes of fp16.
// Each word of 4 packed bytes gives one 16-byte output; a warp's 32 consecutive words per step (8 chunks),
// so that loads and stores are both coalesced. n4: input words.
__global__ void fp4_to_f16_folded_kernel(const uint32_t* __restrict__ w, const uint8_t* __restrict__ s,
                                         int64_t n4, uint4* __restrict__ out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    out[i] = gemm::e2m1x8_to_f16x8(w[i], gemm::e2m1_f16_mult(s[i / 4]));
}

}  // namespace

cudaError_t launch_fp4_to_f16_folded(const uint8_t* w, const uint8_t* s, int64_t bytes, uint16_t* out,
                                     cudaStream_t stream) {
    int64_t n4 = 0;
    unsigned blocks = 0;
    const cudaError_t err = copy_grid(w, out, bytes, 4, &n4, &blocks);
    if (err != cudaSuccess || blocks == 0) return err;
    fp4_to_f16_folded_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint32_t*>(w), s, n4,
                                                              reinterpret_cast<uint4*>(out));
    return cudaGetLastError();
}

cudaError_t launch_e4m3_to_f16(const uint8_t* w, int64_t n, uint16_t* out, cudaStream_t stream) {
    return launch_widen16<E4m3ToF16>(w, n, out, stream);  // n codes, one byte each
}

cudaError_t launch_act_quant_fp8(const uint16_t* x, uint8_t* q, uint8_t* s, int64_t rows, int64_t K,
                                 Fp8ScaleBytes scale_bytes, Fp8CodeOrder order, cudaStream_t stream) {
    if (K % 32 != 0) return cudaErrorInvalidValue;
    // The kernel does not write x in these modes.
    uint16_t* xm = const_cast<uint16_t*>(x);
    if (order == Fp8CodeOrder::GemmFragment) {
        if (scale_bytes != Fp8ScaleBytes::GemmNanMarker) return cudaErrorInvalidValue;
        return launch<QuantMode::Fp8CodesGemmFrag>(xm, q, s, rows, K, stream);
    }
    return scale_bytes == Fp8ScaleBytes::Reference
               ? launch<QuantMode::Fp8Codes>(xm, q, s, rows, K, stream)
               : launch<QuantMode::Fp8CodesGemm>(xm, q, s, rows, K, stream);
}

cudaError_t launch_act_quant_fp8_inplace(uint16_t* x, int64_t rows, int64_t K, cudaStream_t stream) {
    if (K % 32 != 0) return cudaErrorInvalidValue;
    return launch<QuantMode::Fp8Inplace>(x, nullptr, nullptr, rows, K, stream);
}

cudaError_t launch_fp4_quant_inplace(uint16_t* x, int64_t rows, int64_t K, bool block16_e4m3,
                                     cudaStream_t stream) {
    if (K % (block16_e4m3 ? 16 : 32) != 0) return cudaErrorInvalidValue;
    return block16_e4m3 ? launch<QuantMode::Fp4E4m3Inplace>(x, nullptr, nullptr, rows, K, stream)
                        : launch<QuantMode::Fp4E8m0Inplace>(x, nullptr, nullptr, rows, K, stream);
}

}  // namespace ds4r::kern
