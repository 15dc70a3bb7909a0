// The V4.1 block as chunk sweeps over a pass (see include/ds4r/model.h). Formula references are to
// docs/MODEL.md; every op's numerics live in the backends.
#include <algorithm>
#include <cmath>

#include "ds4r/model.h"

namespace ds4r {

namespace {

int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// A view of `count` elements-shaped `shape` at element offset `off` of a flat arena.
Tensor flat_view(const Tensor& base, int64_t off, Shape shape) {
    Tensor t = base;
    t.shape = std::move(shape);
    DS4R_CHECK(off >= 0 && off + t.numel() <= base.numel(), "arena view [%lld, +%lld) outside %lld elements",
               (long long)off, (long long)t.numel(), (long long)base.numel());
    t.data = base.data ? static_cast<uint8_t*>(base.data) + static_cast<size_t>(off) * dtype_size(base.dtype)
                       : nullptr;
    return t;
}

Tensor empty_tensor(DType t, Shape s) {
    Tensor x;
    x.dtype = t;
    x.shape = std::move(s);
    return x;
}

const Tensor& rope_table_for(const PassContext& ctx, const LayerRole& role) {
    // Window-only layers use the plain table, every other layer and every indexer the YaRN one (4.0).
    return role.ratio == 0 ? ctx.rope_plain : ctx.rope_yarn;
}

// Copies rows [src_row, src_row + n) of src into rows [dst_row, ...) of dst (same row width).
void copy_rows(Backend& be, const Tensor& dst, int64_t dst_row, const Tensor& src, int64_t src_row,
               int64_t n) {
    if (n <= 0) return;
    const size_t row_bytes = static_cast<size_t>(src.row_numel()) * dtype_size(src.dtype);
    DS4R_CHECK(row_bytes == static_cast<size_t>(dst.row_numel()) * dtype_size(dst.dtype),
               "copy_rows: row width mismatch");
    be.copy(dst, static_cast<size_t>(dst_row) * row_bytes, src, static_cast<size_t>(src_row) * row_bytes,
            static_cast<size_t>(n) * row_bytes);
}

Tensor upload_i32(Backend& be, const std::vector<int32_t>& v) {
    Tensor t = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
    if (!v.empty()) be.upload(t, 0, v.data(), v.size() * sizeof(int32_t));
    return t;
}

}  // namespace

SeqArenaCaps seq_arena_caps(const ModelConfig& cfg, int64_t len) {
    // The smallest compression ratio of the layers (each KV source publishes len / its ratio rows).
    int min_ratio = 0;
    for (size_t L = 0; L < cfg.compress_ratios.size() && static_cast<int64_t>(L) < cfg.n_layers; ++L) {
        const int r = cfg.compress_ratios[L];
        if (r > 0 && (min_ratio == 0 || r < min_ratio)) min_ratio = r;
    }
    SeqArenaCaps c;
    if (min_ratio == 0) return c;  // window-only model: nothing compressed, no top-k, no mask
    c.cmp_rows = len / min_ratio;
    c.topk_width = std::min<int64_t>(cfg.index_topk, c.cmp_rows);
    if (cfg.candidate_source_layer >= 0 && cfg.candidate_block_size > 0 && c.cmp_rows > 0)
        c.cand_words = cdiv(cdiv(c.cmp_rows, cfg.candidate_block_size), 32);
    return c;
}

int64_t seq_arena_bytes(const ModelConfig& cfg, int64_t len) {
    const SeqArenaCaps c = seq_arena_caps(cfg, len);
    const int64_t bf16 = 2, i32 = 4;
    return len * ((2 * cfg.head_dim + cfg.index_head_dim) * bf16 + (c.topk_width + c.cand_words) * i32);
}

int64_t pass_rope_bytes(const ModelConfig& cfg, int64_t max_len) {
    return 2 * max_len * (cfg.rope_head_dim / 2) * 2 * 4;  // rope_plain + rope_yarn, F32 [max_len, rd/2, 2]
}

void PassContext::setup(const std::vector<int64_t>& lens) {
    // The previous pass's arenas go first (a rerun after running out of memory needs their room).
    win_kv = cmp_kv = index_k = topk = cand = rope_plain = rope_yarn = Tensor{};
    seqs.clear();
    total_rows = 0;
    max_len = 0;
    int64_t topk_total = 0, cand_total = 0;
    for (int64_t len : lens) {
        DS4R_CHECK(len > 0, "empty sequence in a pass");
        const SeqArenaCaps caps = seq_arena_caps(cfg, len);
        SeqInfo si;
        si.len = len;
        si.row0 = total_rows;
        si.topk_off = topk_total;
        si.cand_off = cand_total;
        si.topk_cap = caps.topk_width;
        si.cand_cap = caps.cand_words;
        seqs.push_back(si);
        total_rows += len;
        topk_total += len * caps.topk_width;
        cand_total += len * caps.cand_words;
        max_len = std::max(max_len, len);
    }
    const int64_t hd = cfg.head_dim, ihd = cfg.index_head_dim, rd = cfg.rope_head_dim;
    win_kv = be.alloc(DType::BF16, {total_rows, hd});
    cmp_kv = be.alloc(DType::BF16, {total_rows, hd});
    index_k = be.alloc(DType::BF16, {total_rows, ihd});
    topk = be.alloc(DType::I32, {std::max<int64_t>(topk_total, 1)});
    cand = be.alloc(DType::I32, {std::max<int64_t>(cand_total, 1)});
    rope_plain = be.alloc(DType::F32, {max_len, rd / 2, 2});
    rope_yarn = be.alloc(DType::F32, {max_len, rd / 2, 2});
    be.rope_table(cfg.rope_theta, 1.0, 0, cfg.beta_fast, cfg.beta_slow, rd, rope_plain);
    be.rope_table(cfg.compress_rope_theta, cfg.rope_factor, cfg.original_seq_len, cfg.beta_fast,
                  cfg.beta_slow, rd, rope_yarn);
}

Tensor PassContext::seq_topk(int i) const {
    const SeqInfo& s = seqs.at(static_cast<size_t>(i));
    if (s.topk_width == 0) return empty_tensor(DType::I32, {s.len, 0});
    DS4R_CHECK(s.topk_width <= s.topk_cap, "sequence %d: top-k width %lld beyond its arena's %lld", i,
               (long long)s.topk_width, (long long)s.topk_cap);
    return flat_view(topk, s.topk_off, {s.len, s.topk_width});
}

Tensor PassContext::seq_cand(int i) const {
    const SeqInfo& s = seqs.at(static_cast<size_t>(i));
    if (s.cand_words == 0) return empty_tensor(DType::I32, {s.len, 0});
    DS4R_CHECK(s.cand_words <= s.cand_cap, "sequence %d: %lld candidate mask words beyond its arena's %lld",
               i, (long long)s.cand_words, (long long)s.cand_cap);
    return flat_view(cand, s.cand_off, {s.len, s.cand_words});
}

void begin_layer(PassContext& ctx, const LayerRole& role) {
    if (role.ratio == 0) return;
    for (auto& s : ctx.seqs) {
        if (role.kv_source)
            s.cmp_rows = s.len / role.ratio;  // floor: an odd last token is not compressed (4.6.1)
        if (role.index_source)
            // K_c = min(index_topk, T); T = 0 publishes an empty top-k (4.6.2, 8.4).
            s.topk_width = s.cmp_rows > 0 ? std::min<int64_t>(ctx.cfg.index_topk, s.cmp_rows) : 0;
        if (role.candidate_source)
            s.cand_words = s.cmp_rows > 0 ? cdiv(cdiv(s.cmp_rows, ctx.cfg.candidate_block_size), 32) : 0;
    }
}

void engram_chunk(PassContext& ctx, const LayerWeights& w, const Tensor& X, const Tensor& e) {
    const ModelConfig& c = ctx.cfg;
    const int64_t M = X.dim(0);
    ProfilePhase ph(ctx.be);
    ph("engram");
    Tensor kv = ctx.be.alloc(DType::BF16, {M, (c.hc_mult + 1) * c.dim});
    ctx.be.linear_fp8(e, w.eng_wkv, kv);
    ctx.be.engram_update(X, kv, w.eng_q, w.eng_k, static_cast<float>(c.norm_eps));
}

Tensor attn_input(PassContext& ctx, const LayerWeights& w, const Tensor& X, const Tensor& P) {
    Backend& be = ctx.be;
    ProfileRange pr(be, "attn.input");
    Tensor x = be.alloc(DType::BF16, {X.dim(0), ctx.cfg.dim});
    be.hc_pre(X, P, x);
    be.rms_norm(x, w.attn_norm, static_cast<float>(ctx.cfg.norm_eps), x);
    return x;
}

void kv_chunk(PassContext& ctx, const LayerWeights& w, const ChunkRows& rows, const Tensor& x) {
    Backend& be = ctx.be;
    const ModelConfig& c = ctx.cfg;
    const LayerRole& role = w.role;
    const int64_t M = rows.rows, hd = c.head_dim, rd = c.rope_head_dim, ihd = c.index_head_dim;
    const float eps = static_cast<float>(c.norm_eps);
    const Tensor& table = rope_table_for(ctx, role);

    ProfilePhase ph(be);
    ph("kv.window");

    // (b) window KV: kv_norm(wkv(x)), RoPE on the last rd dims, fp8 round trip over all 512 dims.
    Tensor kv = be.alloc(DType::BF16, {M, hd});
    be.linear_fp8(x, w.wkv, kv);
    be.rms_norm(kv, w.kv_norm, eps, kv);
    be.rope_inplace(kv, 1, hd, rd, rows.pos, table, false);
    be.act_quant_fp8_inplace(kv);
    for (const Segment& sg : rows.segs) {
        const SeqInfo& si = ctx.seqs[static_cast<size_t>(sg.seq)];
        copy_rows(be, ctx.win_kv, si.row0 + sg.t0, kv, sg.row, sg.t1 - sg.t0);
    }
    if (!role.kv_source) return;

    // (c) compressor (4.6.1): latents of the groups whose tokens lie in this chunk.
    ph("kv.compressor");
    const int ratio = role.ratio;
    struct Piece {
        int seq;
        int64_t j0, n, lat_row;  // groups [j0, j0 + n) of `seq` at rows [lat_row, lat_row + n) of lat
        int64_t src_row;         // first chunk row of the group's tokens
    };
    std::vector<Piece> pieces;
    std::vector<int32_t> cpos;  // RoPE position of group j is j * ratio (its first token)
    Tensor lat;
    if (ratio == 2) {
        Tensor kvf = be.alloc(DType::F32, {M, hd});
        Tensor sc = be.alloc(DType::F32, {M, hd});
        be.linear_f32(x, w.cmp_wkv, kvf);  // fp32 weights at ratio 2 (3.6)
        be.linear_f32(x, w.cmp_wgate, sc);
        int64_t total = 0;
        for (const Segment& sg : rows.segs) {
            const int64_t s = ctx.seqs[static_cast<size_t>(sg.seq)].len;
            const int64_t tend = std::min(sg.t1, (s / 2) * 2);  // the odd last token is not compressed
            if (tend <= sg.t0) continue;
            DS4R_CHECK(sg.t0 % 2 == 0, "ratio-2 compressor: chunk segment starts at odd position %lld",
                       (long long)sg.t0);
            pieces.push_back({sg.seq, sg.t0 / 2, (tend - sg.t0) / 2, total, sg.row});
            total += (tend - sg.t0) / 2;
        }
        if (total == 0) return;
        lat = be.alloc(DType::BF16, {total, hd});
        for (const Piece& p : pieces) {
            be.compress_pool2(kvf.rows(p.src_row, p.src_row + 2 * p.n),
                              sc.rows(p.src_row, p.src_row + 2 * p.n), lat.rows(p.lat_row, p.lat_row + p.n));
            for (int64_t j = 0; j < p.n; ++j) cpos.push_back(static_cast<int32_t>((p.j0 + j) * 2));
        }
    } else {
        // Ratio 1: latent = wkv(x), a bf16 linear, one latent per token.
        lat = be.alloc(DType::BF16, {M, hd});
        be.linear_bf16(x, w.cmp_wkv, lat);
        for (const Segment& sg : rows.segs) pieces.push_back({sg.seq, sg.t0, sg.t1 - sg.t0, sg.row, sg.row});
        cpos = rows.host_pos;
    }
    const int64_t n_lat = lat.dim(0);
    be.rms_norm(lat, w.cmp_norm, eps, lat);  // cast to bf16 first, then the norm (4.6.1)
    Tensor cpos_t = upload_i32(be, cpos);

    // Index keys from the UN-roped, un-quantized latent (4.6.2 step 1).
    if (role.owns_index_keys) {
        Tensor k = be.alloc(DType::BF16, {n_lat, ihd});
        be.linear_bf16(lat, w.idx_wk, k);
        be.rms_norm(k, w.idx_k_norm, eps, k);
        be.rope_inplace(k, 1, ihd, rd, cpos_t, ctx.rope_yarn, false);
        be.fp4_quant_inplace(k, Fp4Scale::E8M0_32);
        for (const Piece& p : pieces)
            copy_rows(be, ctx.index_k, ctx.seqs[static_cast<size_t>(p.seq)].row0 + p.j0, k, p.lat_row, p.n);
    }
    // Then the latent itself: RoPE at j * ratio, fp4 round trip with e4m3 scales per 16 (4.6 c).
    be.rope_inplace(lat, 1, hd, rd, cpos_t, ctx.rope_yarn, false);
    be.fp4_quant_inplace(lat, Fp4Scale::E4M3_16);
    for (const Piece& p : pieces)
        copy_rows(be, ctx.cmp_kv, ctx.seqs[static_cast<size_t>(p.seq)].row0 + p.j0, lat, p.lat_row, p.n);
}

void main_chunk(PassContext& ctx, const LayerWeights& w, const ChunkRows& rows, const Tensor& X,
                const Tensor& P, const Tensor& x, const LayerTaps* taps) {
    Backend& be = ctx.be;
    const ModelConfig& c = ctx.cfg;
    const LayerRole& role = w.role;
    const int64_t M = rows.rows, D = c.dim, hd = c.head_dim, rd = c.rope_head_dim, H = c.n_heads;
    const int64_t nih = c.index_n_heads, ihd = c.index_head_dim, hc = c.hc_mult;
    const float eps = static_cast<float>(c.norm_eps);
    const Tensor& table = rope_table_for(ctx, role);

    ProfilePhase ph(be);
    ph("attn.q_proj");

    // (a) queries: qr = q_norm(wq_a(x)), q = wq_b(qr), RoPE on each head's last rd dims.
    Tensor qr = be.alloc(DType::BF16, {M, c.q_lora_rank});
    be.linear_fp8(x, w.wq_a, qr);
    be.rms_norm(qr, w.q_norm, eps, qr);
    Tensor q = be.alloc(DType::BF16, {M, H * hd});
    be.linear_fp8(qr, w.wq_b, q);
    be.rope_inplace(q, H, hd, rd, rows.pos, table, false);

    // Indexer (4.6.2): queries and head weights for all rows, scores / top-k per sequence.
    if (role.index_source) {
        ph("indexer.q");
        Tensor qi = be.alloc(DType::BF16, {M, nih * ihd});
        be.linear_fp8(qr, w.idx_wq_b, qi);
        be.rope_inplace(qi, nih, ihd, rd, rows.pos, ctx.rope_yarn, false);
        be.fp4_quant_inplace(qi, Fp4Scale::E8M0_32);
        Tensor hw = be.alloc(DType::BF16, {M, nih});
        be.linear_bf16(x, w.idx_weights_proj, hw);
        // softmax_scale * n_heads^-0.5 = 128^-0.5 * 32^-0.5 = 1/64 for V4.1 (2.4), evaluated like
        // the reference: in double, then used as an fp32 scalar.
        be.mul_scalar_bf16(hw, static_cast<float>(std::pow(static_cast<double>(ihd), -0.5) *
                                                  std::pow(static_cast<double>(nih), -0.5)));
        for (const Segment& sg : rows.segs) {
            const SeqInfo& si = ctx.seqs[static_cast<size_t>(sg.seq)];
            const int64_t T = si.cmp_rows, m = sg.t1 - sg.t0;
            if (T == 0 || si.topk_width == 0) continue;  // nothing compressed yet: empty top-k
            Tensor pos = rows.pos.rows(sg.row, sg.row + m);
            ph("indexer.scores");
            Tensor score = be.alloc(DType::BF16, {m, T});
            be.index_scores(qi.rows(sg.row, sg.row + m).reshape({m, nih, ihd}),
                            ctx.index_k.rows(si.row0, si.row0 + T), hw.rows(sg.row, sg.row + m), pos,
                            role.ratio, score);
            ph("indexer.topk");
            if (role.candidate_source)
                be.candidate_blocks(score, pos, role.ratio, c.candidate_block_size, c.candidate_topk_blocks,
                                    ctx.seq_cand(sg.seq).rows(sg.t0, sg.t1));
            // Indexers after the candidate source (model.py uses_candidates) score inside its pool
            // only; one before it (a key-less index source included) scores every reachable position.
            if (role.uses_candidates && si.cand_words > 0)
                be.apply_candidate_mask(score, ctx.seq_cand(sg.seq).rows(sg.t0, sg.t1),
                                        c.candidate_block_size);
            be.index_topk(score, pos, role.ratio, si.len, ctx.seq_topk(sg.seq).rows(sg.t0, sg.t1));
        }
    }

    // (c, d) sparse attention over [window KV ; compressed KV], per sequence.
    ph("attn.sparse");
    Tensor o = be.alloc(DType::BF16, {M, H * hd});
    const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));  // head_dim ** -0.5
    for (const Segment& sg : rows.segs) {
        const SeqInfo& si = ctx.seqs[static_cast<size_t>(sg.seq)];
        const int64_t m = sg.t1 - sg.t0, W = std::min(si.len, c.window_size);
        const bool compressed = role.ratio > 0 && si.topk_width > 0 && si.cmp_rows > 0;
        const int64_t kc = compressed ? si.topk_width : 0;
        Tensor pos = rows.pos.rows(sg.row, sg.row + m);
        Tensor idx = be.alloc(DType::I32, {m, W + kc});
        Tensor tk = compressed ? ctx.seq_topk(sg.seq).rows(sg.t0, sg.t1) : empty_tensor(DType::I32, {m, 0});
        be.attn_indices(pos, c.window_size, tk, idx);
        Tensor cmp =
            compressed ? ctx.cmp_kv.rows(si.row0, si.row0 + si.cmp_rows) : empty_tensor(DType::BF16, {0, hd});
        be.sparse_attn(q.rows(sg.row, sg.row + m).reshape({m, H, hd}),
                       ctx.win_kv.rows(si.row0, si.row0 + si.len), cmp, w.attn_sink, idx, scale,
                       o.rows(sg.row, sg.row + m).reshape({m, H, hd}));
    }
    // (e) de-rotate, (f) grouped wo_a then wo_b.
    ph("attn.out_proj");
    be.rope_inplace(o, H, hd, rd, rows.pos, table, true);
    Tensor o2 = be.alloc(DType::BF16, {M, c.o_groups * c.o_lora_rank});
    be.linear_wo_a(o, w.wo_a, c.o_groups, o2);
    Tensor y = be.alloc(DType::BF16, {M, D});
    be.linear_fp8(o2, w.wo_b, y);
    if (taps && !taps->attn_out.empty()) be.copy(taps->attn_out, 0, y, 0, y.nbytes());

    // mHC around attention (4.5 steps 2, 6), then around the FFN with the attention-side pre-mix (step 7).
    ph("mhc");
    const float hc_eps = static_cast<float>(c.hc_eps);
    const int iters = static_cast<int>(c.hc_sinkhorn_iters);
    Tensor a_pre = be.alloc(DType::F32, {M, hc}), a_post = be.alloc(DType::F32, {M, hc});
    Tensor a_comb = be.alloc(DType::F32, {M, hc, hc});
    be.hc_mixes(X, w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base, eps, hc_eps, iters, a_pre, a_post, a_comb);
    be.hc_post(y, X, a_post, a_comb, X);
    Tensor f_pre = be.alloc(DType::F32, {M, hc}), f_post = be.alloc(DType::F32, {M, hc});
    Tensor f_comb = be.alloc(DType::F32, {M, hc, hc});
    be.hc_mixes(X, w.hc_ffn_fn, w.hc_ffn_scale, w.hc_ffn_base, eps, hc_eps, iters, f_pre, f_post, f_comb);
    Tensor x2 = be.alloc(DType::BF16, {M, D});
    be.hc_pre(X, a_pre, x2);  // the attention-side pre-mix feeds the FFN (single-pass mHC)
    be.rms_norm(x2, w.ffn_norm, eps, x2);
    ph("moe");
    Tensor y2 = be.alloc(DType::BF16, {M, D});
    MoeParams mp;
    mp.topk = static_cast<int>(c.n_activated_experts);
    mp.route_scale = static_cast<float>(c.route_scale);
    mp.swiglu_limit = static_cast<float>(c.swiglu_limit);
    mp.gate_temp = static_cast<float>(c.gate_temp);
    Tensor no_idx = empty_tensor(DType::I32, {M, 0}), no_w = empty_tensor(DType::F32, {M, 0});
    be.moe(x2, w.moe, mp, y2, taps ? taps->route_idx : no_idx, taps ? taps->route_w : no_w);
    if (taps && !taps->moe_out.empty()) be.copy(taps->moe_out, 0, y2, 0, y2.nbytes());
    ph("mhc");
    be.hc_post(y2, X, f_post, f_comb, X);
    be.copy(P, 0, f_pre, 0, f_pre.nbytes());  // f_pre is the next block's attention pre-mix
}

void head_chunk(PassContext& ctx, const GlobalWeights& g, const Tensor& X, const Tensor& P,
                const Tensor& targets, int k, const Tensor& collapsed, const HeadStatsOut& out) {
    Backend& be = ctx.be;
    const int64_t M = X.dim(0);
    ProfilePhase ph(be);
    ph("head");
    // Final collapse with the pre-mix the last block returned (4.9), then the final norm and the head.
    be.hc_pre(X, P, collapsed);
    Tensor xn = be.alloc(DType::BF16, {M, ctx.cfg.dim});
    be.rms_norm(collapsed, g.norm, static_cast<float>(ctx.cfg.norm_eps), xn);
    be.head_stats(xn, g.head, targets, k, out);
}

}  // namespace ds4r
