// Engram update (docs/MODEL.md 4.8), compressor ratio-2 pooling (4.6.1) and the bf16 scalar multiply.
// Separately rounded reference ops are explicit __f*_rn intrinsics (no FMA contraction).
#include "common.cuh"
#include "engram.cuh"
#include "fixed_reduce.cuh"

namespace ds4r::kern {

namespace {

// One block of 256 threads per (row, copy). Thread t takes d = t, t+256, ... in order for the three
// sums (compensated fp32 pairs), then the fixed compensated block reduction (fp64 across warps), each
// total rounded once to fp32 as the CPU backend's exact sums are (fixed_reduce.cuh); the update pass rereads
// h (unchanged until then: the barriers inside block_sum_fixed order every read before any write, and each
// element is written by the thread that reads it).
__global__ void __launch_bounds__(kFixedReduceThreads)
    engram_update_kernel(uint16_t* __restrict__ X, const uint16_t* __restrict__ kv,
                         const uint16_t* __restrict__ qw, const uint16_t* __restrict__ kw, int64_t hc,
                         int64_t D, float inv_d, float inv_sqrt_d, float eps) {
    __shared__ double scratch[kF64ScratchDoubles<3>];
    const int64_t r = blockIdx.x / hc, k = blockIdx.x - r * hc;
    uint16_t* h = X + (r * hc + k) * D;
    const uint16_t* key = kv + (r * (hc + 1) + k) * D;
    const uint16_t* value = kv + (r * (hc + 1) + hc) * D;
    const uint16_t* q = qw + k * D;
    const uint16_t* kk = kw + k * D;
    CompSum cs[3];  // sum h^2, sum key^2, sum (h * wt) * key
    comp_zero(cs[0]);
    comp_zero(cs[1]);
    comp_zero(cs[2]);
    for (int64_t d = threadIdx.x; d < D; d += kFixedReduceThreads) {
        const float hv = bf16_bits_to_f32(h[d]), kv_ = bf16_bits_to_f32(key[d]);
        const float wt = __fmul_rn(bf16_bits_to_f32(q[d]), bf16_bits_to_f32(kk[d]));  // exact
        comp_add(cs[0], __fmul_rn(hv, hv));                                           // exact
        comp_add(cs[1], __fmul_rn(kv_, kv_));
        // torch: (h * weight * key).sum(-1): the products rounded left to right, then summed.
        comp_add(cs[2], __fmul_rn(__fmul_rn(hv, wt), kv_));
    }
    double sums[3];
    block_sum_comp<3>(cs, sums, scratch, threadIdx.x);
    const float acc[3] = {__double2float_rn(sums[0]), __double2float_rn(sums[1]), __double2float_rn(sums[2])};
    // Separate per-copy statistics (4.8 step 4), mean = sum * fp32(1/D) as CUDA torch.mean.
    const float rstd = __fmul_rn(ref_rsqrt(__fadd_rn(__fmul_rn(acc[0], inv_d), eps)),
                                 ref_rsqrt(__fadd_rn(__fmul_rn(acc[1], inv_d), eps)));
    const float dot = __fmul_rn(__fmul_rn(acc[2], rstd), inv_sqrt_d);
    // Signed square root before the sigmoid (4.8): magnitude >= 1e-3, sign from dot's sign bit.
    // max as torch.clamp_min / std::max: NaN stays NaN.
    const float a = fabsf(dot), lo = 1e-6f;
    const float mag = sqrtf(a < lo ? lo : a);
    const float gate = ref_sigmoid(copysignf(mag, dot));
    for (int64_t d = threadIdx.x; d < D; d += kFixedReduceThreads)
        h[d] =
            f32_to_bf16_bits(__fadd_rn(bf16_bits_to_f32(h[d]), __fmul_rn(gate, bf16_bits_to_f32(value[d]))));
}

__global__ void compress_pool2_kernel(const float* __restrict__ kv, const float* __restrict__ sc,
                                      uint16_t* __restrict__ out, int64_t n, int64_t hd) {
    const int64_t total = n * hd;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t j = e / hd, c = e - j * hd;
        const int64_t i0 = (2 * j) * hd + c, i1 = (2 * j + 1) * hd + c;
        const float a = sc[i0], b = sc[i1];
        const float mx = (a < b) ? b : a;  // std::max(a, b)
        const float ea = expf(__fsub_rn(a, mx)), eb = expf(__fsub_rn(b, mx));
        const float sum = __fadd_rn(ea, eb);
        const float wa = __fdiv_rn(ea, sum), wb = __fdiv_rn(eb, sum);
        float acc = __fadd_rn(0.0f, __fmul_rn(kv[i0], wa));  // torch.sum over the group starts at 0
        acc = __fadd_rn(acc, __fmul_rn(kv[i1], wb));
        out[e] = f32_to_bf16_bits(acc);
    }
}

__global__ void mul_scalar_bf16_kernel(uint16_t* __restrict__ x, int64_t n, float factor) {
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[e] = f32_to_bf16_bits(__fmul_rn(bf16_bits_to_f32(x[e]), factor));
}

}  // namespace

cudaError_t launch_engram_update(uint16_t* X, const uint16_t* kv, const uint16_t* qw, const uint16_t* kw,
                                 int64_t M, int64_t hc, int64_t D, float inv_d, float inv_sqrt_d, float eps,
                                 cudaStream_t stream) {
    if (M <= 0 || hc <= 0 || D <= 0) return cudaSuccess;
    engram_update_kernel<<<static_cast<unsigned>(M * hc), kFixedReduceThreads, 0, stream>>>(
        X, kv, qw, kw, hc, D, inv_d, inv_sqrt_d, eps);
    return cudaGetLastError();
}

cudaError_t launch_compress_pool2(const float* kv, const float* sc, uint16_t* out, int64_t n, int64_t hd,
                                  cudaStream_t stream) {
    if (n <= 0 || hd <= 0) return cudaSuccess;
    compress_pool2_kernel<<<elem_blocks(n * hd), kElemThreads, 0, stream>>>(kv, sc, out, n, hd);
    return cudaGetLastError();
}

cudaError_t launch_mul_scalar_bf16(uint16_t* x, int64_t n, float factor, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    mul_scalar_bf16_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(x, n, factor);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
