// The pass-wide attention arenas (include/ds4r/model.h: window / compressed KV, index keys, top-k,
// candidate mask) and the pass planning that keeps them within the backend's memory:
//  - seq_arena_caps bounds what every layer of the model publishes for a sequence (begin_layer), and
//    reaches it, on the tiny, tiny-roles and full-width configurations;
//  - PassContext::setup allocates exactly sum(seq_arena_bytes) + pass_rope_bytes (the planner and the
//    allocation cannot drift apart), and releases the previous pass's arenas before allocating;
//  - the released model's bytes per token (the figure docs/PERFORMANCE.md plans with);
//  - score with a small arena room ends its passes where the next sequence's arenas would not fit:
//    more passes, the same output and hidden bytes as one unconstrained pass.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "cli_run_util.h"
#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/config.h"
#include "ds4r/error.h"
#include "ds4r/make_tiny.h"
#include "ds4r/model.h"
#include "ds4r/score.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::slurp;

int64_t arena_nbytes(const PassContext& ctx) {
    return static_cast<int64_t>(ctx.win_kv.nbytes() + ctx.cmp_kv.nbytes() + ctx.index_k.nbytes() +
                                ctx.topk.nbytes() + ctx.cand.nbytes() + ctx.rope_plain.nbytes() +
                                ctx.rope_yarn.nbytes());
}

void expect_caps_bound_every_layer(const ModelConfig& cfg, const std::string& what) {
    const std::vector<LayerRole> roles = derive_layer_roles(cfg, what);
    for (int64_t len : {1, 2, 3, 7, 8, 9, 63, 64, 65, 300, 1800, 5000}) {
        const SeqArenaCaps caps = seq_arena_caps(cfg, len);
        SeqInfo s;
        s.len = len;
        int64_t max_cmp = 0, max_topk = 0, max_cand = 0;
        PassContext ctx(*make_cpu_backend(), cfg);  // begin_layer reads cfg and seqs only
        ctx.seqs = {s};
        for (const LayerRole& r : roles) {
            begin_layer(ctx, r);
            const SeqInfo& got = ctx.seqs[0];
            EXPECT_LE(got.cmp_rows, caps.cmp_rows) << what << " layer " << r.layer << " len " << len;
            EXPECT_LE(got.topk_width, caps.topk_width) << what << " layer " << r.layer << " len " << len;
            EXPECT_LE(got.cand_words, caps.cand_words) << what << " layer " << r.layer << " len " << len;
            max_cmp = std::max(max_cmp, got.cmp_rows);
            max_topk = std::max(max_topk, got.topk_width);
            max_cand = std::max(max_cand, got.cand_words);
        }
        // tight: some layer publishes the cap (no bytes reserved that nobody writes)
        EXPECT_EQ(max_cmp, caps.cmp_rows) << what << " len " << len;
        EXPECT_EQ(max_topk, caps.topk_width) << what << " len " << len;
        EXPECT_EQ(max_cand, caps.cand_words) << what << " len " << len;
    }
}

TEST(PassArenas, CapsBoundWhatEveryLayerPublishes) {
    expect_caps_bound_every_layer(Checkpoint::open(test::tiny_model_dir()).config(), "golden tiny-a");
    for (TinyPreset p : {TinyPreset::Tiny, TinyPreset::TinyRoles, TinyPreset::FullWidth}) {
        const ModelConfig cfg = make_tiny_base_config(p, 0);
        expect_caps_bound_every_layer(cfg, tiny_preset_name(p));
    }
    // 40 full-width layers: the released model's roles
    expect_caps_bound_every_layer(make_tiny_base_config(TinyPreset::FullWidth, 40), "full-width, 40 layers");
}

TEST(PassArenas, SetupAllocatesWhatThePlannerCounts) {
    const ModelConfig cfg = Checkpoint::open(test::tiny_model_dir()).config();
    auto be = make_cpu_backend();
    PassContext ctx(*be, cfg);
    for (const std::vector<int64_t>& lens : {std::vector<int64_t>{1}, std::vector<int64_t>{5, 64, 300, 9, 2},
                                             std::vector<int64_t>{1000, 1, 33}}) {
        ctx.setup(lens);
        int64_t planned = 0, longest = 0;
        for (int64_t len : lens) {
            planned += seq_arena_bytes(cfg, len);
            longest = std::max(longest, len);
        }
        planned += pass_rope_bytes(cfg, longest);
        // each sequence's top-k and mask regions follow the previous one's, at its caps
        int64_t topk_off = 0, cand_off = 0;
        for (const SeqInfo& s : ctx.seqs) {
            EXPECT_EQ(s.topk_off, topk_off);
            EXPECT_EQ(s.cand_off, cand_off);
            topk_off += s.len * s.topk_cap;
            cand_off += s.len * s.cand_cap;
        }
        // an empty top-k / mask arena still takes its one placeholder element
        const int64_t placeholders = 4 * ((topk_off == 0) + (cand_off == 0));
        EXPECT_EQ(arena_nbytes(ctx), planned + placeholders) << lens.size() << " sequences";
    }
}

