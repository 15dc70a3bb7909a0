// The Backend ops' argument contracts, shared by backend/cpu and backend/cuda (op_checks.h).
#include "backend/op_checks.h"

#include <cstdint>
#include <limits>

#include "backend/cpu/cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r::opcheck {

// ---------------------------------------------------------------- shared helpers

void expect_dtype(const char* op, const char* name, const Tensor& t, DType want) {
    DS4R_CHECK(t.dtype == want, "%s: %s must be %s, got %s %s", op, name, dtype_name(want),
               dtype_name(t.dtype), shape_str(t.shape).c_str());
}

void expect_data(const char* op, const char* name, const Tensor& t) {
    for (int64_t d : t.shape)
        DS4R_CHECK(d >= 0, "%s: %s has a negative dim %s", op, name, shape_str(t.shape).c_str());
    DS4R_CHECK(t.numel() == 0 || t.data != nullptr, "%s: %s %s has no data", op, name,
               shape_str(t.shape).c_str());
}

void expect_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
    DS4R_CHECK(t.shape == want, "%s: %s must have shape %s, got %s", op, name, shape_str(want).c_str(),
               shape_str(t.shape).c_str());
    expect_data(op, name, t);
}

void expect_rank(const char* op, const char* name, const Tensor& t, int ndim, const char* layout) {
    DS4R_CHECK(t.ndim() == ndim, "%s: %s must be %s, got %s", op, name, layout, shape_str(t.shape).c_str());
    expect_data(op, name, t);
}

void expect_numel(const char* op, const char* name, const Tensor& t, int64_t want) {
    expect_data(op, name, t);
    DS4R_CHECK(t.numel() == want, "%s: %s %s must have %lld elements", op, name, shape_str(t.shape).c_str(),
               (long long)want);
}

int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t row_len) {
    expect_data(op, name, t);
    DS4R_CHECK(t.ndim() >= 1 && t.dim(-1) == row_len, "%s: %s %s must have last dim %lld", op, name,
               shape_str(t.shape).c_str(), (long long)row_len);
    return row_len == 0 ? 0 : t.numel() / row_len;
}

namespace {
bool overlap(const Tensor& a, const Tensor& b) {
    const auto* pa = static_cast<const uint8_t*>(a.data);
    const auto* pb = static_cast<const uint8_t*>(b.data);
    return !(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa);
}
}  // namespace

void expect_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                     const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0) return;
    DS4R_CHECK(!overlap(a, b), "%s: %s must not overlap %s", op, a_name, b_name);
}

void expect_same_or_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                             const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0 || a.data == b.data) return;
    DS4R_CHECK(!overlap(a, b), "%s: %s and %s partially overlap (allowed: identical or disjoint)", op, a_name,
               b_name);
}

bool given(const Tensor& t) {
    return t.data != nullptr && t.numel() > 0;
}

void fp8_weight(const char* op, const char* name, const Fp8Linear& w) {
    DS4R_CHECK(w.w.dtype == DType::F8_E4M3 && w.s.dtype == DType::F8_E8M0,
               "%s: %s must be F8_E4M3 + F8_E8M0 scales, got %s + %s", op, name, dtype_name(w.w.dtype),
               dtype_name(w.s.dtype));
    DS4R_CHECK(w.w.ndim() == 2, "%s: %s must be 2-d, got %s", op, name, shape_str(w.w.shape).c_str());
    const int64_t N = w.w.dim(0), K = w.w.dim(1);
    DS4R_CHECK(w.s.shape == Shape({(N + 31) / 32, (K + 31) / 32}),
               "%s: %s scale must be [%lld, %lld], got %s", op, name, (long long)((N + 31) / 32),
               (long long)((K + 31) / 32), shape_str(w.s.shape).c_str());
    expect_data(op, name, w.w);
    expect_data(op, name, w.s);
}

