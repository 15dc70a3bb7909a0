// Scalar building blocks of the CPU reference backend, shared with the tests and with the CUDA test
// suite: activation-quantization of one block (docs/MODEL.md 5.1, 5.2), CUDA torch.topk's selection rule
// (docs/MODEL.md 8.1), the elementwise forms the reference evaluates on CUDA (8.2), the Sinkhorn split of
// the mHC mixes (5.5), the RoPE table formulas (4.0, 8.3) and the router's weight sum (4.7).
//
// Everything here is plain fp32/fp64 host arithmetic. The library is compiled with
// -ffp-contract=off, so a*b + c is two roundings unless std::fma is written out.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/numeric.h"
#include "ds4r/yarn.h"

namespace ds4r::cpuref {

// The scalar quantization steps and their constants (kFp8MaxInv, fp8_block_scale, fp8_code,
// fp4_e8m0_block_scale, fp4_e4m3_block_scale_code, fp4_code, ...) are include/ds4r/numeric.h's,
// shared with the CUDA kernels.

// amax = max |x| of a block of bf16 values, in fp32 (exact; NaN-propagating like torch.amax).
float block_amax_bf16(const uint16_t* x, int64_t n);

// FP8 activation quantization of one block (docs/MODEL.md 5.1): x bf16 [n] -> q e4m3 codes [n]; returns
// the scale (a power of two) and writes its e8m0 byte to *scale_byte (may be null).
float fp8_quant_block(const uint16_t* x, int64_t n, uint8_t* q, uint8_t* scale_byte);

// FP4 scale of one block (docs/MODEL.md 5.2, 8.2) from its raw amax: E8M0_32 -> power of two (byte = e8m0),
// E4M3_16 -> e4m3(amax / 6) (byte = e4m3 code). Applies the branch's amax floor.
float fp4_block_scale(float amax, Fp4Scale kind, uint8_t* scale_byte);
// FP4 quantization of one block: x bf16 [n] -> e2m1 codes [n] (one code per byte, sign in bit 3);
// returns the scale. v = clamp(x / s, -6, 6) with a true fp32 division, e2m1 ties to the even code.
float fp4_quant_block(const uint16_t* x, int64_t n, Fp4Scale kind, uint8_t* codes, uint8_t* scale_byte);
// Block size of a fp4 scale kind: 32 (E8M0_32) or 16 (E4M3_16).
inline int64_t fp4_block_size(Fp4Scale kind) {
    return kind == Fp4Scale::E8M0_32 ? 32 : 16;
}

// e4m3 / e2m1 code -> fp32 lookup tables (256 and 16 entries).
const float* e4m3_table();
const float* e2m1_table();

// ------------------------------------------------------------------ elementwise forms (docs/MODEL.md 8.2)
// torch.sigmoid on CUDA: 1 / (1 + exp(-x)), fp32 (std::exp here; CUDA uses libdevice expf, which is
// built on ex2.approx and can differ in the last ulp).
inline float sigmoid_f32(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}
// F.softplus(beta=1, threshold=20): x if x > 20 else log1p(exp(x)).
inline float softplus_f32(float x) {
    return x > 20.0f ? x : std::log1p(std::exp(x));
}
// F.silu: g / (1 + exp(-g)) as ONE division (not g * sigmoid(g), which rounds twice).
inline float silu_f32(float g) {
    return g / (1.0f + std::exp(-g));
}
// Exactly rounded 1/sqrt(v) (computed in double, rounded once). CUDA's torch.rsqrt is the
// approximate rsqrtf (docs/MODEL.md 8.2); the CPU reference keeps the exactly rounded value. This is
// the one known source of the CPU backend's residual teacher-forced mismatch: in tiny-a seq 5
// layer 3, token 1's ffn_norm r is 1 fp32 ulp below the GPU's, which flips an fp8 act-quant scale
// inside the MoE (r + 1 ulp reproduces the dumped MoE output bit for bit).
inline float rsqrt_f32(float v) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(v)));
}
// torch.mean on CUDA (ATen ReduceMomentKernel.cu, MeanOps::project): sum * factor with
// factor = float(1) / n, i.e. a multiplication by the fp32 reciprocal, not a true division.
inline float mean_from_sum(float sum, int64_t n) {
    const float factor = 1.0f / static_cast<float>(n);
    return sum * factor;
}
// `tensor / python_scalar` on CUDA (ATen BinaryDivTrueKernel.cu): multiplication by the fp32
// reciprocal 1.0f / float(b).
inline float div_by_scalar_cuda(float a, double b) {
    return a * (1.0f / static_cast<float>(b));
}

