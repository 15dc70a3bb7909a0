#include "teacher_forced.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ds4r/numeric.h"
#include "golden_util.h"

namespace ds4r::test {

namespace {

template <class T>
const T* slab(const NpyArray& a, int64_t index) {
    const int64_t per = a.numel() / a.shape[0];
    return a.as<T>() + index * per;
}

// Uploads host rows into a backend arena at row `row` (row width from the arena).
void put_rows(Backend& be, const Tensor& arena, int64_t row, const void* src, int64_t rows) {
    const size_t rb = static_cast<size_t>(arena.row_numel()) * dtype_size(arena.dtype);
    be.upload(arena, static_cast<size_t>(row) * rb, src, static_cast<size_t>(rows) * rb);
}

std::vector<uint8_t> get_bytes(Backend& be, const Tensor& t) {
    std::vector<uint8_t> v(t.nbytes());
    if (!v.empty()) be.download(v.data(), t, 0, v.size());
    return v;
}

std::string seq_name(int i) {
    char b[16];
    std::snprintf(b, sizeof b, "seq%02d", i);
    return b;
}

}  // namespace

TeacherForcedReport run_teacher_forced(const std::string& backend) {
    TeacherForcedReport rep;
    GoldenModel& gm = golden_model(backend);
    const ModelConfig& cfg = gm.ckpt->config();
    const auto& roles = gm.ckpt->roles();
    const auto seqs = golden_sequences();
    const int64_t D = cfg.dim, hc = cfg.hc_mult, hd = cfg.head_dim, ihd = cfg.index_head_dim;
    const int64_t K = cfg.n_activated_experts;
    for (int si = 0; si < static_cast<int>(seqs.size()); ++si) {
        const std::string sn = seq_name(si);
        if (!dump_exists(sn + "_layers/block_in.npy")) continue;
        const int64_t s = static_cast<int64_t>(seqs[static_cast<size_t>(si)].tokens.size());
        NpyArray pre_engram = dump(sn + "_layers/pre_engram.npy"),
                 block_in = dump(sn + "_layers/block_in.npy");
        NpyArray premix = dump(sn + "_layers/premix.npy"), attn_out = dump(sn + "_layers/attn_out.npy");
        NpyArray moe_out = dump(sn + "_layers/moe_out.npy"), route_idx = dump(sn + "_layers/route_idx.npy");
        NpyArray route_w = dump(sn + "_layers/route_w.npy");
        ReplayOptions ro;
        ro.max_batch_tokens = 1 << 20;
        PassRunner runner(*gm.be, *gm.ckpt, *gm.weights, gm.engram.get(), ro);
        runner.begin({seqs[static_cast<size_t>(si)].tokens});
        PassContext& ctx = runner.context();
        Backend& be = *gm.be;
        for (int L = 0; L < cfg.n_layers; ++L) {
            const LayerRole& role = roles[static_cast<size_t>(L)];
            auto res = gm.weights->acquire(L);
            const LayerWeights w =
                bind_layer_weights(cfg, role, [&](const std::string& n) { return res->get(n); });
            LayerCompare lc;
            lc.seq = si;
            lc.layer = L;
            lc.len = static_cast<int>(s);
            const size_t stream_n = static_cast<size_t>(s * hc * D);
            if (role.engram) {
                lc.engram = true;
                std::memcpy(runner.stream(0), slab<uint16_t>(pre_engram, L), stream_n * 2);
                runner.run_engram(w);
                Bf16Stats st = compare_bf16(runner.stream(0), slab<uint16_t>(block_in, L), stream_n);
                lc.engram_equal = st.equal_frac;
                lc.engram_rel_l2 = st.rel_l2;
            }
            // Reference inputs: stream after Engram, the pre-mix, and the slots of the latest sources.
            std::memcpy(runner.stream(0), slab<uint16_t>(block_in, L), stream_n * 2);
            std::memcpy(runner.premix(0), slab<float>(premix, L), static_cast<size_t>(s * hc) * 4);
            SeqInfo& info = ctx.seqs[0];
            if (role.ratio > 0) {
                const int64_t T = s / role.ratio;
                if (!role.kv_source) {
                    info.cmp_rows = T;
                    if (T > 0) {
                        NpyArray kv = dump(sn + "_L" + std::to_string(role.kv_from) + "_compress_kv.npy");
                        put_rows(be, ctx.cmp_kv, info.row0, kv.data.data(), T);
                    }
                }
                if (!role.index_source) {
                    NpyArray tk = dump(sn + "_L" + std::to_string(role.topk_from) + "_topk.npy");
                    info.topk_width = tk.shape.size() == 2 ? tk.shape[1] : 0;
                    if (info.topk_width > 0) {
                        Tensor v = ctx.seq_topk(0);
                        be.upload(v, 0, tk.data.data(), v.nbytes());
                    }
                }
                if (role.reindex && T > 0) {
                    NpyArray ik = dump(sn + "_L" + std::to_string(role.index_keys_from) + "_index_k.npy");
                    put_rows(be, ctx.index_k, info.row0, ik.data.data(), T);
                    info.cmp_rows = T;
                    // Candidate mask [s, T] positions -> block bitmask (MODEL.md 4.6.2 step 6).
                    NpyArray cm =
                        dump(sn + "_L" + std::to_string(cfg.candidate_source_layer) + "_candidates.npy");
                    const int64_t bs = cfg.candidate_block_size, nb = (T + bs - 1) / bs,
                                  words = (nb + 31) / 32;
                    info.cand_words = words;
                    std::vector<uint32_t> bits(static_cast<size_t>(s * words), 0);
                    const int64_t width = cm.shape[1];
                    for (int64_t t = 0; t < s; ++t)
                        for (int64_t j = 0; j < std::min(T, width); ++j)
                            if (cm.as<uint8_t>()[t * width + j])
                                bits[static_cast<size_t>(t * words + j / bs / 32)] |= 1u << ((j / bs) % 32);
                    Tensor v = ctx.seq_cand(0);
                    be.upload(v, 0, bits.data(), v.nbytes());
                }
            }
            PassRunner::HostTaps taps;
            runner.run_block(w, &taps);
            Bf16Stats st = compare_bf16(runner.stream(0), slab<uint16_t>(pre_engram, L + 1), stream_n);
            lc.stream_equal = st.equal_frac;
            lc.stream_rel_l2 = st.rel_l2;
            lc.premix_rel_l2 =
                rel_l2_f32(runner.premix(0), slab<float>(premix, L + 1), static_cast<size_t>(s * hc));
            lc.attn_rel_l2 =
                compare_bf16(taps.attn_out.data(), slab<uint16_t>(attn_out, L), static_cast<size_t>(s * D))
                    .rel_l2;
            lc.moe_rel_l2 =
                compare_bf16(taps.moe_out.data(), slab<uint16_t>(moe_out, L), static_cast<size_t>(s * D))
                    .rel_l2;
            int same = 0;
            for (int64_t t = 0; t < s; ++t) {
                std::vector<int32_t> a(taps.route_idx.begin() + t * K, taps.route_idx.begin() + (t + 1) * K);
                std::vector<int32_t> b(slab<int32_t>(route_idx, L) + t * K,
                                       slab<int32_t>(route_idx, L) + (t + 1) * K);
                std::sort(a.begin(), a.end());
                std::sort(b.begin(), b.end());
                same += a == b;
            }
            lc.route_sets_equal = static_cast<double>(same) / s;
            lc.route_w_rel_l2 =
                rel_l2_f32(taps.route_w.data(), slab<float>(route_w, L), static_cast<size_t>(s * K));
            if (role.index_source && dump_exists(sn + "_L" + std::to_string(L) + "_topk.npy")) {
                NpyArray tk = dump(sn + "_L" + std::to_string(L) + "_topk.npy");
                const int64_t kw = tk.shape.size() == 2 ? tk.shape[1] : 0;
                Tensor v = ctx.seq_topk(0);
                auto ours = get_bytes(be, v);
                lc.topk_rows = static_cast<int>(s);
                if (kw == info.topk_width) {
                    for (int64_t t = 0; t < s; ++t)
                        lc.topk_rows_equal +=
                            std::memcmp(ours.data() + t * kw * 4, tk.data.data() + t * kw * 4,
                                        static_cast<size_t>(kw) * 4) == 0;
                }
            }
            if (role.kv_source && info.cmp_rows > 0) {
                NpyArray kv = dump(sn + "_L" + std::to_string(L) + "_compress_kv.npy");
                auto ours = get_bytes(be, ctx.cmp_kv.rows(info.row0, info.row0 + info.cmp_rows));
                lc.cmp_kv_equal = compare_bf16(reinterpret_cast<const uint16_t*>(ours.data()),
                                               kv.as<uint16_t>(), static_cast<size_t>(info.cmp_rows * hd))
                                      .equal_frac;
                if (role.owns_index_keys) {
                    NpyArray ik = dump(sn + "_L" + std::to_string(L) + "_index_k.npy");
                    auto ok = get_bytes(be, ctx.index_k.rows(info.row0, info.row0 + info.cmp_rows));
                    lc.index_k_equal =
                        compare_bf16(reinterpret_cast<const uint16_t*>(ok.data()), ik.as<uint16_t>(),
                                     static_cast<size_t>(info.cmp_rows * ihd))
                            .equal_frac;
                }
            }
            if (role.candidate_source && info.cand_words > 0) {
                NpyArray cm = dump(sn + "_L" + std::to_string(L) + "_candidates.npy");
                auto bits = get_bytes(be, ctx.seq_cand(0));
                const uint32_t* b = reinterpret_cast<const uint32_t*>(bits.data());
                const int64_t T = info.cmp_rows, width = cm.shape[1], bs = cfg.candidate_block_size;
                lc.cand_rows = static_cast<int>(s);
                for (int64_t t = 0; t < s; ++t) {
                    bool eq = true;
                    for (int64_t j = 0; j < std::min(T, width); ++j) {
                        const bool ours = (b[t * info.cand_words + j / bs / 32] >> ((j / bs) % 32)) & 1u;
                        // Positions past the query's reachable range are masked by causality anyway:
                        // compare the reachable ones (j < n_t).
                        if (j < (t + 1) / role.ratio && ours != (cm.as<uint8_t>()[t * width + j] != 0))
                            eq = false;
                    }
                    lc.cand_rows_equal += eq;
                }
            }
            rep.layers.push_back(lc);
        }
        // Head: feed the reference's final stream + collapse mix, compare target log-probabilities with
        // the log-softmax (fp64) of the reference's fp32 logits.
        const int L6 = static_cast<int>(cfg.n_layers);
        std::memcpy(runner.stream(0), slab<uint16_t>(pre_engram, L6), static_cast<size_t>(s * hc * D) * 2);
        std::memcpy(runner.premix(0), slab<float>(premix, L6), static_cast<size_t>(s * hc) * 4);
        auto head = gm.weights->acquire(kHeadLayer);
        const GlobalWeights g = bind_global_weights([&](const std::string& n) { return head->get(n); });
        auto scores = runner.finish(g, nullptr);
        NpyArray logits = dump(sn + "_logits.npy");
        const int64_t V = logits.shape[1];
        HeadCompare hcmp;
        hcmp.seq = si;
        hcmp.len = static_cast<int>(s);
        const auto& toks = seqs[static_cast<size_t>(si)].tokens;
        for (int64_t t = 0; t + 1 < s; ++t) {
            const float* l = logits.as<float>() + t * V;
            double mx = -INFINITY;
            for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
            double se = 0;
            for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(l[v]) - mx);
            const double ref = l[toks[static_cast<size_t>(t + 1)]] - (mx + std::log(se));
            hcmp.max_abs_logprob_diff = std::max(hcmp.max_abs_logprob_diff,
                                                 std::fabs(ref - scores[0].logprob[static_cast<size_t>(t)]));
        }
        rep.heads.push_back(hcmp);
    }
    return rep;
}