int64_t fp4_weight(const char* op, const char* name, const Fp4Linear& w) {
    DS4R_CHECK((w.w.dtype == DType::I8 || w.w.dtype == DType::U8) && w.s.dtype == DType::F8_E8M0,
               "%s: %s must be I8 (packed e2m1) + F8_E8M0 scales, got %s + %s", op, name,
               dtype_name(w.w.dtype), dtype_name(w.s.dtype));
    DS4R_CHECK(w.w.ndim() == 2, "%s: %s must be 2-d, got %s", op, name, shape_str(w.w.shape).c_str());
    const int64_t N = w.w.dim(0), K = 2 * w.w.dim(1);
    DS4R_CHECK(K % 32 == 0, "%s: %s has K = %lld, not a multiple of 32", op, name, (long long)K);
    DS4R_CHECK(w.s.shape == Shape({N, K / 32}), "%s: %s scale must be [%lld, %lld], got %s", op, name,
               (long long)N, (long long)(K / 32), shape_str(w.s.shape).c_str());
    expect_data(op, name, w.w);
    expect_data(op, name, w.s);
    return K;
}

// ---------------------------------------------------------------- quantization

namespace {
// x BF16 [M, K] with K a multiple of block.
QuantDims quant_rows(const char* op, const Tensor& x, int64_t block) {
    expect_dtype(op, "x", x, DType::BF16);
    DS4R_CHECK(x.ndim() >= 1, "%s: x must have a last dim", op);
    const int64_t K = x.dim(-1);
    DS4R_CHECK(K % block == 0, "%s: K = %lld is not a multiple of the block %lld", op, (long long)K,
               (long long)block);
    return {rows_of(op, "x", x, K), K, block};
}
}  // namespace

QuantDims act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s) {
    const char* op = "act_quant_fp8";
    expect_dtype(op, "q", q, DType::F8_E4M3);
    expect_dtype(op, "s", s, DType::F8_E8M0);
    const QuantDims d = quant_rows(op, x, 32);
    expect_numel(op, "q", q, d.M * d.K);
    expect_numel(op, "s", s, d.M * (d.K / 32));
    return d;
}

QuantDims act_quant_fp8_inplace(const Tensor& x) {
    return quant_rows("act_quant_fp8_inplace", x, 32);
}

QuantDims fp4_quant_inplace(const Tensor& x, Fp4Scale kind) {
    return quant_rows("fp4_quant_inplace", x, cpuref::fp4_block_size(kind));
}

// ---------------------------------------------------------------- linears

namespace {
// x [M, K], y [M, N] (dtypes checked by the caller); returns M.
int64_t linear_rows(const char* op, const Tensor& x, int64_t K, int64_t N, const Tensor& y) {
    const int64_t M = rows_of(op, "x", x, K);
    expect_numel(op, "y", y, M * N);
    return M;
}
// Dense weight w [N, K] (dtype checked by the caller).
LinearDims dense_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& y) {
    DS4R_CHECK(w.ndim() == 2, "%s: w must be 2-d, got %s", op, shape_str(w.shape).c_str());
    expect_data(op, "w", w);
    const int64_t N = w.dim(0), K = w.dim(1);
    return {linear_rows(op, x, K, N, y), N, K};
}
}  // namespace

LinearDims linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) {
    const char* op = "linear_fp8";
    fp8_weight(op, "w", w);
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    const int64_t N = w.w.dim(0), K = w.w.dim(1);
    DS4R_CHECK(K % 32 == 0, "%s: K = %lld is not a multiple of 32", op, (long long)K);
    return {linear_rows(op, x, K, N, y), N, K};
}

LinearDims linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y) {
    const char* op = "linear_fp4";
    const int64_t K = fp4_weight(op, "w", w);
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    const int64_t N = w.w.dim(0);
    return {linear_rows(op, x, K, N, y), N, K};
}

LinearDims linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) {
    const char* op = "linear_bf16";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "w", w, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    return dense_linear(op, x, w, y);
}

LinearDims linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) {
    const char* op = "linear_f32";
    DS4R_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "%s: x must be BF16 or F32, got %s", op,
               dtype_name(x.dtype));
    DS4R_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F32, "%s: w must be BF16 or F32, got %s", op,
               dtype_name(w.dtype));
    expect_dtype(op, "y", y, DType::F32);
    return dense_linear(op, x, w, y);
}

