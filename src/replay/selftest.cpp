#include "ds4r/selftest.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/make_tiny.h"
#include "ds4r/numeric.h"
#include "ds4r/output.h"

namespace ds4r {

namespace {

struct Report {
    std::FILE* out;
    int failed = 0;
    void check(bool ok, const std::string& what, const std::string& detail = "") {
        std::fprintf(out, "  [%s] %s%s%s\n", ok ? " ok " : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
                     detail.c_str());
        std::fflush(out);
        failed += !ok;
    }
};

// Known answers of DeepSeek's activation quantizers (docs/MODEL.md 5.1, 5.2), worked out by hand.
void check_quantization(Backend& be, Report& r) {
    // The fp8 round trip the forward runs (window KV): x <- bf16(e4m3(x / s) * s).
    // Block 1: max 448 gives scale 2^0; -3 and 2.5 are exact e4m3 values; 1e-30 -> code 0.
    std::vector<uint16_t> x(64, f32_to_bf16(1e-30f));
    x[0] = f32_to_bf16(448.0f);
    x[1] = f32_to_bf16(-3.0f);
    x[2] = f32_to_bf16(2.5f);
    // Block 2: all tiny -> amax floored at 1e-4 -> s = 2^ceil(log2(1e-4/448)) = 2^-22 (2^-23 without
    // the floor). 3e-5 / 2^-22 = 125.8 -> e4m3 RNE 128 -> 2^-15; 1.5 * 2^-31 / 2^-22 = 1.5 * 2^-9, an
    // e4m3 subnormal tie -> even code 2 -> 2^-30 (with s = 2^-23 it would stay 1.5 * 2^-31).
    x[32] = f32_to_bf16(3.0e-5f);
    x[33] = f32_to_bf16(std::ldexp(1.5f, -31));
    Tensor xt = be.alloc(DType::BF16, {1, 64});
    be.upload(xt, 0, x.data(), 128);
    be.act_quant_fp8_inplace(xt);
    uint16_t xh[64];
    be.download(xh, xt, 0, 128);
    const auto v = [&](int i) { return bf16_to_f32(xh[i]); };
    const bool ok = v(0) == 448.0f && v(1) == -3.0f && v(2) == 2.5f && v(3) == 0.0f &&
                    v(32) == std::ldexp(1.0f, -15) && v(33) == std::ldexp(1.0f, -30) && v(34) == 0.0f;
    r.check(ok, "fp8 activation quantization known answers",
            strfmt("%g %g %g %g | %g %g %g", v(0), v(1), v(2), v(3), v(32), v(33), v(34)));
    // fp4 e8m0 / 32: amax 6 -> scale 1; 5.0 is a tie between 4 and 6 -> even code (4.0); 0.25 -> 0.
    std::vector<uint16_t> y(32, 0);
    y[0] = f32_to_bf16(6.0f);
    y[1] = f32_to_bf16(5.0f);
    y[2] = f32_to_bf16(0.25f);
    y[3] = f32_to_bf16(-1.75f);
    Tensor yt = be.alloc(DType::BF16, {1, 32});
    be.upload(yt, 0, y.data(), 64);
    be.fp4_quant_inplace(yt, Fp4Scale::E8M0_32);
    uint16_t yh[32];
    be.download(yh, yt, 0, 64);
    r.check(bf16_to_f32(yh[0]) == 6.0f && bf16_to_f32(yh[1]) == 4.0f && bf16_to_f32(yh[2]) == 0.0f &&
                bf16_to_f32(yh[3]) == -2.0f,
            "fp4 (e8m0 scales) known answers",
            strfmt("%g %g %g %g", bf16_to_f32(yh[0]), bf16_to_f32(yh[1]), bf16_to_f32(yh[2]),
                   bf16_to_f32(yh[3])));
}

std::vector<std::vector<int32_t>> test_sequences(int64_t vocab) {
    std::mt19937 rng(1234);
    std::vector<std::vector<int32_t>> seqs;
    for (int len : {1, 2, 3, 17, 64, 150}) {
        std::vector<int32_t> s(static_cast<size_t>(len));
        for (auto& t : s) t = static_cast<int32_t>(rng() % vocab);
        seqs.push_back(s);
    }
    return seqs;
}

std::vector<std::string> score(Backend& be, const Checkpoint& ck, const EngramResources* eng,
                               const std::vector<std::vector<std::vector<int32_t>>>& passes, int64_t chunk,
                               std::vector<SequenceScores>* first_scores = nullptr) {
    auto ws = make_sync_weight_source(be, ck);
    ReplayOptions ro;
    ro.chunk_rows = chunk;
    PassRunner runner(be, ck, *ws, eng, ro);
    std::vector<std::string> recs;
    for (const auto& p : passes) {
        auto sc = runner.run(p, nullptr);
        for (const auto& s : sc) recs.push_back(format_record("0", s, ro.top_k, {}, "{}"));
        if (first_scores && first_scores->empty()) *first_scores = sc;
    }
    return recs;
}

}  // namespace

int run_selftest(const SelftestOptions& opt, std::FILE* out) {
    Report r{out};
    const auto t0 = std::chrono::steady_clock::now();
    std::string dir = opt.keep_dir;
    bool remove_dir = false;
    if (dir.empty()) {
        char tmpl[] = "/tmp/ds4replay-selftest-XXXXXX";
        if (!mkdtemp(tmpl)) throw RuntimeError("selftest: cannot create a temporary directory");
        dir = tmpl;
        remove_dir = true;
    }
    struct Cleanup {
        std::string d;
        bool on;
        ~Cleanup() {
            std::error_code ec;
            if (on) std::filesystem::remove_all(d, ec);
        }
    } cleanup{dir, remove_dir};
    std::fprintf(out, "ds4replay selftest (model in %s)\n", dir.c_str());
    MakeTinyOptions mo;
    mo.seed = 20261129;
    mo.force = true;
    make_tiny(dir + "/model", mo);
    Checkpoint ck = Checkpoint::open(dir + "/model");
    r.check(true, "make-tiny checkpoint written and validated", strfmt("%zu tensors", ck.tensors().size()));
    auto eng = load_engram_resources(ck);
    r.check(eng != nullptr && eng->map.num_keys == ck.config().engram_compressed_vocab_size,
            "Engram token map built from tokenizer.json",
            eng ? strfmt("%lld keys", (long long)eng->map.num_keys) : "");

    auto be = select_backend(opt.backend, opt.device, 0, parse_gpu_kernels(opt.kernels));
    std::fprintf(out, "  backend: %s\n", be->name().c_str());
    check_quantization(*be, r);

    const auto seqs = test_sequences(ck.config().vocab_size);
    std::vector<SequenceScores> sc;
    auto together = score(*be, ck, eng.get(), {seqs}, 4096, &sc);
    // Sane distributions: finite, logprob <= 0, entropy in [0, log V], rank >= 1, top-k sorted.
    bool sane = true;
    std::string why;
    const double logv = std::log(static_cast<double>(ck.config().vocab_size));
    for (const auto& s : sc) {
        for (double lp : s.logprob) sane &= std::isfinite(lp) && lp <= 1e-9;
        for (double e : s.entropy) sane &= std::isfinite(e) && e >= -1e-9 && e <= logv + 1e-9;
        for (int32_t rk : s.rank) sane &= rk >= 1;
        for (int64_t t = 0; t < s.n; ++t)
            for (int j = 1; j < 8; ++j)
                sane &= s.topk_logprobs[static_cast<size_t>(t * 8 + j)] <=
                        s.topk_logprobs[static_cast<size_t>(t * 8 + j - 1)];
        if (!sc.empty() && s.n > 1) why = strfmt("mean entropy %.3f nats of max %.3f", s.entropy[0], logv);
    }
    r.check(sane, "distributions are sane", why);
    auto again = score(*be, ck, eng.get(), {seqs}, 4096);
    r.check(again == together, "determinism: two runs give identical records");
    std::vector<std::vector<std::vector<int32_t>>> singles;
    for (const auto& s : seqs) singles.push_back({s});
    auto alone = score(*be, ck, eng.get(), singles, 4096);
    auto chunked = score(*be, ck, eng.get(), {seqs}, 10);
    r.check(alone == together, "batch invariance: each sequence alone == all together");
    r.check(chunked == together, "batch invariance: 10-row chunks == one chunk");
    if (be->name().rfind("cuda", 0) == 0) {
        auto cpu = make_cpu_backend();
        std::vector<SequenceScores> cs;
        score(*cpu, ck, eng.get(), {seqs}, 4096, &cs);
        std::vector<double> d;
        for (size_t i = 0; i < sc.size(); ++i)
            for (size_t t = 0; t < sc[i].logprob.size(); ++t)
                d.push_back(std::fabs(sc[i].logprob[t] - cs[i].logprob[t]));
        std::sort(d.begin(), d.end());
        const double med = d.empty() ? 0 : d[d.size() / 2], mx = d.empty() ? 0 : d.back();
        r.check(med <= 0.1, "CUDA vs CPU backend", strfmt("|d logprob| median %.4f max %.4f", med, mx));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(out, "selftest %s (%d failed) in %.1fs\n", r.failed ? "FAILED" : "passed", r.failed, secs);
    return r.failed ? 1 : 0;
}

}  // namespace ds4r
