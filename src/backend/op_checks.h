// The argument contracts of the Backend ops (include/ds4r/backend.h), checked once for both backends:
// dtypes, shapes, element counts and scalar parameter ranges that every implementation requires.
// Each per-op function throws RuntimeError naming the op, the argument and what was expected, and
// returns the dims it derived. A backend adds only its own extra limits after the call (CUDA: kernel
// support, alignment, grid size, aliasing; CPU: checks that read host index data).
#pragma once

#include <cstdint>

#include "ds4r/backend.h"

namespace ds4r::opcheck {

// ---------------------------------------------------------------- shared helpers
// t.dtype == want.
void expect_dtype(const char* op, const char* name, const Tensor& t, DType want);
// No negative dim, and data present unless t is empty.
void expect_data(const char* op, const char* name, const Tensor& t);
// t.shape == want, then expect_data.
void expect_shape(const char* op, const char* name, const Tensor& t, const Shape& want);
// t.ndim() == ndim (layout spells the expected dims in the message, e.g. "[M, hc, D]"), then expect_data.
void expect_rank(const char* op, const char* name, const Tensor& t, int ndim, const char* layout);
// expect_data, then t.numel() == want.
void expect_numel(const char* op, const char* name, const Tensor& t, int64_t want);
// t viewed as [rows, row_len] (its last dim must be row_len); returns rows.
int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t row_len);
// a and b share no byte (either empty: nothing to check).
void expect_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                     const Tensor& b);
// In-place contracts: a and b are the same memory (same start) or disjoint, never a partial overlap.
void expect_same_or_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                             const Tensor& b);
// An optional output is given when it has data and elements (HeadStatsOut / moe route outputs).
bool given(const Tensor& t);

// fp8 weight: w F8_E4M3 [N, K] with s F8_E8M0 [ceil(N / 32), ceil(K / 32)] (docs/MODEL.md 3.6).
void fp8_weight(const char* op, const char* name, const Fp8Linear& w);
// fp4 weight: w I8 (or U8) [N, K / 2] (two e2m1 codes per byte) with s F8_E8M0 [N, K / 32],
// K a multiple of 32; returns K.
int64_t fp4_weight(const char* op, const char* name, const Fp4Linear& w);

// ---------------------------------------------------------------- quantization (docs/MODEL.md 5.1, 5.2)
struct QuantDims {
    int64_t M, K, block;  // rows, row length, quantization block along K
};
// x BF16 [M, K] -> q F8_E4M3 [M, K], s F8_E8M0 [M, K/32]; K % 32 == 0.
QuantDims act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s);
// x BF16 [M, K], K % 32 == 0.
QuantDims act_quant_fp8_inplace(const Tensor& x);
// x BF16 [M, K], K a multiple of the kind's block (32 for E8M0_32, 16 for E4M3_16).
QuantDims fp4_quant_inplace(const Tensor& x, Fp4Scale kind);

// ---------------------------------------------------------------- linears (docs/MODEL.md 4.0, 5.3, 4.6 f)
struct LinearDims {
    int64_t M, N, K;  // y [M, N] = x [M, K] . W [N, K]^T
};
// x BF16 [M, K]; w fp8 [N, K], K % 32 == 0; y BF16 [M, N].
LinearDims linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y);
// x BF16 [M, K]; w packed fp4 [N, K/2]; y BF16 [M, N].
LinearDims linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y);
// x BF16 [M, K]; w BF16 [N, K]; y BF16 [M, N].
LinearDims linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y);
// x BF16 or F32 [M, K]; w BF16 or F32 [N, K]; y F32 [M, N].
LinearDims linear_f32(const Tensor& x, const Tensor& w, const Tensor& y);
struct WoaDims {
    int64_t M, G, R, Kg;  // rows, groups, output columns per group, input columns per group
};
// o BF16 [M, G * Kg]; w fp8 [G * R, Kg]; y BF16 [M, G * R].
WoaDims linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y);

// ---------------------------------------------------------------- norms, RoPE (docs/MODEL.md 4.0)
struct RowDims {
    int64_t M, N;  // rows, row length
};
// x, y BF16 [M, N]; w BF16 [N].
RowDims rms_norm(const Tensor& x, const Tensor& w, const Tensor& y);
// table F32 [n_pos, rd/2, 2]; rd positive and even; base > 1, factor > 0.
void rope_table(double base, double factor, int64_t rd, const Tensor& table);
// x BF16 [M, heads * width]; pos I32 [M]; table F32 [n_pos, rd/2, 2]; 0 < rd <= width, rd even. Returns M.
int64_t rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                     const Tensor& table);