WoaDims linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) {
    const char* op = "linear_wo_a";
    fp8_weight(op, "w", w);
    expect_dtype(op, "o", o, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    DS4R_CHECK(groups > 0 && w.w.dim(0) % groups == 0, "%s: %lld groups do not divide the %lld weight rows",
               op, (long long)groups, (long long)w.w.dim(0));
    const int64_t G = groups, R = w.w.dim(0) / groups, Kg = w.w.dim(1);
    const int64_t M = rows_of(op, "o", o, G * Kg);
    expect_numel(op, "y", y, M * G * R);
    return {M, G, R, Kg};
}

// ---------------------------------------------------------------- norms, RoPE

RowDims rms_norm(const Tensor& x, const Tensor& w, const Tensor& y) {
    const char* op = "rms_norm";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "w", w, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    expect_rank(op, "w", w, 1, "1-d");
    const int64_t N = w.dim(0);
    const int64_t M = rows_of(op, "x", x, N);
    expect_numel(op, "y", y, M * N);
    return {M, N};
}

namespace {
void rope_table_shape(const char* op, const Tensor& table, int64_t rd) {
    DS4R_CHECK(table.ndim() == 3 && table.dim(1) == rd / 2 && table.dim(2) == 2,
               "%s: table must be [n_pos, %lld, 2], got %s", op, (long long)(rd / 2),
               shape_str(table.shape).c_str());
    expect_data(op, "table", table);
}
}  // namespace

void rope_table(double base, double factor, int64_t rd, const Tensor& table) {
    const char* op = "rope_table";
    expect_dtype(op, "table", table, DType::F32);
    DS4R_CHECK(rd > 0 && rd % 2 == 0, "%s: rd = %lld must be positive and even", op, (long long)rd);
    rope_table_shape(op, table, rd);
    DS4R_CHECK(base > 1.0 && factor > 0.0, "%s: base %g / factor %g out of range", op, base, factor);
}

int64_t rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                     const Tensor& table) {
    const char* op = "rope_inplace";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "pos", pos, DType::I32);
    expect_dtype(op, "table", table, DType::F32);
    DS4R_CHECK(heads > 0 && width > 0 && rd > 0 && rd % 2 == 0 && rd <= width,
               "%s: heads %lld, width %lld, rd %lld are inconsistent", op, (long long)heads, (long long)width,
               (long long)rd);
    rope_table_shape(op, table, rd);
    const int64_t M = rows_of(op, "x", x, heads * width);
    expect_numel(op, "pos", pos, M);
    return M;
}

// ---------------------------------------------------------------- mHC, Engram

namespace {
// X BF16 [M, hc, D] (the residual stream's hc copies).
HcDims hc_stream(const char* op, const char* name, const Tensor& X) {
    expect_dtype(op, name, X, DType::BF16);
    expect_rank(op, name, X, 3, "[M, hc, D]");
    return {X.dim(0), X.dim(1), X.dim(2)};
}
}  // namespace

HcDims hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base, int iters,
                const Tensor& pre, const Tensor& post, const Tensor& comb) {
    const char* op = "hc_mixes";
    expect_dtype(op, "fn", fn, DType::F32);
    expect_dtype(op, "scale", scale, DType::F32);
    expect_dtype(op, "base", base, DType::F32);
    expect_dtype(op, "pre", pre, DType::F32);
    expect_dtype(op, "post", post, DType::F32);
    expect_dtype(op, "comb", comb, DType::F32);
    const HcDims d = hc_stream(op, "X", X);
    DS4R_CHECK(iters >= 1, "%s: iters = %d must be >= 1", op, iters);
    const int64_t mix = (2 + d.hc) * d.hc;  // pre (hc) + post (hc) + comb (hc * hc), docs/MODEL.md 4.5
    expect_shape(op, "fn", fn, {mix, d.hc * d.D});
    expect_numel(op, "scale", scale, 3);
    expect_numel(op, "base", base, mix);
    expect_shape(op, "pre", pre, {d.M, d.hc});
    expect_shape(op, "post", post, {d.M, d.hc});
    expect_shape(op, "comb", comb, {d.M, d.hc, d.hc});
    return d;
}

