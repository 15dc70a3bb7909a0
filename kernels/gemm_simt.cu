// CUDA-core fp32 GEMM (FFMA): y = f32(x) . f32(w)^T for fp32 operands (no TF32 anywhere, docs/DESIGN.md 4)
// and for any shape / alignment the tensor-core path does not take. Block tile 128 x 128 x 8, 256
// threads, 8 x 8 outputs per thread; every output accumulates K in ascending order with fmaf, so the
// result depends on nothing but the operands (batch invariant, deterministic).
#include "common.cuh"
#include "gemm.cuh"

namespace ds4r::kern {

namespace {

constexpr int kTile = 128, kTK = 8, kSimtThreads = 256;

struct SimtParams {
    const uint8_t* x;  // [M, K] (+ z * x_zstride), pitch bytes
    int64_t x_pitch, x_zstride;
    const uint8_t* w;  // [N, K]
    int64_t w_pitch, w_zstride;
    uint8_t* y;  // [M, N]
    int64_t y_pitch, y_zstride;
    int64_t M, N, K;
};

template <bool kF32>
__device__ __forceinline__ float load_elem(const uint8_t* row, int64_t k) {
    if constexpr (kF32)
        return reinterpret_cast<const float*>(row)[k];
    else
        return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[k]);
}

template <bool kXF32, bool kWF32, bool kYF32>
__global__ void __launch_bounds__(kSimtThreads) gemm_simt_kernel(const SimtParams p) {
    __shared__ __align__(16) float xs[kTK][kTile];
    __shared__ __align__(16) float ws[kTK][kTile];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile,
                  m0 = static_cast<int64_t>(blockIdx.y) * kTile;
    const int64_t z = blockIdx.z;
    const uint8_t* X = p.x + z * p.x_zstride;
    const uint8_t* W = p.w + z * p.w_zstride;
    // loader: row lr (0..127) of the tile, k lk .. lk + 3 of the K step
    const int lr = tid >> 1, lk = (tid & 1) * 4;
    const bool x_ok = m0 + lr < p.M, w_ok = n0 + lr < p.N;
    const uint8_t* xrow = X + (x_ok ? m0 + lr : 0) * p.x_pitch;
    const uint8_t* wrow = W + (w_ok ? n0 + lr : 0) * p.w_pitch;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) acc[i][jj] = 0.0f;

    float xr[4], wr[4];
    auto fetch = [&](int64_t k0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t k = k0 + lk + i;
            xr[i] = (x_ok && k < p.K) ? load_elem<kXF32>(xrow, k) : 0.0f;
            wr[i] = (w_ok && k < p.K) ? load_elem<kWF32>(wrow, k) : 0.0f;
        }
    };
    fetch(0);
    for (int64_t k0 = 0; k0 < p.K; k0 += kTK) {
        __syncthreads();  // everyone is done reading the previous step
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            xs[lk + i][lr] = xr[i];
            ws[lk + i][lr] = wr[i];
        }
        __syncthreads();
        if (k0 + kTK < p.K) fetch(k0 + kTK);  // overlaps the math below
#pragma unroll
        for (int kk = 0; kk < kTK; ++kk) {
            float a[8], b[8];
            const float4 a0 = *reinterpret_cast<const float4*>(&xs[kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&xs[kk][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&ws[kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&ws[kk][64 + tx * 4]);
            a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w, a[4] = a1.x, a[5] = a1.y, a[6] = a1.z,
            a[7] = a1.w;
            b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z,
            b[7] = b1.w;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) acc[i][jj] = fmaf(a[i], b[jj], acc[i][jj]);
        }
    }
    uint8_t* Y = p.y + z * p.y_zstride;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
        if (r >= p.M) continue;
        uint8_t* yrow = Y + r * p.y_pitch;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int64_t c = n0 + (jj < 4 ? tx * 4 + jj : 64 + tx * 4 + jj - 4);
            if (c >= p.N) continue;
            if constexpr (kYF32)
                reinterpret_cast<float*>(yrow)[c] = acc[i][jj];
            else
                reinterpret_cast<uint16_t*>(yrow)[c] = f32_to_bf16_bits(acc[i][jj]);
        }
    }
}

template <bool kXF32, bool kWF32, bool kYF32>
void launch_simt(const SimtParams& p, dim3 grid, cudaStream_t stream) {
    gemm_simt_kernel<kXF32, kWF32, kYF32><<<grid, kSimtThreads, 0, stream>>>(p);
}

}  // namespace

cudaError_t launch_gemm_simt(const void* x, bool x_f32, int64_t lda, int64_t x_goff, const void* w,
                             bool w_f32, int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                             int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                             cudaStream_t stream) {
    if (M == 0 || N == 0 || groups == 0) return cudaSuccess;
    const int64_t gx = (N + kTile - 1) / kTile, gy = (M + kTile - 1) / kTile;
    if (gx > 0x7fffffffLL || gy > 65535 || groups > 65535) return cudaErrorInvalidValue;
    const int64_t xb = x_f32 ? 4 : 2, wb = w_f32 ? 4 : 2, yb = y_f32 ? 4 : 2;
    SimtParams p{};
    p.x = static_cast<const uint8_t*>(x);
    p.x_pitch = lda * xb;
    p.x_zstride = x_goff * xb;
    p.w = static_cast<const uint8_t*>(w);
    p.w_pitch = ldw * wb;
    p.w_zstride = w_goff * wb;
    p.y = static_cast<uint8_t*>(y);
    p.y_pitch = ldc * yb;
    p.y_zstride = y_goff * yb;
    p.M = M;
    p.N = N;
    p.K = K;
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(groups));
    const int sel = (x_f32 ? 4 : 0) | (w_f32 ? 2 : 0) | (y_f32 ? 1 : 0);
    switch (sel) {
        case 0:
            launch_simt<false, false, false>(p, grid, stream);
            break;
        case 1:
            launch_simt<false, false, true>(p, grid, stream);
            break;
        case 2:
            launch_simt<false, true, false>(p, grid, stream);
            break;
        case 3:
            launch_simt<false, true, true>(p, grid, stream);
            break;
        case 4:
            launch_simt<true, false, false>(p, grid, stream);
            break;
        case 5:
            launch_simt<true, false, true>(p, grid, stream);
            break;
        case 6:
            launch_simt<true, true, false>(p, grid, stream);
            break;
        default:
            launch_simt<true, true, true>(p, grid, stream);
            break;
    }
    return cudaGetLastError();
}

}  // namespace ds4r::kern