void check_teacher_forced_report(const TeacherForcedReport& rep, const std::string& backend) {
    std::printf("Teacher-forced comparison with DeepSeek's reference (GPU run), backend %s:\n%s",
                backend.c_str(), rep.table().c_str());
    if (const char* out = std::getenv("DS4R_REPORT_DIR")) {
        std::ofstream(std::string(out) + "/teacher_forced_" + backend + ".txt") << rep.table();
    }
    ASSERT_FALSE(rep.layers.empty());
    int route_same = 0, route_tot = 0, topk_eq = 0, topk_tot = 0, checked = 0, over = 0;
    // ULP-level differences that cannot be removed (the CPU's exactly rounded rsqrt vs the GPU's
    // rsqrtf approximation, MODEL.md 8.2; reduction orders of the reference's cuBLAS GEMMs and of the
    // tensor-core MMAs) occasionally flip an fp8 activation-quant scale inside the MoE, which moves
    // one token's output by a few percent: tiny-a seq 5 layer 3 on the CPU (adding 1 ulp to the
    // ffn_norm rsqrt of token 1 reproduces the reference's MoE output bit for bit), seq 6 layer 3 on
    // CUDA. So at most 1 in 40 of the layers may exceed 1e-3, and none may exceed the reference's own
    // CPU-vs-GPU maximum on this model (2.6e-2, golden README).
    for (const auto& l : rep.layers) {
        route_same += static_cast<int>(l.route_sets_equal * l.len + 0.5);
        route_tot += l.len;
        topk_eq += l.topk_rows_equal;
        topk_tot += l.topk_rows;
        if (l.engram) {
            EXPECT_LE(l.engram_rel_l2, 1e-3) << "seq " << l.seq << " layer " << l.layer << " Engram";
        }
        // Relative L2 <= 1e-3 on every layer whose top-k selection equals the reference's.
        if (!l.topk_all_equal()) continue;
        ++checked;
        const double worst = std::max(l.stream_rel_l2, l.premix_rel_l2);
        if (worst > 1e-3) ++over;
        EXPECT_LE(worst, 2.6e-2) << "seq " << l.seq << " layer " << l.layer << " output stream / pre-mix";
    }
    std::printf("layers with equal top-k: %d, of which %d above rel L2 1e-3\n", checked, over);
    EXPECT_LE(over, std::max(1, checked / 40)) << "more layers above 1e-3 than ulp-noise scale flips explain";
    EXPECT_GE(static_cast<double>(route_same) / route_tot, 0.99) << "routing sets equal for < 99% of tokens";
    if (topk_tot) {
        EXPECT_GE(static_cast<double>(topk_eq) / topk_tot, 0.90) << "top-k rows equal for < 90%";
    }
    for (const auto& h : rep.heads) EXPECT_LE(h.max_abs_logprob_diff, 1e-3) << "head, seq " << h.seq;
    std::printf("aggregate: routing sets equal %d/%d, top-k rows equal %d/%d\n", route_same, route_tot,
                topk_eq, topk_tot);
}

