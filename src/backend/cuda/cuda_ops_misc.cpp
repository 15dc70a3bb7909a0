// CudaBackend ops: RMSNorm, RoPE tables and application, mHC mixes / pre / post, the compressor's
// ratio-2 pooling, the Engram update and the bf16 scalar multiply (docs/MODEL.md 4.0, 4.5, 4.6.1, 4.8,
// 5.5, 8). Contracts: backend/op_checks.h, plus the kernels' own limits here; the kernels live in
// kernels/{norm_rope,hc,engram}.cu.
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_linear_checks.h"
#include "ds4r/yarn.h"
#include "engram.cuh"
#include "hc.cuh"
#include "norm_rope.cuh"

namespace ds4r {

using namespace cuda_linear;

namespace {

// torch.mean's factor on CUDA (as the CPU's cpuref::mean_from_sum): fp32(1) / fp32(n).
float mean_factor(int64_t n) {
    return 1.0f / static_cast<float>(n);
}

}  // namespace

// ---------------------------------------------------------------------------- norms, RoPE

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    // x, y BF16 [M, N] (may alias), w BF16 [N] (docs/MODEL.md 4.0, 8.2).
    const char* op = "rms_norm";
    const auto [M, N] = opcheck::rms_norm(x, w, y);
    check_same_or_disjoint(op, "x", x, "y", y);
    check_grid(op, M);
    if (M == 0 || N == 0) return;
    DS4R_CUDA_CHECK(kern::launch_rms_norm(x.ptr<uint16_t>(), w.ptr<uint16_t>(), y.ptr<uint16_t>(), M, N,
                                          mean_factor(N), eps, stream()));
}

Tensor CudaBackend::rope_inv_freqs(double base, double factor, int64_t yarn_orig, double beta_fast,
                                   double beta_slow, int64_t rd, const Tensor& table) {
    opcheck::rope_table(base, factor, rd, table);
    float low_f = 0.0f, span_f = 1.0f;
    const int yarn = yarn_orig > 0 ? 1 : 0;
    if (yarn) {
        // find_correction_range in Python doubles (math.floor / math.ceil), then
        // linear_ramp_factor(low, high): max += 0.001 when equal, divided by (max - min) as fp32.
        int64_t low = 0, high = 0;
        yarn_band(base, yarn_orig, beta_fast, beta_slow, rd, &low, &high);
        const double span = low == high ? (static_cast<double>(high) + 0.001) - static_cast<double>(low)
                                        : static_cast<double>(high - low);
        low_f = static_cast<float>(low);
        span_f = static_cast<float>(span);
    }
    Tensor inv_freq = alloc(DType::F32, {rd / 2});
    DS4R_CUDA_CHECK(kern::launch_rope_inv_freqs(static_cast<float>(base), static_cast<float>(factor), yarn,
                                                low_f, span_f, rd, inv_freq.ptr<float>(), stream()));
    return inv_freq;
}

void CudaBackend::rope_table(double base, double factor, int64_t yarn_orig, double beta_fast,
                             double beta_slow, int64_t rd, const Tensor& table) {
    // table F32 [n_pos, rd/2, 2]. The golden tables are torch's CPU evaluation of
    // precompute_freqs_cis (true fp32 divisions, correctly rounded pow, glibc cosf / sinf of the fp32
    // angle), reproduced here on the GPU; kernels/libm_sincosf.cuh says why not CUDA's functions.
    const Tensor inv_freq = rope_inv_freqs(base, factor, yarn_orig, beta_fast, beta_slow, rd, table);
    if (table.dim(0) == 0) return;
    DS4R_CUDA_CHECK(
        kern::launch_rope_table(inv_freq.ptr<float>(), table.dim(0), rd / 2, table.ptr<float>(), stream()));
}

void CudaBackend::rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                               const Tensor& table, bool inverse) {
    // x BF16 [M, heads * width], the last rd dims of each head rotated at pos[r] (I32 [M], device
    // memory: a value outside the table turns that row's rotated dims into NaN); table F32
    // [n_pos, rd/2, 2] (docs/MODEL.md 4.0, 8.3).
    const int64_t M = opcheck::rope_inplace(x, heads, width, rd, pos, table);
    if (M == 0) return;
    DS4R_CUDA_CHECK(kern::launch_rope_inplace(x.ptr<uint16_t>(), M, heads, width, rd, pos.ptr<int32_t>(),
                                              table.ptr<float>(), table.dim(0), inverse ? 1 : 0, stream()));
}

// ---------------------------------------------------------------------------- mHC

