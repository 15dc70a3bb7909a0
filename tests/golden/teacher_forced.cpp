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
        ro.chunk_rows = 1 << 20;
        ro.capture_layers = {static_cast<int>(cfg.n_layers)};  // the collapsed final hidden state
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
                }
                if (role.uses_candidates && T > 0) {
                    // Candidate mask [s, T] positions -> block bitmask (docs/MODEL.md 4.6.2 step 6).
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
        MemSink collapsed;
        auto scores = runner.finish(g, &collapsed);
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
        // The collapsed final hidden state (bf16 before the final norm; captured as fp16 of it) vs
        // the reference's final_hidden_bf16, compared in the capture's fp16.
        if (dump_exists(sn + "_final_hidden_bf16.npy")) {
            NpyArray fh = dump(sn + "_final_hidden_bf16.npy");
            const auto& mine = collapsed.rows.at({L6, 0});
            const size_t n = static_cast<size_t>(s * D);
            if (static_cast<size_t>(fh.numel()) == n && mine.size() == n) {
                size_t eq = 0;
                for (size_t k = 0; k < n; ++k) eq += mine[k] == f32_to_f16(bf16_to_f32(fh.as<uint16_t>()[k]));
                hcmp.collapsed_equal = static_cast<double>(eq) / static_cast<double>(n);
            } else {
                hcmp.collapsed_equal = -1;  // shape mismatch: fails the check
            }
        } else {
            hcmp.collapsed_equal = -1;
        }
        rep.heads.push_back(hcmp);
    }
    return rep;
}

namespace {

// Bounds just above what each backend measures today on tiny-a (so a regression fails). A layer
// listed in `exceptions` gets its own bounds (measured + margin) instead of the general ones.
struct LayerException {
    int seq, layer;
    double stream_l2, moe_l2, route_w_l2, stream_equal_min;
    const char* why;
};
struct TeacherForcedBounds {
    double stream_l2, premix_l2, attn_l2, moe_l2, route_w_l2, engram_l2;
    double stream_equal_min, engram_equal_min;  // bitwise-equal fractions
    double head_logprob;                        // max |d logprob| per sequence
    double collapsed_equal_min;                 // final collapsed state vs final_hidden_bf16
    std::vector<LayerException> exceptions;
};

TeacherForcedBounds bounds_for(const std::string& backend) {
    TeacherForcedBounds b{};
    b.head_logprob = 1e-5;  // worst measured: CPU 2.5e-7, CUDA 9.3e-7 (issue 10)
    if (backend == "cpu") {
        // CPU backend, measured 2026-12-02 (the table this test prints): worst stream rel L2 3.78e-4
        // (seq 2 layer 2), pre-mix 8.08e-5, attention 0 (bitwise equal everywhere), MoE 1.27e-4,
        // routing weights 1.86e-5, Engram 3.61e-7; min bitwise stream 98.24%, Engram 99.967%; the
        // collapsed final state bitwise equal; head 2.5e-7. Bounds ~15% above (below for fractions).
        b.stream_l2 = 4.4e-4;
        b.premix_l2 = 9.3e-5;
        b.attn_l2 = 0.0;
        b.moe_l2 = 1.5e-4;
        b.route_w_l2 = 2.2e-5;
        b.engram_l2 = 4.2e-7;
        b.stream_equal_min = 0.98;
        b.engram_equal_min = 0.9996;
        b.collapsed_equal_min = 1.0;
        // The CPU's exactly rounded rsqrt vs the GPU's rsqrtf (docs/MODEL.md 8.2): in seq 5 layer 3 token 1's
        // ffn_norm r is 1 fp32 ulp below the reference's, which flips an fp8 act-quant scale inside the
        // MoE (r + 1 ulp reproduces the dumped MoE output bit for bit; cpuref::rsqrt_f32). Kept:
        // the CPU backend is the exactly rounded reference model, not a copy of rsqrtf.
        // Measured: stream 5.01e-3, MoE 1.02e-2, routing weights 1.72e-5, stream bitwise 94.70%.
        b.exceptions.push_back(
            {5, 3, 5.8e-3, 1.18e-2, 2.0e-5, 0.94, "CPU exactly rounded rsqrt (docs/MODEL.md 8.2)"});
    } else {
        // CUDA backend with the accurate mHC / norm sums (issue 10), measured on the H200 2026-12-02
        // (scripts/gpu_suite.sh): worst stream rel L2 3.78e-4, pre-mix 8.08e-5, attention 0 (bitwise
        // equal everywhere), MoE 1.49e-5, routing weights 8.13e-6, Engram 3.61e-7; min bitwise stream
        // 98.24%, Engram 99.967%; the collapsed final state bitwise equal; head 9.3e-7; 0 of 48 layers
        // above 1e-3 (before the fix: seq 6 layer 3 at 2.7e-3). Bounds ~15% above (below for fractions).
        b.stream_l2 = 4.4e-4;
        b.premix_l2 = 9.3e-5;
        b.attn_l2 = 0.0;
        b.moe_l2 = 1.75e-5;
        b.route_w_l2 = 9.4e-6;
        b.engram_l2 = 4.2e-7;
        b.stream_equal_min = 0.98;
        b.engram_equal_min = 0.9996;
        b.collapsed_equal_min = 1.0;
    }
    return b;
}

}  // namespace