HcDims hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) {
    const char* op = "hc_pre";
    expect_dtype(op, "mix", mix, DType::F32);
    expect_dtype(op, "y", y, DType::BF16);
    const HcDims d = hc_stream(op, "X", X);
    expect_shape(op, "mix", mix, {d.M, d.hc});
    expect_numel(op, "y", y, d.M * d.D);
    return d;
}

HcDims hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb, const Tensor& out) {
    const char* op = "hc_post";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "post", post, DType::F32);
    expect_dtype(op, "comb", comb, DType::F32);
    expect_dtype(op, "out", out, DType::BF16);
    const HcDims d = hc_stream(op, "R", R);
    expect_numel(op, "x", x, d.M * d.D);
    expect_shape(op, "post", post, {d.M, d.hc});
    expect_shape(op, "comb", comb, {d.M, d.hc, d.hc});
    expect_numel(op, "out", out, d.M * d.hc * d.D);
    return d;
}

HcDims engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw) {
    const char* op = "engram_update";
    expect_dtype(op, "kv", kv, DType::BF16);
    expect_dtype(op, "qw", qw, DType::BF16);
    expect_dtype(op, "kw", kw, DType::BF16);
    const HcDims d = hc_stream(op, "X", X);
    expect_shape(op, "qw", qw, {d.hc, d.D});
    expect_shape(op, "kw", kw, {d.hc, d.D});
    expect_numel(op, "kv", kv, d.M * (d.hc + 1) * d.D);
    return d;
}

// ---------------------------------------------------------------- compressor

PoolDims compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) {
    const char* op = "compress_pool2";
    expect_dtype(op, "kv", kv, DType::F32);
    expect_dtype(op, "sc", sc, DType::F32);
    expect_dtype(op, "out", out, DType::BF16);
    DS4R_CHECK(kv.ndim() == 2 && sc.shape == kv.shape, "%s: kv %s and sc %s must be equal [rows, hd]", op,
               shape_str(kv.shape).c_str(), shape_str(sc.shape).c_str());
    expect_data(op, "kv", kv);
    expect_data(op, "sc", sc);
    const int64_t rows = kv.dim(0), hd = kv.dim(1);
    const int64_t n = rows_of(op, "out", out, hd);
    DS4R_CHECK(2 * n <= rows, "%s: %lld groups need %lld rows, kv has %lld", op, (long long)n,
               (long long)(2 * n), (long long)rows);
    return {rows, n, hd};
}

// ---------------------------------------------------------------- indexer

namespace {
// qpos I32 [m] (device data: its values are the backend's to check).
void qpos_rows(const char* op, const Tensor& qpos, int64_t m) {
    expect_dtype(op, "qpos", qpos, DType::I32);
    expect_numel(op, "qpos", qpos, m);
}
// score BF16 [m, T].
void score_rows(const char* op, const Tensor& score) {
    expect_dtype(op, "score", score, DType::BF16);
    expect_rank(op, "score", score, 2, "[m, T]");
}
// The candidate mask: 32-bit words stored as I32 (the dtype set has no U32), [m, >= ceil(nb / 32)].
BlockMaskDims block_mask(const char* op, const Tensor& score, int64_t block, const Tensor& mask) {
    const int64_t m = score.dim(0), T = score.dim(1), nb = (T + block - 1) / block;
    expect_dtype(op, "mask", mask, DType::I32);
    DS4R_CHECK(mask.ndim() == 2 && mask.dim(0) == m && mask.dim(1) >= (nb + 31) / 32,
               "%s: mask must be I32 [%lld, >= %lld] (32-bit words), got %s", op, (long long)m,
               (long long)((nb + 31) / 32), shape_str(mask.shape).c_str());
    expect_data(op, "mask", mask);
    return {m, T, nb, mask.dim(1)};
}
}  // namespace