std::string TeacherForcedReport::table() const {
    std::ostringstream o;
    char b[512];
    std::snprintf(b, sizeof b, "%-5s %-5s %-4s %9s %10s %10s %10s %10s %7s %7s %9s %8s %8s\n", "seq", "layer",
                  "len", "engram=", "stream=", "stream_l2", "premix_l2", "moe_l2",
                  "route=", "topk=", "cand=", "cmpkv=", "idxk=");
    o << b;
    for (const auto& l : layers) {
        std::snprintf(
            b, sizeof b, "%-5d %-5d %-4d %9s %9.4f%% %10.2e %10.2e %10.2e %6.1f%% %7s %9s %7.3f%% %7.3f%%\n",
            l.seq, l.layer, l.len,
            l.engram ? (std::to_string(l.engram_equal * 100).substr(0, 6) + "%").c_str() : "-",
            l.stream_equal * 100, l.stream_rel_l2, l.premix_rel_l2, l.moe_rel_l2, l.route_sets_equal * 100,
            l.topk_rows ? (std::to_string(l.topk_rows_equal) + "/" + std::to_string(l.topk_rows)).c_str()
                        : "-",
            l.cand_rows ? (std::to_string(l.cand_rows_equal) + "/" + std::to_string(l.cand_rows)).c_str()
                        : "-",
            l.cmp_kv_equal * 100, l.index_k_equal * 100);
        o << b;
    }
    for (const auto& h : heads) {
        std::snprintf(b, sizeof b, "head seq %d (len %d): max |d logprob| vs reference logits %.3g\n", h.seq,
                      h.len, h.max_abs_logprob_diff);
        o << b;
    }
    return o.str();
}

}  // namespace ds4r::test