// Sum of fp32 values accumulated exactly in double and rounded once to fp32 (our model of a GPU
// reduction / MMA whose internal order is not reproduced).
inline float sum_sq_bf16_f32(const uint16_t* x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double v = bf16_to_f32(x[i]);
        s += v * v;
    }
    return static_cast<float>(s);
}

// The router's normalisation sum over the top-k weights (docs/MODEL.md 4.7, 8.2): for k == 6 CUDA
// torch.sum's order ((w0 + w4) + w2) + ((w1 + w5) + w3); for other k a sequential fp32 sum (the
// CUDA order for other widths was not measured).
float topk_weight_sum(const float* w, int k);

// ------------------------------------------------------------------ top-k (docs/MODEL.md 8.1)
// Order key: topk_order_key (include/ds4r/numeric.h, shared with the CUDA router).
// Indices of the k largest of values[0..n) under CUDA torch.topk's rule: every index whose value is
// strictly greater than the k-th largest, in ascending index order, then the indices whose value
// equals it, in ascending index order, until k are taken. Returned in that selection order.
// Requires 0 <= k <= n. `scratch` is reused between calls (no allocation after the first).
void select_topk_cuda_rule(const float* values, int64_t n, int64_t k, std::vector<uint32_t>& scratch,
                           int64_t* out);
std::vector<int64_t> select_topk_cuda_rule(const float* values, int64_t n, int64_t k);
// The same selection, ordered by descending value with ties by ascending index (torch.topk's
// sorted=True output as used by the router; CUDA's order among exact ties is not pinned).
std::vector<int64_t> topk_sorted_desc_cuda_rule(const float* values, int64_t n, int64_t k);

// Python floor division (a // b for b > 0).
inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

// ------------------------------------------------------------------ mHC (docs/MODEL.md 5.5)
// hc_split_sinkhorn for one token, all fp32: mixes [(2 + hc) * hc], scale [3], base [(2 + hc) * hc]
// -> pre [hc], post [hc], comb [hc * hc] (comb[j * hc + k]: row j, column k). Softmax rows
// (max-subtracted) + eps, column normalize, then (iters - 1) x (row, column); sums sequential from 0.
void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int hc, int iters,
                       float eps, float* pre, float* post, float* comb);

// ------------------------------------------------------------------ RoPE (docs/MODEL.md 4.0, 8.3)
// YaRN correction band: yarn_band (include/ds4r/yarn.h, shared with the CUDA backend).
// Inverse frequencies f[rd / 2] in fp32, in model.py precompute_freqs_cis's order:
// f = 1 / pow(base, (2i) / rd) (pow correctly rounded); with YaRN (orig > 0):
// ramp = clamp((i - low) / max(high - low, 0.001), 0, 1), smooth = 1 - ramp,
// f = (f / factor) * (1 - smooth) + f * smooth. Divisions are true fp32 divisions.
//
// Why these forms: the golden tables (tests/data/tiny-a/rope_*.npy) are reproduced bit for bit by
// torch's CPU evaluation (true divisions; torch.polar's std::cos / std::sin = glibc cosf / sinf of
// the fp32 angle) and NOT by CUDA's libdevice sinf / cosf; see cpu_rope_test. pow: glibc powf, the
// correctly rounded value and the golden table agree; for the shipped bases (1e4, 1.6e5) and
// rd = 16 / 64 every exact pow lies >= 0.02 ulp away from an fp32 rounding midpoint.
void rope_inv_freqs(double base, double factor, int64_t orig, double beta_fast, double beta_slow, int64_t rd,
                    float* f);
// (cos, sin) of angle = fp32(pos) * f (torch.outer in fp32, then torch.polar): glibc cosf / sinf.
inline void rope_cos_sin(int64_t pos, float f, float* c, float* s) {
    const float angle = static_cast<float>(pos) * f;
    *c = std::cos(angle);
    *s = std::sin(angle);
}

}  // namespace ds4r::cpuref