// ---------------------------------------------------------------- mHC (docs/MODEL.md 4.5, 5.5), Engram (4.8)
struct HcDims {
    int64_t M, hc, D;  // rows, hyper-connection copies, model dim
};
// X BF16 [M, hc, D]; fn F32 [(2 + hc) * hc, hc * D]; scale F32 [3]; base F32 [(2 + hc) * hc];
// pre, post F32 [M, hc]; comb F32 [M, hc, hc]; iters >= 1.
HcDims hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base, int iters,
                const Tensor& pre, const Tensor& post, const Tensor& comb);
// X BF16 [M, hc, D]; mix F32 [M, hc]; y BF16 [M, D].
HcDims hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y);
// x BF16 [M, D]; R BF16 [M, hc, D]; post F32 [M, hc]; comb F32 [M, hc, hc]; out BF16 [M, hc, D].
HcDims hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb, const Tensor& out);
// X BF16 [M, hc, D]; kv BF16 [M, (hc + 1) * D]; qw, kw BF16 [hc, D].
HcDims engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw);

// ---------------------------------------------------------------- compressor (docs/MODEL.md 4.6.1)
struct PoolDims {
    int64_t rows, n, hd;  // kv rows, output groups (2 * n <= rows), head dim
};
// kv, sc F32 [rows, hd] (equal shapes); out BF16 [n, hd] with 2n <= rows.
PoolDims compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out);

// ---------------------------------------------------------------- indexer (docs/MODEL.md 4.6.2)
struct IndexScoreDims {
    int64_t m, nh, ihd, T;  // query rows, index heads, index head dim, compressed keys
};
// q BF16 [m, nh, ihd]; k BF16 [T, ihd] (T may be 0); w BF16 [m, nh]; qpos I32 [m]; score BF16 [m, T];
// ratio >= 1. (qpos values are device data: checked by the backends that can read them.)
IndexScoreDims index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos, int ratio,
                            const Tensor& score);
struct BlockMaskDims {
    int64_t m, T, nb, words;  // rows, scores per row, blocks ceil(T / block), mask words per row
};
// score BF16 [m, T]; qpos I32 [m]; mask I32 [m, >= ceil(nb / 32)] (32-bit words); ratio, block >= 1,
// topk_blocks >= 0.
BlockMaskDims candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                               int64_t topk_blocks, const Tensor& mask);
// score BF16 [m, T]; mask I32 [m, >= ceil(nb / 32)]; block >= 1.
BlockMaskDims apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block);
struct TopkDims {
    int64_t m, T, K;  // rows, scores per row, picks per row
};
// score BF16 [m, T]; qpos I32 [m]; idx I32 [m, K], K <= T; ratio >= 1; 0 <= offset, offset + T in int32.
TopkDims index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset, const Tensor& idx);

// ---------------------------------------------------------------- attention (docs/MODEL.md 4.6, 5.4)
struct WindowDims {
    int64_t m, W;  // rows, window columns
};
// qpos I32 [m]; idx I32 [m, W]; window > 0.
WindowDims window_indices(const Tensor& qpos, int64_t window, const Tensor& idx);
struct AttnIndexDims {
    int64_t m, W, Kc;  // rows, window columns, top-k columns
};
// qpos I32 [m]; topk I32 [m, Kc] (may be empty: Kc = 0); idx I32 [m, W + Kc] disjoint from topk.
AttnIndexDims attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx);
struct AttnDims {
    int64_t m, H, hd, s, T, n_idx;  // rows, heads, head dim, window rows, compressed rows, index columns
};
// q BF16 [m, H, hd]; win_kv BF16 [s, hd]; cmp_kv BF16 [T, hd] (may be empty); sink F32 [H];
// idx I32 [m, n_idx]; o BF16 [m, H, hd].
AttnDims sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                     const Tensor& idx, const Tensor& o);

// ---------------------------------------------------------------- MoE (docs/MODEL.md 4.7)
struct MoeDims {
    int64_t M, E, D;  // rows, routed experts, model dim
};
// x, y BF16 [M, D]; gate_w BF16 [E, D]; gate_bias F32 [E]; E expert weight sets; 1 <= topk <= E;
// gate_temp != 0; route_idx I32 [M, topk] and route_w F32 [M, topk] where given. The expert and shared
// weights' shapes are checked by each backend (the CPU checks an expert when a token reaches it).
MoeDims moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
            const Tensor& route_idx, const Tensor& route_w);

// ---------------------------------------------------------------- head (docs/MODEL.md 4.9)
struct HeadDims {
    int64_t M, V, D;  // rows, vocabulary, model dim
};
// x BF16 [M, D]; head BF16 [V, D]; targets I32 [M]; 0 <= k <= V; out as HeadStatsOut.
HeadDims head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                    const HeadStatsOut& out);
// targets (host copy, M ints) below V (-1 = no target).
void head_targets(const int32_t* targets, int64_t M, int64_t V);

}  // namespace ds4r::opcheck