IndexScoreDims index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos, int ratio,
                            const Tensor& score) {
    const char* op = "index_scores";
    expect_dtype(op, "q", q, DType::BF16);
    expect_dtype(op, "k", k, DType::BF16);
    expect_dtype(op, "w", w, DType::BF16);
    expect_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(ratio >= 1, "%s: ratio = %d must be >= 1", op, ratio);
    expect_rank(op, "q", q, 3, "[m, nh, ihd]");
    const int64_t m = q.dim(0), nh = q.dim(1), ihd = q.dim(2);
    const int64_t T = k.numel() == 0 ? 0 : rows_of(op, "k", k, ihd);
    expect_shape(op, "w", w, {m, nh});
    qpos_rows(op, qpos, m);
    expect_numel(op, "score", score, m * T);
    return {m, nh, ihd, T};
}

BlockMaskDims candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                               int64_t topk_blocks, const Tensor& mask) {
    const char* op = "candidate_blocks";
    DS4R_CHECK(ratio >= 1 && block >= 1 && topk_blocks >= 0,
               "%s: ratio %d, block %lld, topk_blocks %lld out of range", op, ratio, (long long)block,
               (long long)topk_blocks);
    score_rows(op, score);
    qpos_rows(op, qpos, score.dim(0));
    return block_mask(op, score, block, mask);
}

BlockMaskDims apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) {
    const char* op = "apply_candidate_mask";
    DS4R_CHECK(block >= 1, "%s: block = %lld must be >= 1", op, (long long)block);
    score_rows(op, score);
    return block_mask(op, score, block, mask);
}

TopkDims index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset, const Tensor& idx) {
    const char* op = "index_topk";
    expect_dtype(op, "score", score, DType::BF16);
    expect_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(ratio >= 1, "%s: ratio = %d must be >= 1", op, ratio);
    DS4R_CHECK(score.ndim() == 2 && idx.ndim() == 2 && idx.dim(0) == score.dim(0),
               "%s: score [m, T] %s and idx [m, K] %s do not match", op, shape_str(score.shape).c_str(),
               shape_str(idx.shape).c_str());
    expect_data(op, "score", score);
    expect_data(op, "idx", idx);
    const int64_t m = score.dim(0), T = score.dim(1), K = idx.dim(1);
    DS4R_CHECK(K <= T, "%s: K = %lld exceeds the %lld scores", op, (long long)K, (long long)T);
    DS4R_CHECK(offset >= 0 && offset + T <= std::numeric_limits<int32_t>::max(),
               "%s: offset %lld out of range", op, (long long)offset);
    qpos_rows(op, qpos, m);
    return {m, T, K};
}

// ---------------------------------------------------------------- attention

namespace {
// qpos I32 [m]; idx I32 [m, n] (shape named `idx_shape` in messages); window > 0. Returns {m, n}.
WindowDims index_rows(const char* op, const Tensor& qpos, int64_t window, const Tensor& idx,
                      const char* idx_shape) {
    expect_dtype(op, "qpos", qpos, DType::I32);
    expect_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(window > 0, "%s: window = %lld must be positive", op, (long long)window);
    expect_rank(op, "idx", idx, 2, idx_shape);
    const int64_t m = idx.dim(0), n = idx.dim(1);
    expect_numel(op, "qpos", qpos, m);
    return {m, n};
}
}  // namespace

WindowDims window_indices(const Tensor& qpos, int64_t window, const Tensor& idx) {
    return index_rows("window_indices", qpos, window, idx, "[m, W]");
}

AttnIndexDims attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) {
    const char* op = "attn_indices";
    const auto [m, n] = index_rows(op, qpos, window, idx, "[m, W + Kc]");
    const int64_t kc = topk.empty() ? 0 : topk.dim(1);
    if (kc > 0) {
        expect_dtype(op, "topk", topk, DType::I32);
        expect_shape(op, "topk", topk, {m, kc});
    }
    DS4R_CHECK(kc <= n, "%s: topk has %lld columns, idx only %lld", op, (long long)kc, (long long)n);
    expect_disjoint(op, "idx", idx, "topk", topk);
    return {m, n - kc, kc};
}