void CudaBackend::hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base,
                           float norm_eps, float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                           const Tensor& comb) {
    // X BF16 [M, hc, D]; fn F32 [mix, hc*D]; scale F32 [3]; base F32 [mix] -> pre, post F32 [M, hc],
    // comb F32 [M, hc, hc] (docs/MODEL.md 4.5, 5.5). The kernel is built for hc = 4 (mix = 24).
    const char* op = "hc_mixes";
    const auto [M, hc, D] = opcheck::hc_mixes(X, fn, scale, base, iters, pre, post, comb);
    DS4R_CHECK(hc == kern::kHcMult, "cuda hc_mixes: hc = %lld, the kernel supports hc = %d only",
               (long long)hc, kern::kHcMult);
    static_assert(kern::kHcMix == (2 + kern::kHcMult) * kern::kHcMult, "fn rows as opcheck::hc_mixes");
    check_grid(op, kern::hc_mixes_blocks(M, gemm_.hc_mix));
    if (M == 0) return;
    DS4R_CHECK(D > 0, "cuda hc_mixes: D must be positive, got X %s", shape_str(X.shape).c_str());
    DS4R_CUDA_CHECK(kern::launch_hc_mixes(X.ptr<uint16_t>(), fn.ptr<float>(), scale.ptr<float>(),
                                          base.ptr<float>(), M, D, mean_factor(hc * D), norm_eps, hc_eps,
                                          iters, pre.ptr<float>(), post.ptr<float>(), comb.ptr<float>(),
                                          stream(), gemm_.hc_mix));
}

void CudaBackend::hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) {
    // y BF16 [M, D] = bf16(((m0*X0 + m1*X1) + m2*X2) + m3*X3) in fp32; X BF16 [M, hc, D]; mix F32 [M, hc].
    const char* op = "hc_pre";
    const auto [M, hc, D] = opcheck::hc_pre(X, mix, y);
    check_disjoint(op, "y", y, "X", X);
    if (M == 0 || D == 0) return;
    DS4R_CUDA_CHECK(
        kern::launch_hc_pre(X.ptr<uint16_t>(), mix.ptr<float>(), y.ptr<uint16_t>(), M, hc, D, stream()));
}

void CudaBackend::hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                          const Tensor& out) {
    // out BF16 [M, hc, D]: out_k = bf16(post_k * x + S_k), S_k = ((c0k*R0 + c1k*R1) + c2k*R2) + c3k*R3;
    // x BF16 [M, D]; R BF16 [M, hc, D] (may alias out); post F32 [M, hc]; comb F32 [M, hc, hc].
    const char* op = "hc_post";
    const auto [M, hc, D] = opcheck::hc_post(x, R, post, comb, out);
    DS4R_CHECK(hc >= 1 && hc <= 8, "cuda hc_post: hc = %lld outside [1, 8]", (long long)hc);
    check_same_or_disjoint(op, "out", out, "R", R);
    check_disjoint(op, "out", out, "x", x);
    if (M == 0 || D == 0) return;
    DS4R_CUDA_CHECK(kern::launch_hc_post(x.ptr<uint16_t>(), R.ptr<uint16_t>(), post.ptr<float>(),
                                         comb.ptr<float>(), out.ptr<uint16_t>(), M, hc, D, stream()));
}

// ---------------------------------------------------------------------------- compressor

void CudaBackend::compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) {
    // kv, sc F32 [2n (+1), hd] -> out BF16 [n, hd]; a trailing odd row is ignored (docs/MODEL.md 4.6.1).
    const opcheck::PoolDims d = opcheck::compress_pool2(kv, sc, out);
    const int64_t n = d.n, hd = d.hd;
    if (n == 0 || hd == 0) return;
    DS4R_CUDA_CHECK(
        kern::launch_compress_pool2(kv.ptr<float>(), sc.ptr<float>(), out.ptr<uint16_t>(), n, hd, stream()));
}

// ---------------------------------------------------------------------------- Engram

void CudaBackend::engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                                float eps) {
    // X BF16 [M, hc, D] in place; kv BF16 [M, (hc + 1) * D] (keys of copy k at columns k*D.., the
    // shared value last); qw, kw BF16 [hc, D] (docs/MODEL.md 4.8 steps 2-5).
    const char* op = "engram_update";
    const auto [M, hc, D] = opcheck::engram_update(X, kv, qw, kw);
    check_disjoint(op, "X", X, "kv", kv);
    check_grid(op, M * hc);
    if (M == 0 || hc == 0 || D == 0) return;
    const float inv_sqrt_d = static_cast<float>(std::pow(static_cast<double>(D), -0.5));  // self.dim ** -0.5
    DS4R_CUDA_CHECK(kern::launch_engram_update(X.ptr<uint16_t>(), kv.ptr<uint16_t>(), qw.ptr<uint16_t>(),
                                               kw.ptr<uint16_t>(), M, hc, D, mean_factor(D), inv_sqrt_d, eps,
                                               stream()));
}

void CudaBackend::mul_scalar_bf16(const Tensor& x, float factor) {
    // x BF16 (any shape) in place: x <- bf16(fp32(x) * factor) (docs/MODEL.md 4.6.2 step 3).
    check_dtype("mul_scalar_bf16", "x", x, DType::BF16);
    check_data("mul_scalar_bf16", "x", x);
    if (x.numel() == 0) return;
    DS4R_CUDA_CHECK(kern::launch_mul_scalar_bf16(x.ptr<uint16_t>(), x.numel(), factor, stream()));
}

}  // namespace ds4r
