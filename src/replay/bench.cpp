#include "ds4r/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/clock.h"
#include "ds4r/kernel_bench.h"
#include "ds4r/log.h"
#include "ds4r/replay.h"
#include "ds4r/settings.h"
#include "replay/bench_io.h"
#include "replay/bench_kernels.h"

namespace ds4r {

namespace {

struct Csv {
    std::ofstream f;
    explicit Csv(const std::string& path) {
        if (!path.empty()) {
            f.open(path);
            if (!f) throw RuntimeError("bench: cannot write " + path);
            f << "section,name,layer,tokens,m,n,k,value,unit,extra\n";
        }
    }
    void row(const std::string& section, const std::string& name, int layer, int64_t tokens, int64_t m,
             int64_t n, int64_t k, double value, const std::string& unit, const std::string& extra = "") {
        if (!f.is_open()) return;
        f << csv_field(section) << ',' << csv_field(name) << ',' << layer << ',' << tokens << ',' << m << ','
          << n << ',' << k << ',' << strfmt("%.6g", value) << ',' << csv_field(unit) << ','
          << csv_field(extra) << '\n';
    }
};

struct Workload {
    std::string name;
    int64_t sequences, tokens;
};

std::vector<std::vector<int32_t>> make_sequences(const Workload& w, int64_t vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int32_t>> s(static_cast<size_t>(w.sequences));
    for (auto& q : s) {
        q.resize(static_cast<size_t>(w.tokens));
        for (auto& t : q) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    }
    return s;
}

// "12%" of a reference rate, or "-" when there is none (CPU backend).
std::string percent_of(double value, double reference) {
    return reference > 0 ? strfmt("%.0f%%", 100 * value / reference) : std::string("-");
}

}  // namespace

// A per-layer figure (metric(i) of timings[i]; the head last) projected to the released 40 layers by role
// (docs/MODEL.md 2.4): 2 window-only layers (one with Engram), 8 layers that run an indexer (4 KV + index
// sources, 4 reindex), 30 consumers, and Engram once more at layer 14. With the default 4-layer full-width
// checkpoint (window, window + Engram, KV + index source, consumer) each term is measured; with two layers
// (window, window + Engram: the dense-table runs on a small disk) 38 x L0 + 2 x L1 (the compressed layers'
// indexer and compressed attention unmeasured: the 4-layer runs had them 4-9% over L0); otherwise the mean
// layer x 40. Plus the head.
double project_40(const Checkpoint& ck, const std::vector<LayerTiming>& timings,
                  const std::function<double(size_t)>& metric, std::string* how) {
    double sum = 0, head = 0;
    int n = 0;
    for (size_t i = 0; i < timings.size(); ++i) {
        if (timings[i].layer < 0) {
            head = metric(i);
            continue;
        }
        sum += metric(i);
        ++n;
    }
    auto at = [&](int L) {
        for (size_t i = 0; i < timings.size(); ++i)
            if (timings[i].layer == L) return metric(i);
        return 0.0;
    };
    const auto& roles = ck.roles();
    if (roles.size() >= 4 && roles[0].ratio == 0 && !roles[0].engram && roles[1].engram &&
        roles[2].index_source && roles[3].ratio > 0 && !roles[3].index_source) {
        if (how) *how = "by role: L0 + L1 + 8 x L2 + 30 x L3 + Engram(L1 - L0) + head";
        return at(0) + at(1) + 8 * at(2) + 30 * at(3) + std::max(0.0, at(1) - at(0)) + head;
    }
    if (roles.size() == 2 && roles[0].ratio == 0 && !roles[0].engram && roles[1].ratio == 0 &&
        roles[1].engram) {
        if (how) *how = "by role: 38 x L0 + 2 x L1 (Engram) + head";
        return 38 * at(0) + 2 * at(1) + head;
    }
    if (how) *how = "mean layer x 40";
    return (n ? sum / n * 40 : 0.0) + head;
}

namespace {

void bench_workload(Backend& be, KernelBench* kb, const Checkpoint& ck, const EngramResources* eng,
                    const Workload& asked, const BenchOptions& opt, double bf16_peak, const DiskRates& disk,
                    Csv& csv, std::FILE* out) {
    const ModelConfig& c = ck.config();
    Workload w = asked;
    const PrefetchOptions po = prefetch_options(opt.io);  // --io, --read-threads, --read-request-mb
    // chunk rows as `score` sizes them: from the free memory before the weight slots are allocated
    ReplayOptions ro;
    ro.chunk_rows = plan_chunk_rows(opt.chunk_rows, be, c, be.free_memory(), weight_slots_bytes(ck),
                                    opt.prepared_experts);
    std::unique_ptr<WeightSource> ws =
        opt.prefetch ? make_prefetch_weight_source(be, ck, po) : make_sync_weight_source(be, ck);
    if (kb) kb->reset_memory_high_water();
    PassRunner runner(be, ck, *ws, eng, ro);
    // as score: the prepared experts where the memory allows (--prepared-experts)
    uint64_t room = pass_arena_room(be, c, ro.chunk_rows);
    const uint64_t prepared = plan_prepared_experts(be, c, room, opt.prepared_experts);
    room -= prepared;
    std::fprintf(out, "fp16 weights: %s\n",
                 opt.fp16_weights ? "auto (the Hopper kernels' fp8 GEMMs of >= 1,024 rows)" : "off");
    std::fprintf(out, "prepared experts: %s\n",
                 prepared
                     ? strfmt("on (%s weights, %.2f GB per layer)", expert_layout_name(be.prepared_experts()),
                              static_cast<double>(prepared) / 1e9)
                           .c_str()
                     : "off");
    if (w.name == "d") {
        // As score plans its passes: the sequences whose attention arenas fit the backend memory left
        // beside the weight slots and the chunks (a 24 GB card holds fewer tokens than host memory).
        const int64_t per_seq = seq_arena_bytes(c, w.tokens);
        const auto rope = static_cast<uint64_t>(pass_rope_bytes(c, w.tokens));
        const auto fit =
            static_cast<int64_t>((room > rope ? room - rope : 0) / static_cast<uint64_t>(per_seq));
        std::fprintf(
            out,
            "workload d: backend memory for the attention arenas %.2f GB (%.1f KB per token) holds %lld "
            "sequences%s\n",
            static_cast<double>(room) / 1e9, static_cast<double>(per_seq) / w.tokens / 1024, (long long)fit,
            fit < w.sequences ? ": the pass is capped there" : "");
        csv.row("workload_d", "arena_room_bytes", -1, 0, 0, 0, 0, static_cast<double>(room), "bytes");
        w.sequences = std::max<int64_t>(1, std::min(w.sequences, fit));
    }
    auto seqs = make_sequences(w, c.vocab_size, opt.seed);
    const int64_t total = w.sequences * w.tokens;
    be.profile_reset();
    // --passes N: N passes of fresh tokens (seeds seed, seed + 1, ...); the figures below are the last
    // pass's (steady state: with --engram-next-pass its rows were gathered during the previous pass).
    const int passes = std::max(1, opt.passes);
    std::vector<LayerTiming> timings;
    double wall = 0, wall_all = 0;
    size_t first_record = 0;  // the last pass's first LayerLoadRecord
    double stall_before = 0;  // Engram stall of the passes before the last
    for (int p = 0; p < passes; ++p) {
        std::vector<std::vector<int32_t>> next;
        if (p + 1 < passes) next = make_sequences(w, c.vocab_size, opt.seed + static_cast<uint64_t>(p) + 1);
        runner.set_next_pass(next);
        timings.clear();
        first_record = ws->stats().layers.size();
        stall_before = runner.engram_stats().wait_s;
        const double t0 = now_s();
        runner.run(seqs, nullptr, [&](const LayerTiming& t) { timings.push_back(t); });
        wall = now_s() - t0;
        wall_all += wall;
        seqs = std::move(next);
    }
    const WeightSourceStats st = ws->stats();
    std::fprintf(out, "\nworkload %s: %lld x %lld tokens (%lld), chunks of %lld rows, %s weights%s\n",
                 w.name.c_str(), (long long)w.sequences, (long long)w.tokens, (long long)total,
                 (long long)ro.chunk_rows, opt.prefetch ? "prefetched" : "synchronous",
                 passes > 1 ? strfmt("; pass %d of %d (the figures below; earlier passes %.2f s)", passes,
                                     passes, wall_all - wall)
                                  .c_str()
                            : "");
    std::fprintf(out, "  %-6s %9s %8s %8s %8s %8s %8s %7s %9s %7s\n", "layer", "GB", "read s", "upload s",
                 "compute s", "stall s", "wall s", "overlap", "TFLOP/s", "of bf16");
    double sum_wall = 0, sum_bound = 0, sum_compute = 0, sum_flops = 0;
    std::vector<double> layer_flops(timings.size(), 0.0);  // [i]: timings[i]'s FLOPs this pass
    int n_layers = 0;
    for (size_t i = 0; i < timings.size(); ++i) {
        const LayerTiming& t = timings[i];
        const LayerLoadRecord* rec =
            first_record + i < st.layers.size() ? &st.layers[first_record + i] : nullptr;
        const double read_s = rec ? rec->read_s : 0, up_s = rec ? rec->upload_s : 0;
        const double gb = rec ? static_cast<double>(rec->bytes) / 1e9 : 0;
        const double lwall = t.wall_s();
        const double bound = std::max({read_s, up_s, t.compute_s});
        double flops = 0;
        if (t.layer >= 0)
            flops = layer_flops_per_token(c, ck.roles()[static_cast<size_t>(t.layer)], w.tokens) *
                    static_cast<double>(total);
        else
            flops = 2.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.dim) *
                    static_cast<double>(total);
        layer_flops[i] = flops;
        const double tf = t.compute_s > 0 ? flops / t.compute_s / 1e12 : 0;
        std::fprintf(out, "  %-6s %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6.2fx %9.1f %7s\n",
                     t.layer < 0 ? "head" : std::to_string(t.layer).c_str(), gb, read_s, up_s, t.compute_s,
                     t.stall_s(), lwall, bound > 0 ? lwall / bound : 0.0, tf,
                     percent_of(tf, bf16_peak).c_str());
        const std::string name = t.layer < 0 ? "head" : "layer";
        csv.row("workload_" + w.name, name + "_read_s", t.layer, total, 0, 0, 0, read_s, "s",
                strfmt("bytes=%.0f", gb * 1e9));
        csv.row("workload_" + w.name, name + "_upload_s", t.layer, total, 0, 0, 0, up_s, "s");
        csv.row("workload_" + w.name, name + "_compute_s", t.layer, total, 0, 0, 0, t.compute_s, "s");
        csv.row("workload_" + w.name, name + "_stall_s", t.layer, total, 0, 0, 0, t.stall_s(), "s");
        csv.row("workload_" + w.name, name + "_engram_stall_s", t.layer, total, 0, 0, 0, t.engram_wait_s,
                "s");
        csv.row("workload_" + w.name, name + "_tflops", t.layer, total, 0, 0, 0, tf, "TFLOP/s");
        if (t.layer >= 0) {
            sum_wall += lwall;
            sum_bound += bound;
            sum_compute += t.compute_s;
            sum_flops += flops;
            ++n_layers;
        }
    }
    const double tps = static_cast<double>(total) / wall;
    const double per_layer = n_layers ? sum_wall / n_layers : 0;
    // Projection to the released 40 layers by role (docs/MODEL.md 2.4): 2 window-only layers (one with
    // Engram), 8 layers that run an indexer (4 KV + index sources, 4 reindex), 30 consumers, and
    // Engram once more at layer 14. With the default 4-layer full-width checkpoint (window,
    // window + Engram, KV + index source, consumer) each term is measured; otherwise the mean.
    std::string how;
    const double projected = project_40(
        ck, timings, [&](size_t i) { return timings[i].wall_s(); }, &how);
    // At most, as `score` sizes passes (with --engram-next-pass's share).
    const double host_per_token = static_cast<double>(pass_host_bytes_per_token(c, opt.io.engram_next_pass));
    std::fprintf(
        out,
        "  total %.2f s, %.0f tokens/s; %.2f s per layer (overlap wall/max(read,upload,compute) %.2f); "
        "layer GEMM work %.1f TFLOP/s (%s of measured bf16)\n",
        wall, tps, per_layer, sum_bound > 0 ? sum_wall / sum_bound : 0,
        sum_compute > 0 ? sum_flops / sum_compute / 1e12 : 0,
        percent_of(sum_compute > 0 ? sum_flops / sum_compute / 1e12 : 0, bf16_peak).c_str());
    std::fprintf(out, "  projected to 40 layers (%s): %.1f s per pass, %.0f tokens/s\n", how.c_str(),
                 projected, projected > 0 ? static_cast<double>(total) / projected : 0.0);
    double gpu_hw = 0;
    if (kb) gpu_hw = static_cast<double>(kb->memory_high_water());
    std::fprintf(out,
                 "  weights read: %.2f GB in %.2f s of reading (%.2f GB/s; %llu requests, %.0f%% O_DIRECT, "
                 "%d reader threads)\n",
                 static_cast<double>(st.bytes_read) / 1e9, st.read_seconds,
                 st.read_seconds > 0 ? static_cast<double>(st.bytes_read) / 1e9 / st.read_seconds : 0.0,
                 (unsigned long long)st.read_requests,
                 st.bytes_read
                     ? 100.0 * static_cast<double>(st.bytes_read_direct) / static_cast<double>(st.bytes_read)
                     : 0.0,
                 opt.prefetch ? po.read_threads : 1);
    std::fprintf(
        out,
        "  GPU memory high-water %.2f GB (weights slots %.2f GB); host state <= %.1f KB/token + %.2f "
        "GB pinned staging\n",
        gpu_hw / 1e9, static_cast<double>(st.device_bytes) / 1e9, host_per_token / 1024,
        static_cast<double>(st.host_bytes) / 1e9);
    if (profiling_enabled()) {
        auto prof = be.profile_totals();
        std::sort(prof.begin(), prof.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        // "parent/step" regions lie inside their parent's: listed under it, not added to the total
        double sum = 0;
        for (auto& [n, v] : prof)
            if (n.find('/') == std::string::npos) sum += v;
        std::fprintf(out,
                     "  profile (backend time per region, all layers + head, summed over the %d pass%s; "
                     "DS4R_PROFILE=1): total %.2f s\n",
                     passes, passes == 1 ? "" : "es", sum);
        for (auto& [n, v] : prof) {
            if (n.find('/') != std::string::npos) continue;
            std::fprintf(out, "    %-26s %8.3f s %5.1f%%\n", n.c_str(), v, sum > 0 ? 100 * v / sum : 0.0);
            csv.row("profile_" + w.name, n, -1, total, 0, 0, 0, v, "s");
            for (auto& [sn, sv] : prof)
                if (sn.size() > n.size() && sn.compare(0, n.size() + 1, n + "/") == 0) {
                    std::fprintf(out, "      %-24s %8.3f s %5.1f%%\n", sn.c_str(), sv,
                                 sum > 0 ? 100 * sv / sum : 0.0);
                    csv.row("profile_" + w.name, sn, -1, total, 0, 0, 0, sv, "s");
                }
        }
    }
    const BenchCsvRow row = [&](const std::string& n, double v, const std::string& u) {
        csv.row("workload_" + w.name, n, -1, total, 0, 0, 0, v, u);
    };
    const EngramGatherStats eg = runner.engram_stats();
    bench_report_io(ck, timings, layer_flops, st, eg, eg.wait_s - stall_before, wall_all, disk, out, row);
    if (w.name == "d") {
        // What bounds a 40-layer pass of this size: the projection by role of the read and compute times.
        PassBoundInputs pb;
        pb.tokens = total;
        pb.wall_s = projected;
        pb.read_s = project_40(ck, timings, [&](size_t i) {
            return first_record + i < st.layers.size() ? st.layers[first_record + i].read_s : 0.0;
        });
        pb.compute_s = project_40(ck, timings, [&](size_t i) { return timings[i].compute_s; });
        pb.weight_bytes = project_40(ck, timings, [&](size_t i) {
            return first_record + i < st.layers.size()
                       ? static_cast<double>(st.layers[first_record + i].bytes_read)
                       : 0.0;
        });
        pb.scales_in_memory = eng ? eng->scales_in_memory : true;
        bench_report_pass_bound(ck, pb, disk, out, row);
    }
    csv.row("workload_" + w.name, "tokens_per_s", -1, total, 0, 0, 0, tps, "tokens/s");
    csv.row("workload_" + w.name, "s_per_layer", -1, total, 0, 0, 0, per_layer, "s");
    csv.row("workload_" + w.name, "overlap", -1, total, 0, 0, 0, sum_bound > 0 ? sum_wall / sum_bound : 0,
            "ratio");
    csv.row("workload_" + w.name, "projected_40_layers_s", -1, total, 0, 0, 0, projected, "s");
    csv.row("workload_" + w.name, "gpu_high_water", -1, total, 0, 0, 0, gpu_hw, "bytes");
    csv.row("workload_" + w.name, "host_bytes_per_token", -1, total, 0, 0, 0, host_per_token, "bytes");
}

}  // namespace

int run_bench(const BenchOptions& opt, std::FILE* out) {
    Checkpoint ck = Checkpoint::open(opt.model_dir);
    const ModelConfig& c = ck.config();
    auto be = select_backend(opt.backend, opt.device, opt.gpu_memory_gb, parse_gpu_kernels(opt.kernels));
    be->set_fp16_weights(opt.fp16_weights);
    std::fprintf(out, "ds4replay bench: %s, %lld layers, dim %lld, %lld experts; backend %s\n",
                 opt.model_dir.c_str(), (long long)c.n_layers, (long long)c.dim,
                 (long long)c.n_routed_experts, be->name().c_str());
    Csv csv(opt.csv);
    std::vector<std::string> wl;
    {
        std::stringstream ss(opt.workloads);
        std::string x;
        while (std::getline(ss, x, ','))
            if (!x.empty()) wl.push_back(x);
    }
    const std::unique_ptr<KernelBench> kb = make_kernel_bench(*be);  // nullptr: not a CUDA backend
    double bf16_peak = 0;
    for (const auto& w : wl) {
        if (w == "kernels") {
            if (kb) {
                // the chunk rows a pass would run (sized as score and the workloads size them)
                bench_kernels(
                    *kb, c, opt, resolve_chunk_rows(opt.chunk_rows, c, be->free_memory()),
                    [&](const std::string& name, int64_t m, int64_t n, int64_t k, double value,
                        const std::string& unit, const std::string& note) {
                        csv.row("kernels", name, -1, 0, m, n, k, value, unit, note);
                    },
                    out, &bf16_peak);
                continue;
            }
            std::fprintf(out, "\nkernels: skipped (needs the CUDA backend)\n");
        }
    }
    // Workloads report their GEMM rate as a fraction of the measured bf16 rate: measure it when the
    // kernel benchmarks did not.
    if (kb && bf16_peak <= 0) {
        bf16_peak = kb->cublas_bf16_tflops(8192, 8192, 8192, opt.iters);
        std::fprintf(out, "\ncuBLAS bf16 8192^3 measured %.1f TFLOP/s (the workloads' reference rate)\n",
                     bf16_peak);
        csv.row("kernels", "cublas_bf16_8192", -1, 0, 8192, 8192, 8192, bf16_peak, "TFLOP/s");
    }
    auto eng = load_engram_resources(ck, opt.io);
    DiskRates disk;
    if (std::any_of(wl.begin(), wl.end(), [](const std::string& x) { return x != "kernels"; }))
        disk = bench_measure_disk(ck, opt.disk_seconds, opt.io, out,
                                  [&](const std::string& n, double v, const std::string& u) {
                                      csv.row("disk", n, -1, 0, 0, 0, 0, v, u);
                                  });
    for (const auto& w : wl) {
        Workload wk;
        if (w == "a")
            wk = {"a", 4, 512};
        else if (w == "b")
            wk = {"b", opt.b_sequences, opt.b_tokens};
        else if (w == "c")
            wk = {"c", 1, opt.c_tokens};
        else if (w == "d")
            wk = {"d", workload_d_sequences(c, opt.d_host_gb, opt.d_tokens, opt.io, out), opt.d_tokens};
        else if (w == "kernels")
            continue;
        else
            throw InputError("bench: unknown workload '" + w + "' (kernels, a, b, c, d)");
        bench_workload(*be, kb.get(), ck, eng.get(), wk, opt, bf16_peak, disk, csv, out);
        std::fflush(out);
    }
    return 0;
}

}  // namespace ds4r