AttnDims sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                     const Tensor& idx, const Tensor& o) {
    const char* op = "sparse_attn";
    expect_dtype(op, "q", q, DType::BF16);
    expect_dtype(op, "win_kv", win_kv, DType::BF16);
    expect_dtype(op, "cmp_kv", cmp_kv, DType::BF16);
    expect_dtype(op, "sink", sink, DType::F32);
    expect_dtype(op, "idx", idx, DType::I32);
    expect_dtype(op, "o", o, DType::BF16);
    expect_rank(op, "q", q, 3, "[m, H, hd]");
    const int64_t m = q.dim(0), H = q.dim(1), hd = q.dim(2);
    const int64_t s = rows_of(op, "win_kv", win_kv, hd);
    const int64_t T = cmp_kv.numel() == 0 ? 0 : rows_of(op, "cmp_kv", cmp_kv, hd);
    expect_numel(op, "sink", sink, H);
    DS4R_CHECK(idx.ndim() == 2 && idx.dim(0) == m, "%s: idx must be [%lld, n_idx], got %s", op, (long long)m,
               shape_str(idx.shape).c_str());
    expect_data(op, "idx", idx);
    expect_numel(op, "o", o, m * H * hd);
    return {m, H, hd, s, T, idx.dim(1)};
}

// ---------------------------------------------------------------- MoE

MoeDims moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
            const Tensor& route_idx, const Tensor& route_w) {
    const char* op = "moe";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "y", y, DType::BF16);
    expect_dtype(op, "gate_w", w.gate_w, DType::BF16);
    expect_dtype(op, "gate_bias", w.gate_bias, DType::F32);
    expect_rank(op, "gate_w", w.gate_w, 2, "[E, D]");
    const int64_t E = w.gate_w.dim(0), D = w.gate_w.dim(1);
    const int k = p.topk;
    expect_numel(op, "gate_bias", w.gate_bias, E);
    DS4R_CHECK(static_cast<int64_t>(w.experts.size()) == E, "%s: %zu expert weight sets for %lld experts", op,
               w.experts.size(), (long long)E);
    DS4R_CHECK(k >= 1 && k <= E, "%s: topk = %d outside [1, %lld]", op, k, (long long)E);
    DS4R_CHECK(p.gate_temp != 0.0f, "%s: gate_temp must be non-zero", op);
    const int64_t M = rows_of(op, "x", x, D);
    expect_numel(op, "y", y, M * D);
    if (given(route_idx)) {
        expect_dtype(op, "route_idx", route_idx, DType::I32);
        expect_shape(op, "route_idx", route_idx, {M, k});
    }
    if (given(route_w)) {
        expect_dtype(op, "route_w", route_w, DType::F32);
        expect_shape(op, "route_w", route_w, {M, k});
    }
    return {M, E, D};
}

// ---------------------------------------------------------------- head

HeadDims head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                    const HeadStatsOut& out) {
    const char* op = "head_stats";
    expect_dtype(op, "x", x, DType::BF16);
    expect_dtype(op, "head", head, DType::BF16);
    expect_dtype(op, "targets", targets, DType::I32);
    expect_rank(op, "head", head, 2, "[V, D]");
    const int64_t V = head.dim(0), D = head.dim(1);
    DS4R_CHECK(k >= 0 && k <= V, "%s: k = %d outside [0, %lld]", op, k, (long long)V);
    const int64_t M = rows_of(op, "x", x, D);
    expect_numel(op, "targets", targets, M);
    const struct {
        const char* name;
        const Tensor& t;
        DType dtype;
        int64_t numel;
    } outs[] = {
        {"out.lse", out.lse, DType::F64, M},
        {"out.entropy", out.entropy, DType::F64, M},
        {"out.target_logit", out.target_logit, DType::F32, M},
        {"out.rank", out.rank, DType::I32, M},
        {"out.topk_ids", out.topk_ids, DType::I32, M * k},
        {"out.topk_logit", out.topk_logit, DType::F32, M * k},
    };
    for (const auto& o : outs) expect_dtype(op, o.name, o.t, o.dtype);
    for (const auto& o : outs) expect_numel(op, o.name, o.t, o.numel);
    return {M, V, D};
}

void head_targets(const int32_t* targets, int64_t M, int64_t V) {
    for (int64_t r = 0; r < M; ++r)
        DS4R_CHECK(targets[r] < V, "head_stats: targets[%lld] = %d is outside the vocabulary of %lld",
                   (long long)r, targets[r], (long long)V);
}

}  // namespace ds4r::opcheck