void check_teacher_forced_report(const TeacherForcedReport& rep, const std::string& backend) {
    std::printf("Teacher-forced comparison with DeepSeek's reference (GPU run), backend %s:\n%s",
                backend.c_str(), rep.table().c_str());
    if (const char* out = std::getenv("DS4R_REPORT_DIR")) {
        std::ofstream(std::string(out) + "/teacher_forced_" + backend + ".txt") << rep.table();
    }
    ASSERT_FALSE(rep.layers.empty());
    ASSERT_FALSE(rep.heads.empty());
    const TeacherForcedBounds b = bounds_for(backend);
    int over = 0;
    double worst[8] = {0, 0, 0, 0, 0, 0, 1, 1};  // stream, premix, attn, moe, route_w, engram l2; eq mins
    for (const auto& l : rep.layers) {
        const std::string at = "seq " + std::to_string(l.seq) + " layer " + std::to_string(l.layer);
        // Structure: 100% on tiny-a. A mismatch here does not skip the value checks below.
        EXPECT_EQ(l.route_sets_equal, 1.0) << at << ": routing sets";
        EXPECT_EQ(l.topk_rows_equal, l.topk_rows) << at << ": index top-k rows";
        EXPECT_EQ(l.cand_rows_equal, l.cand_rows) << at << ": candidate rows";
        EXPECT_EQ(l.cmp_kv_equal, 1.0) << at << ": compressed KV (bitwise)";
        EXPECT_EQ(l.index_k_equal, 1.0) << at << ": index keys (bitwise)";
        if (l.engram) {
            EXPECT_LE(l.engram_rel_l2, b.engram_l2) << at << ": Engram rel L2";
            EXPECT_GE(l.engram_equal, b.engram_equal_min) << at << ": Engram bitwise fraction";
            worst[5] = std::max(worst[5], l.engram_rel_l2);
            worst[7] = std::min(worst[7], l.engram_equal);
        }
        EXPECT_LE(l.premix_rel_l2, b.premix_l2) << at << ": pre-mix rel L2";
        EXPECT_LE(l.attn_rel_l2, b.attn_l2) << at << ": attention output rel L2";
        worst[1] = std::max(worst[1], l.premix_rel_l2);
        worst[2] = std::max(worst[2], l.attn_rel_l2);
        if (std::max(l.stream_rel_l2, l.premix_rel_l2) > 1e-3) ++over;
        const LayerException* ex = nullptr;
        for (const auto& e : b.exceptions)
            if (e.seq == l.seq && e.layer == l.layer) ex = &e;
        if (ex) {
            EXPECT_LE(l.stream_rel_l2, ex->stream_l2) << at << " (" << ex->why << "): stream rel L2";
            EXPECT_LE(l.moe_rel_l2, ex->moe_l2) << at << " (" << ex->why << "): MoE rel L2";
            EXPECT_LE(l.route_w_rel_l2, ex->route_w_l2)
                << at << " (" << ex->why << "): routing weights rel L2";
            EXPECT_GE(l.stream_equal, ex->stream_equal_min) << at << " (" << ex->why << "): stream bitwise";
            continue;
        }
        EXPECT_LE(l.stream_rel_l2, b.stream_l2) << at << ": stream rel L2";
        EXPECT_LE(l.moe_rel_l2, b.moe_l2) << at << ": MoE output rel L2";
        EXPECT_LE(l.route_w_rel_l2, b.route_w_l2) << at << ": routing weights rel L2";
        EXPECT_GE(l.stream_equal, b.stream_equal_min) << at << ": stream bitwise fraction";
        worst[0] = std::max(worst[0], l.stream_rel_l2);
        worst[3] = std::max(worst[3], l.moe_rel_l2);
        worst[4] = std::max(worst[4], l.route_w_rel_l2);
        worst[6] = std::min(worst[6], l.stream_equal);
    }
    std::printf(
        "worst outside the listed exceptions: stream %.3g premix %.3g attn %.3g moe %.3g route_w %.3g "
        "engram %.3g; min bitwise stream %.6f engram %.6f; layers above rel L2 1e-3: %d of %zu\n",
        worst[0], worst[1], worst[2], worst[3], worst[4], worst[5], worst[6], worst[7], over,
        rep.layers.size());
    EXPECT_LE(over, static_cast<int>(b.exceptions.size()))
        << "layers above 1e-3 besides the listed exceptions";
    double worst_head = 0, worst_collapsed = 1;
    for (const auto& h : rep.heads) {
        EXPECT_LE(h.max_abs_logprob_diff, b.head_logprob) << "head, seq " << h.seq;
        EXPECT_GE(h.collapsed_equal, b.collapsed_equal_min) << "collapsed final hidden state, seq " << h.seq;
        worst_head = std::max(worst_head, h.max_abs_logprob_diff);
        worst_collapsed = std::min(worst_collapsed, h.collapsed_equal);
    }
    std::printf("head: worst |d logprob| %.3g; collapsed final hidden state bitwise (fp16) min %.6f\n",
                worst_head, worst_collapsed);
}

