// CudaBackend ops: RMSNorm, RoPE tables and application, mHC mixes / pre / post, the compressor's
// ratio-2 pooling, the Engram update and the bf16 scalar multiply (MODEL.md 4.0, 4.5, 4.6.1, 4.8,
// 5.5, 8). Shapes and dtypes are validated here; the kernels live in kernels/{norm_rope,hc,engram}.cu.
#include "backend/cuda/cuda_ops_misc.h"

#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_ref.h"
#include "backend/cuda/cuda_backend.h"
#include "engram.cuh"
#include "hc.cuh"
#include "norm_rope.cuh"

namespace ds4r {

namespace {

void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
    DS4R_CHECK(t.dtype == want, "cuda %s: %s must be %s, got %s %s", op, name, dtype_name(want),
               dtype_name(t.dtype), shape_str(t.shape).c_str());
}
void check_data(const char* op, const char* name, const Tensor& t) {
    for (int64_t d : t.shape)
        DS4R_CHECK(d >= 0, "cuda %s: %s has a negative dim %s", op, name, shape_str(t.shape).c_str());
    DS4R_CHECK(t.numel() == 0 || t.data != nullptr, "cuda %s: %s %s has no data", op, name,
               shape_str(t.shape).c_str());
}
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
    DS4R_CHECK(t.shape == want, "cuda %s: %s must have shape %s, got %s", op, name, shape_str(want).c_str(),
               shape_str(t.shape).c_str());
    check_data(op, name, t);
}
void check_numel(const char* op, const char* name, const Tensor& t, int64_t want) {
    check_data(op, name, t);
    DS4R_CHECK(t.numel() == want, "cuda %s: %s %s must have %lld elements", op, name,
               shape_str(t.shape).c_str(), (long long)want);
}
// Rows of a tensor whose last dim is row_len.
int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t row_len) {
    check_data(op, name, t);
    DS4R_CHECK(t.ndim() >= 1 && t.dim(-1) == row_len, "cuda %s: %s %s must have last dim %lld", op, name,
               shape_str(t.shape).c_str(), (long long)row_len);
    return row_len == 0 ? 0 : t.numel() / row_len;
}
// In-place contracts: two tensors are either the same memory or disjoint (a partial overlap would
// race in the kernels).
void check_same_or_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                            const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0 || a.data == b.data) return;
    const auto* pa = static_cast<const uint8_t*>(a.data);
    const auto* pb = static_cast<const uint8_t*>(b.data);
    DS4R_CHECK(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa,
               "cuda %s: %s and %s partially overlap (allowed: identical or disjoint)", op, a_name, b_name);
}
void check_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                    const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0) return;
    const auto* pa = static_cast<const uint8_t*>(a.data);
    const auto* pb = static_cast<const uint8_t*>(b.data);
    DS4R_CHECK(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa, "cuda %s: %s must not overlap %s", op, a_name,
               b_name);
}
void check_grid(const char* op, int64_t blocks) {
    DS4R_CHECK(blocks < (int64_t{1} << 31), "cuda %s: %lld thread blocks exceed the grid limit", op,
               (long long)blocks);
}
// torch.mean's factor on CUDA (cpuref::mean_from_sum): fp32(1) / fp32(n).
float mean_factor(int64_t n) {
    return 1.0f / static_cast<float>(n);
}

}  // namespace

