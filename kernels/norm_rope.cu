// RMSNorm and RoPE kernels (docs/MODEL.md 4.0, 8.2, 8.3). Every fp32 operation that the reference rounds
// separately is written as an explicit __f*_rn intrinsic so nvcc's FMA contraction cannot merge it.
#include "common.cuh"
#include "fixed_reduce.cuh"
#include "libm_sincosf.cuh"
#include "norm_rope.cuh"
#include "rope_table_device.cuh"

namespace ds4r::kern {

namespace {

// ------------------------------------------------------------------ RMSNorm
// One block of 256 threads per row. Thread t sums x[t]^2, x[t+256]^2, ... in order (squares of bf16
// values are exact in fp32) as a compensated fp32 pair, then the fixed compensated block reduction
// (fp64 across warps) and one rounding to fp32: the CPU backend's exact sum rounded once (fixed_reduce.cuh; a
// plain fp32 sum is a few ulps off on long rows). Reads of the row finish (barrier inside the block
// reduction) before any write, so y may alias x.
__global__ void __launch_bounds__(kFixedReduceThreads)
    rms_norm_kernel(const uint16_t* __restrict__ w, const uint16_t* x, uint16_t* y, int64_t n, float inv_n,
                    float eps) {
    __shared__ double scratch[kF64ScratchDoubles<1>];
    const int64_t row = blockIdx.x;
    const uint16_t* xr = x + row * n;
    uint16_t* yr = y + row * n;
    CompSum cs;
    comp_zero(cs);
    for (int64_t i = threadIdx.x; i < n; i += kFixedReduceThreads) {
        const float v = bf16_bits_to_f32(xr[i]);
        comp_add(cs, __fmul_rn(v, v));
    }
    CompSum parts[1] = {cs};
    double acc[1];
    block_sum_comp<1>(parts, acc, scratch, threadIdx.x);
    const float ssq = __double2float_rn(acc[0]);
    // var = mean(x^2) as CUDA torch.mean: sum * fp32(1/n); x * rsqrt(var + eps), then w * that.
    const float r = ref_rsqrt(__fadd_rn(__fmul_rn(ssq, inv_n), eps));
    for (int64_t i = threadIdx.x; i < n; i += kFixedReduceThreads) {
        const float xn = __fmul_rn(bf16_bits_to_f32(xr[i]), r);
        yr[i] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(w[i]), xn));
    }
}

// ------------------------------------------------------------------ RoPE tables
__global__ void rope_inv_freqs_kernel(float base, float factor, int yarn, float low, float span, int64_t rd,
                                      float* inv_freq) {
    const int64_t half = rd / 2;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < half;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        // torch CPU: arange(0, rd, 2, fp32) / rd (true division), base ** that (fp32 pow: the
        // correctly rounded value; computed in double and rounded once), 1.0 / that.
        const float expo = __fdiv_rn(static_cast<float>(2 * i), static_cast<float>(rd));
        const float p = __double2float_rn(pow(static_cast<double>(base), static_cast<double>(expo)));
        float f = __fdiv_rn(1.0f, p);
        if (yarn) {
            // linear_ramp_factor: (arange - low) / (high - low), clamp(0, 1); smooth = 1 - ramp;
            // freqs / factor * (1 - smooth) + freqs * smooth: four separately rounded tensor ops.
            float ramp = __fdiv_rn(__fsub_rn(static_cast<float>(i), low), span);
            ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
            const float smooth = __fsub_rn(1.0f, ramp);
            const float scaled = __fdiv_rn(f, factor);
            f = __fadd_rn(__fmul_rn(scaled, __fsub_rn(1.0f, smooth)), __fmul_rn(f, smooth));
        }
        inv_freq[i] = f;
    }
}

// torch.polar's (cos, sin) on the CPU: glibc's cosf / sinf, ported (libm_sincosf.cuh).
struct GlibcSinCos {
    __device__ __forceinline__ void operator()(float angle, float* c, float* s) const {
        *c = libm_sincosf(angle, 1);
        *s = libm_sincosf(angle, 0);
    }
};

// ------------------------------------------------------------------ RoPE application
// One thread per (row, head, pair). Complex multiply (a + ib)(c + is) in fp32 as CUDA torch's
// c10::complex<float> operator*= compiles under nvcc's default contraction (our best reading of
// LLVM's FMA combine: the first product of each expression fused): re = fma(a, c, -(b*s)),
// im = fma(a, s, b*c). The CPU backend rounds both products; the two differ by <= 1 bf16 ulp.
__global__ void rope_inplace_kernel(uint16_t* x, int64_t rows, int64_t heads, int64_t width, int64_t rd,
                                    const int32_t* __restrict__ pos, const float* __restrict__ table,
                                    int64_t n_pos, int inverse) {
    const int64_t half = rd / 2;
    const int64_t total = rows * heads * half;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = e % half;
        const int64_t rh = e / half;  // row * heads + head
        const int64_t r = rh / heads;
        uint16_t* v = x + rh * width + (width - rd) + 2 * i;
        const int32_t p = pos[r];
        if (p < 0 || p >= n_pos) {
            v[0] = 0x7fc0;  // bf16 NaN
            v[1] = 0x7fc0;
            continue;
        }
        const float c = table[(static_cast<int64_t>(p) * half + i) * 2];
        const float s0 = table[(static_cast<int64_t>(p) * half + i) * 2 + 1];
        const float s = inverse ? -s0 : s0;
        const float a = bf16_bits_to_f32(v[0]), b = bf16_bits_to_f32(v[1]);
        const float re = __fmaf_rn(a, c, -__fmul_rn(b, s));
        const float im = __fmaf_rn(a, s, __fmul_rn(b, c));
        v[0] = f32_to_bf16_bits(re);
        v[1] = f32_to_bf16_bits(im);
    }
}

}  // namespace

cudaError_t launch_rms_norm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t rows, int64_t n,
                            float inv_n, float eps, cudaStream_t stream) {
    if (rows <= 0 || n <= 0) return cudaSuccess;
    rms_norm_kernel<<<static_cast<unsigned>(rows), kFixedReduceThreads, 0, stream>>>(w, x, y, n, inv_n, eps);
    return cudaGetLastError();
}

cudaError_t launch_rope_inv_freqs(float base, float factor, int yarn, float low, float span, int64_t rd,
                                  float* inv_freq, cudaStream_t stream) {
    if (rd < 2) return cudaSuccess;
    rope_inv_freqs_kernel<<<elem_blocks(rd / 2), kElemThreads, 0, stream>>>(base, factor, yarn, low, span, rd,
                                                                            inv_freq);
    return cudaGetLastError();
}

cudaError_t launch_rope_table(const float* inv_freq, int64_t n_pos, int64_t half, float* table,
                              cudaStream_t stream) {
    if (n_pos <= 0 || half <= 0) return cudaSuccess;
    rope_table_kernel<GlibcSinCos>
        <<<elem_blocks(n_pos * half), kElemThreads, 0, stream>>>(inv_freq, n_pos, half, table);
    return cudaGetLastError();
}

cudaError_t launch_rope_inplace(uint16_t* x, int64_t rows, int64_t heads, int64_t width, int64_t rd,
                                const int32_t* pos, const float* table, int64_t n_pos, int inverse,
                                cudaStream_t stream) {
    const int64_t total = rows * heads * (rd / 2);
    if (total <= 0) return cudaSuccess;
    rope_inplace_kernel<<<elem_blocks(total), kElemThreads, 0, stream>>>(x, rows, heads, width, rd, pos,
                                                                         table, n_pos, inverse);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