std::string TeacherForcedReport::table() const {
    std::ostringstream o;
    char b[512];
    std::snprintf(b, sizeof b, "%-5s %-5s %-4s %9s %10s %10s %10s %10s %10s %10s %7s %7s %9s %8s %8s\n",
                  "seq", "layer", "len", "engram=", "stream=", "stream_l2", "premix_l2", "attn_l2", "moe_l2",
                  "route_w_l2", "route=", "topk=", "cand=", "cmpkv=", "idxk=");
    o << b;
    for (const auto& l : layers) {
        std::snprintf(
            b, sizeof b,
            "%-5d %-5d %-4d %9s %9.4f%% %10.2e %10.2e %10.2e %10.2e %10.2e %6.1f%% %7s %9s %7.3f%% %7.3f%%\n",
            l.seq, l.layer, l.len,
            l.engram ? (std::to_string(l.engram_equal * 100).substr(0, 6) + "%").c_str() : "-",
            l.stream_equal * 100, l.stream_rel_l2, l.premix_rel_l2, l.attn_rel_l2, l.moe_rel_l2,
            l.route_w_rel_l2, l.route_sets_equal * 100,
            l.topk_rows ? (std::to_string(l.topk_rows_equal) + "/" + std::to_string(l.topk_rows)).c_str()
                        : "-",
            l.cand_rows ? (std::to_string(l.cand_rows_equal) + "/" + std::to_string(l.cand_rows)).c_str()
                        : "-",
            l.cmp_kv_equal * 100, l.index_k_equal * 100);
        o << b;
    }
    for (const auto& h : heads) {
        std::snprintf(
            b, sizeof b,
            "head seq %d (len %d): max |d logprob| vs reference logits %.3g; collapsed state bitwise "
            "%.4f%%\n",
            h.seq, h.len, h.max_abs_logprob_diff, h.collapsed_equal * 100);
        o << b;
    }
    return o.str();
}

}  // namespace ds4r::test
