// mma.sync instruction-level peak (for `ds4replay bench`, declared in gemm.cuh): warps issuing only
// back-to-back independent mma.sync.m16n8k16 bf16 -> fp32 from registers, no memory traffic in the
// loop. kChains independent accumulators per warp, kWarps warps per block and two blocks per SM keep
// 8 warps x 16 chains per SM sub-partition in flight: far more than the MMA latency needs.
#include "common.cuh"
#include "gemm.cuh"

namespace ds4r::kern {

namespace {

constexpr int kPeakWarps = 8, kChains = 16;

__global__ void __launch_bounds__(kPeakWarps * 32, 2) mma_peak_kernel(int iters, float* out) {
    const int lane = threadIdx.x & 31;
    // small non-zero bf16 operands (0.0625 .. 0.11): products and sums stay finite for any iters
    uint32_t a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = 0x3d803d80u + static_cast<uint32_t>((lane + i) & 7) * 0x00010001u;
    b[0] = 0x3d803d80u + static_cast<uint32_t>(lane & 3);
    b[1] = 0x3d803d80u + static_cast<uint32_t>((lane >> 2) & 3);
    float acc[kChains][4];
#pragma unroll
    for (int c = 0; c < kChains; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = 0.0f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < kChains; ++c)
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                "{%8, %9}, "
                "{%0, %1, %2, %3};\n"
                : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kChains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = s;  // keeps the MMAs alive
}

}  // namespace

int mma_peak_threads_per_block() {
    return kPeakWarps * 32;
}

double mma_peak_flops_per_launch(int blocks, int iters) {
    return 2.0 * 16 * 8 * 16 * static_cast<double>(blocks) * kPeakWarps * kChains *
           static_cast<double>(iters);
}

cudaError_t launch_mma_peak(int blocks, int iters, float* out, cudaStream_t stream) {
    if (blocks <= 0 || iters <= 0) return cudaErrorInvalidValue;
    mma_peak_kernel<<<blocks, kPeakWarps * 32, 0, stream>>>(iters, out);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