// ---------------------------------------------------------------------------- norms, RoPE

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    // x, y BF16 [M, N] (may alias), w BF16 [N] (MODEL.md 4.0, 8.2).
    const char* op = "rms_norm";
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "w", w, DType::BF16);
    check_dtype(op, "y", y, DType::BF16);
    DS4R_CHECK(w.ndim() == 1, "cuda rms_norm: w must be 1-d, got %s", shape_str(w.shape).c_str());
    check_data(op, "w", w);
    const int64_t N = w.dim(0);
    const int64_t M = rows_of(op, "x", x, N);
    check_numel(op, "y", y, M * N);
    check_same_or_disjoint(op, "x", x, "y", y);
    check_grid(op, M);
    if (M == 0 || N == 0) return;
    kern::launch_rms_norm(x.ptr<uint16_t>(), w.ptr<uint16_t>(), y.ptr<uint16_t>(), M, N, mean_factor(N), eps,
                          stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

namespace {

// Validates a rope_table call and computes the inverse frequencies F32 [rd/2] on the GPU.
Tensor rope_inv_freqs(CudaBackend& be, double base, double factor, int64_t yarn_orig, double beta_fast,
                      double beta_slow, int64_t rd, const Tensor& table) {
    const char* op = "rope_table";
    check_dtype(op, "table", table, DType::F32);
    DS4R_CHECK(rd > 0 && rd % 2 == 0, "cuda rope_table: rd = %lld must be positive and even", (long long)rd);
    DS4R_CHECK(table.ndim() == 3 && table.dim(1) == rd / 2 && table.dim(2) == 2,
               "cuda rope_table: table must be [n_pos, %lld, 2], got %s", (long long)(rd / 2),
               shape_str(table.shape).c_str());
    check_data(op, "table", table);
    DS4R_CHECK(base > 1.0 && factor > 0.0, "cuda rope_table: base %g / factor %g out of range", base, factor);
    float low_f = 0.0f, span_f = 1.0f;
    const int yarn = yarn_orig > 0 ? 1 : 0;
    if (yarn) {
        // find_correction_range in Python doubles (math.floor / math.ceil), then
        // linear_ramp_factor(low, high): max += 0.001 when equal, divided by (max - min) as fp32.
        int64_t low = 0, high = 0;
        cpuref::yarn_band(base, yarn_orig, beta_fast, beta_slow, rd, &low, &high);
        const double span = low == high ? (static_cast<double>(high) + 0.001) - static_cast<double>(low)
                                        : static_cast<double>(high - low);
        low_f = static_cast<float>(low);
        span_f = static_cast<float>(span);
    }
    Tensor inv_freq = be.alloc(DType::F32, {rd / 2});
    kern::launch_rope_inv_freqs(static_cast<float>(base), static_cast<float>(factor), yarn, low_f, span_f, rd,
                                inv_freq.ptr<float>(), be.stream());
    DS4R_CUDA_LAUNCH_CHECK();
    return inv_freq;
}

}  // namespace

void CudaBackend::rope_table(double base, double factor, int64_t yarn_orig, double beta_fast,
                             double beta_slow, int64_t rd, const Tensor& table) {
    // table F32 [n_pos, rd/2, 2]. The golden tables are torch's CPU evaluation of
    // precompute_freqs_cis (true fp32 divisions, correctly rounded pow, glibc cosf / sinf of the fp32
    // angle), reproduced here on the GPU; kernels/libm_sincosf.cuh says why not CUDA's functions.
    const Tensor inv_freq = rope_inv_freqs(*this, base, factor, yarn_orig, beta_fast, beta_slow, rd, table);
    if (table.dim(0) == 0) return;
    kern::launch_rope_table(inv_freq.ptr<float>(), table.dim(0), rd / 2, table.ptr<float>(), stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void cuda_rope_table_libdevice(CudaBackend& be, double base, double factor, int64_t yarn_orig,
                               double beta_fast, double beta_slow, int64_t rd, const Tensor& table) {
    const Tensor inv_freq = rope_inv_freqs(be, base, factor, yarn_orig, beta_fast, beta_slow, rd, table);
    if (table.dim(0) == 0) return;
    kern::launch_rope_table_libdevice(inv_freq.ptr<float>(), table.dim(0), rd / 2, table.ptr<float>(),
                                      be.stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                               const Tensor& table, bool inverse) {
    // x BF16 [M, heads * width], the last rd dims of each head rotated at pos[r] (I32 [M], device
    // memory: a value outside the table turns that row's rotated dims into NaN); table F32
    // [n_pos, rd/2, 2] (MODEL.md 4.0, 8.3).
    const char* op = "rope_inplace";
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "pos", pos, DType::I32);
    check_dtype(op, "table", table, DType::F32);
    DS4R_CHECK(heads > 0 && width > 0 && rd > 0 && rd % 2 == 0 && rd <= width,
               "cuda rope_inplace: heads %lld, width %lld, rd %lld are inconsistent", (long long)heads,
               (long long)width, (long long)rd);
    DS4R_CHECK(table.ndim() == 3 && table.dim(1) == rd / 2 && table.dim(2) == 2,
               "cuda rope_inplace: table must be [n_pos, %lld, 2], got %s", (long long)(rd / 2),
               shape_str(table.shape).c_str());
    check_data(op, "table", table);
    const int64_t M = rows_of(op, "x", x, heads * width);
    check_numel(op, "pos", pos, M);
    if (M == 0) return;
    kern::launch_rope_inplace(x.ptr<uint16_t>(), M, heads, width, rd, pos.ptr<int32_t>(), table.ptr<float>(),
                              table.dim(0), inverse ? 1 : 0, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------- mHC

void CudaBackend::hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base,
                           float norm_eps, float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                           const Tensor& comb) {
    // X BF16 [M, hc, D]; fn F32 [mix, hc*D]; scale F32 [3]; base F32 [mix] -> pre, post F32 [M, hc],
    // comb F32 [M, hc, hc] (MODEL.md 4.5, 5.5). The kernel is built for hc = 4 (mix = 24).
    const char* op = "hc_mixes";
    check_dtype(op, "X", X, DType::BF16);
    check_dtype(op, "fn", fn, DType::F32);
    check_dtype(op, "scale", scale, DType::F32);
    check_dtype(op, "base", base, DType::F32);
    check_dtype(op, "pre", pre, DType::F32);
    check_dtype(op, "post", post, DType::F32);
    check_dtype(op, "comb", comb, DType::F32);
    DS4R_CHECK(X.ndim() == 3, "cuda hc_mixes: X must be [M, hc, D], got %s", shape_str(X.shape).c_str());
    check_data(op, "X", X);
    const int64_t M = X.dim(0), hc = X.dim(1), D = X.dim(2);
    DS4R_CHECK(hc == kern::kHcMult, "cuda hc_mixes: hc = %lld, the kernel supports hc = %d only",
               (long long)hc, kern::kHcMult);
    DS4R_CHECK(iters >= 1, "cuda hc_mixes: iters = %d must be >= 1", iters);
    const int64_t mix = kern::kHcMix;
    check_shape(op, "fn", fn, {mix, hc * D});
    check_numel(op, "scale", scale, 3);
    check_numel(op, "base", base, mix);
    check_shape(op, "pre", pre, {M, hc});
    check_shape(op, "post", post, {M, hc});
    check_shape(op, "comb", comb, {M, hc, hc});
    check_grid(op, (M + 3) / 4);
    if (M == 0) return;
    DS4R_CHECK(D > 0, "cuda hc_mixes: D must be positive, got X %s", shape_str(X.shape).c_str());
    kern::launch_hc_mixes(X.ptr<uint16_t>(), fn.ptr<float>(), scale.ptr<float>(), base.ptr<float>(), M, D,
                          mean_factor(hc * D), norm_eps, hc_eps, iters, pre.ptr<float>(), post.ptr<float>(),
                          comb.ptr<float>(), stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) {
    // y BF16 [M, D] = bf16(((m0*X0 + m1*X1) + m2*X2) + m3*X3) in fp32; X BF16 [M, hc, D]; mix F32 [M, hc].
    const char* op = "hc_pre";
    check_dtype(op, "X", X, DType::BF16);
    check_dtype(op, "mix", mix, DType::F32);
    check_dtype(op, "y", y, DType::BF16);
    DS4R_CHECK(X.ndim() == 3, "cuda hc_pre: X must be [M, hc, D], got %s", shape_str(X.shape).c_str());
    check_data(op, "X", X);
    const int64_t M = X.dim(0), hc = X.dim(1), D = X.dim(2);
    check_shape(op, "mix", mix, {M, hc});
    check_numel(op, "y", y, M * D);
    check_disjoint(op, "y", y, "X", X);
    if (M == 0 || D == 0) return;
    kern::launch_hc_pre(X.ptr<uint16_t>(), mix.ptr<float>(), y.ptr<uint16_t>(), M, hc, D, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                          const Tensor& out) {
    // out BF16 [M, hc, D]: out_k = bf16(post_k * x + S_k), S_k = ((c0k*R0 + c1k*R1) + c2k*R2) + c3k*R3;
    // x BF16 [M, D]; R BF16 [M, hc, D] (may alias out); post F32 [M, hc]; comb F32 [M, hc, hc].
    const char* op = "hc_post";
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "R", R, DType::BF16);
    check_dtype(op, "post", post, DType::F32);
    check_dtype(op, "comb", comb, DType::F32);
    check_dtype(op, "out", out, DType::BF16);
    DS4R_CHECK(R.ndim() == 3, "cuda hc_post: R must be [M, hc, D], got %s", shape_str(R.shape).c_str());
    check_data(op, "R", R);
    const int64_t M = R.dim(0), hc = R.dim(1), D = R.dim(2);
    DS4R_CHECK(hc >= 1 && hc <= 8, "cuda hc_post: hc = %lld outside [1, 8]", (long long)hc);
    check_numel(op, "x", x, M * D);
    check_shape(op, "post", post, {M, hc});
    check_shape(op, "comb", comb, {M, hc, hc});
    check_numel(op, "out", out, M * hc * D);
    check_same_or_disjoint(op, "out", out, "R", R);
    check_disjoint(op, "out", out, "x", x);
    if (M == 0 || D == 0) return;
    kern::launch_hc_post(x.ptr<uint16_t>(), R.ptr<uint16_t>(), post.ptr<float>(), comb.ptr<float>(),
                         out.ptr<uint16_t>(), M, hc, D, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------- compressor

void CudaBackend::compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) {
    // kv, sc F32 [2n (+1), hd] -> out BF16 [n, hd]; a trailing odd row is ignored (MODEL.md 4.6.1).
    const char* op = "compress_pool2";
    check_dtype(op, "kv", kv, DType::F32);
    check_dtype(op, "sc", sc, DType::F32);
    check_dtype(op, "out", out, DType::BF16);
    DS4R_CHECK(kv.ndim() == 2 && sc.shape == kv.shape,
               "cuda compress_pool2: kv %s and sc %s must be equal [rows, hd]", shape_str(kv.shape).c_str(),
               shape_str(sc.shape).c_str());
    check_data(op, "kv", kv);
    check_data(op, "sc", sc);
    const int64_t rows = kv.dim(0), hd = kv.dim(1);
    const int64_t n = rows_of(op, "out", out, hd);
    DS4R_CHECK(2 * n <= rows, "cuda compress_pool2: %lld groups need %lld rows, kv has %lld", (long long)n,
               (long long)(2 * n), (long long)rows);
    if (n == 0 || hd == 0) return;
    kern::launch_compress_pool2(kv.ptr<float>(), sc.ptr<float>(), out.ptr<uint16_t>(), n, hd, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------- Engram

void CudaBackend::engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                                float eps) {
    // X BF16 [M, hc, D] in place; kv BF16 [M, (hc + 1) * D] (keys of copy k at columns k*D.., the
    // shared value last); qw, kw BF16 [hc, D] (MODEL.md 4.8 steps 2-5).
    const char* op = "engram_update";
    check_dtype(op, "X", X, DType::BF16);
    check_dtype(op, "kv", kv, DType::BF16);
    check_dtype(op, "qw", qw, DType::BF16);
    check_dtype(op, "kw", kw, DType::BF16);
    DS4R_CHECK(X.ndim() == 3, "cuda engram_update: X must be [M, hc, D], got %s", shape_str(X.shape).c_str());
    check_data(op, "X", X);
    const int64_t M = X.dim(0), hc = X.dim(1), D = X.dim(2);
    check_shape(op, "qw", qw, {hc, D});
    check_shape(op, "kw", kw, {hc, D});
    check_numel(op, "kv", kv, M * (hc + 1) * D);
    check_disjoint(op, "X", X, "kv", kv);
    check_grid(op, M * hc);
    if (M == 0 || hc == 0 || D == 0) return;
    const float inv_sqrt_d = static_cast<float>(std::pow(static_cast<double>(D), -0.5));  // self.dim ** -0.5
    kern::launch_engram_update(X.ptr<uint16_t>(), kv.ptr<uint16_t>(), qw.ptr<uint16_t>(), kw.ptr<uint16_t>(),
                               M, hc, D, mean_factor(D), inv_sqrt_d, eps, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::mul_scalar_bf16(const Tensor& x, float factor) {
    // x BF16 (any shape) in place: x <- bf16(fp32(x) * factor) (MODEL.md 4.6.2 step 3).
    check_dtype("mul_scalar_bf16", "x", x, DType::BF16);
    check_data("mul_scalar_bf16", "x", x);
    if (x.numel() == 0) return;
    kern::launch_mul_scalar_bf16(x.ptr<uint16_t>(), x.numel(), factor, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

}  // namespace ds4r