// The CPU backend with a budget on the bytes its tensors hold at once (freed when their last holder goes).
class BudgetBackend : public CpuBackend {
public:
    explicit BudgetBackend(int64_t budget) : budget_(budget) {}
    Tensor alloc(DType t, const Shape& shape) override {
        Tensor x = CpuBackend::alloc(t, shape);
        const auto bytes = static_cast<int64_t>(x.nbytes());
        if (*live_ + bytes > budget_)
            throw OutOfMemoryError(strfmt("budget: %lld + %lld bytes", (long long)*live_, (long long)bytes));
        *live_ += bytes;
        auto live = live_;
        auto inner = x.hold;
        x.hold = std::shared_ptr<void>(x.data, [live, inner, bytes](void*) { *live -= bytes; });
        return x;
    }
    int64_t live() const { return *live_; }

private:
    int64_t budget_;
    std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
};

TEST(PassArenas, SetupReleasesThePreviousPassFirst) {
    // Room for one pass's arenas exactly: a pass run again (after an out-of-memory error, with smaller
    // chunks) must find the room its first attempt held.
    const ModelConfig cfg = Checkpoint::open(test::tiny_model_dir()).config();
    const std::vector<int64_t> lens = {700, 300, 24};
    int64_t bytes = pass_rope_bytes(cfg, 700);
    for (int64_t len : lens) bytes += seq_arena_bytes(cfg, len);
    BudgetBackend be(bytes);
    PassContext ctx(be, cfg);
    ctx.setup(lens);
    EXPECT_EQ(be.live(), bytes);
    ctx.setup(lens);
    EXPECT_EQ(be.live(), bytes);
    ctx.setup({5});
    EXPECT_EQ(be.live(), seq_arena_bytes(cfg, 5) + pass_rope_bytes(cfg, 5));
}

TEST(PassArenas, ReleasedModelBytesPerToken) {
    const ModelConfig cfg = make_tiny_base_config(TinyPreset::FullWidth, 40);
    // window KV + compressed KV (512 bf16 each) + index keys (128 bf16) + top-k (512 i32) + the candidate
    // mask (1800 compressed rows at ratio 1 -> 225 blocks of 8 -> 8 words)
    EXPECT_EQ(seq_arena_bytes(cfg, 1800), 1800 * (1024 + 1024 + 256 + 2048 + 32));
    // short sequences: K_c = T < 512
    EXPECT_EQ(seq_arena_bytes(cfg, 100), 100 * (1024 + 1024 + 256 + 400 + 4));
    EXPECT_EQ(pass_rope_bytes(cfg, 1800), 2 * 1800 * 32 * 2 * 4);
}

// 14 sequences of 3..40 tokens.
std::string input_text() {
    std::mt19937 rng(99);
    std::string s;
    for (int i = 0; i < 14; ++i) {
        json toks = json::array();
        for (int j = 0, n = 3 + (i * 11) % 38; j < n; ++j) toks.push_back(static_cast<int>(rng() % 200));
        s += json{{"id", strfmt("a%02d", i)}, {"tokens", toks}}.dump() + "\n";
    }
    return s;
}

ScoreOptions options(const std::string& dir, uint64_t arena_room) {
    ScoreOptions o;
    o.model_dir = test::tiny_model_dir();
    o.input = dir + "/in.jsonl";
    o.output = dir + "/out.jsonl";
    o.hidden_dir = dir + "/hidden";
    o.capture_layers = {1, 6};
    o.backend = "cpu";
    o.progress = "none";
    o.top_k = 3;
    o.pass_tokens = 100000;  // one pass unless the arenas end it
    o.arena_room_for_tests = arena_room;
    return o;
}

TEST(PassArenas, ScorePassesEndWhereTheArenasWouldNotFitWithTheSameBytes) {
    const std::string ref = test::temp_dir("arena-ref"), small = test::temp_dir("arena-small");
    test::write_text(ref + "/in.jsonl", input_text());
    test::write_text(small + "/in.jsonl", input_text());
    const ScoreSummary one = run_score(options(ref, 0));
    EXPECT_EQ(one.passes, 1);
    // room for ~3 of these sequences at a time
    const ModelConfig cfg = Checkpoint::open(test::tiny_model_dir()).config();
    const uint64_t room = static_cast<uint64_t>(3 * seq_arena_bytes(cfg, 25) + pass_rope_bytes(cfg, 40));
    const ScoreSummary many = run_score(options(small, room));
    EXPECT_GE(many.passes, 5);
    EXPECT_EQ(many.sequences, 14);
    EXPECT_TRUE(slurp(small + "/out.jsonl") == slurp(ref + "/out.jsonl")) << "results differ";
    for (const char* f : {"hidden_L1.npy", "hidden_L6.npy"})
        EXPECT_TRUE(slurp(small + "/hidden/" + f) == slurp(ref + "/hidden/" + f)) << f;
    // a room smaller than one sequence's arenas: each pass takes one sequence (it may still fit once the
    // chunks shrink; here, on the CPU, it runs)
    const std::string tiny = test::temp_dir("arena-one");
    test::write_text(tiny + "/in.jsonl", input_text());
    const ScoreSummary each = run_score(options(tiny, 1));
    EXPECT_EQ(each.passes, 14);
    EXPECT_TRUE(slurp(tiny + "/out.jsonl") == slurp(ref + "/out.jsonl")) << "one sequence per pass";
}

}  // namespace
}  // namespace ds4r
