// `compare` (include/ds4r/compare.h): ds4replay-vs-ds4replay statistics on small hand-computed cases
// (median / mean / p95 / max |d logprob|, top-1 and rank agreement, KL over the shared top-k), API
// records (bare and whole chat-completion responses, token text through the tiny-a tokenizer,
// "token_id:N" strings, integer token_id fields, the -9999 sentinel, ambiguous texts, alignment to
// the last positions), and malformed inputs (InputError naming file and line; exit code 2 via the CLI).
#include "ds4r/compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/tokenizer.h"

namespace ds4r {
namespace {

using json = nlohmann::json;

const double kLn2 = std::log(2.0);

json replay_record(const json& id, const std::vector<double>& lp, const std::vector<int>& rank,
                   const std::vector<std::vector<int>>& ids, const std::vector<std::vector<double>>& lps) {
    json r = {{"id", id}, {"n_tokens", lp.size() + 1}, {"logprob", lp}};
    if (!rank.empty()) r["rank"] = rank;
    if (!ids.empty()) {
        r["topk_ids"] = ids;
        r["topk_logprobs"] = lps;
    }
    return r;
}

std::string jsonl(const std::vector<json>& records) {
    std::string s;
    for (const auto& r : records) s += r.dump() + "\n";
    return s;
}

// Runs compare with --json output; returns the parsed object.
json compare_json(const std::string& a_text, const std::string& b_text, const std::string& tokenizer = "") {
    const std::string dir = test::temp_dir("compare");
    test::write_text(dir + "/a.jsonl", a_text);
    test::write_text(dir + "/b.jsonl", b_text);
    CompareOptions o;
    o.file_a = dir + "/a.jsonl";
    o.file_b = dir + "/b.jsonl";
    o.tokenizer_path = tokenizer;
    o.json = true;
    std::FILE* f = std::tmpfile();
    run_compare(o, f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
    return json::parse(s);
}

// The error message of a compare that must fail with InputError.
std::string compare_error(const std::string& a_text, const std::string& b_text,
                          const std::string& tokenizer = "") {
    try {
        compare_json(a_text, b_text, tokenizer);
    } catch (const InputError& e) {
        return e.what();
    }
    ADD_FAILURE() << "compare accepted the input";
    return "";
}

// Two sequences, five positions (see the comments for the hand computation).
std::vector<json> case_a() {
    return {replay_record("x", {-1.0, -2.0, -0.5}, {1, 3, 1}, {{5, 6}, {7, 8}, {9, 10}},
                          {{std::log(0.5), std::log(0.25)}, {-0.5, -2.0}, {-0.5, -1.5}}),
            replay_record("y", {-3.0, -1.0}, {2, 1}, {{1, 2}, {4, 1}}, {{-0.1, -3.0}, {-1.0, -1.2}})};
}
std::vector<json> case_b() {
    return {replay_record("x", {-1.25, -2.0, -0.25}, {1, 2, 1}, {{6, 5}, {7, 9}, {9, 10}},
                          {{std::log(0.5), std::log(0.25)}, {-0.5, -1.0}, {-0.25, -1.25}}),
            replay_record("y", {-2.0, -1.5}, {2, 1}, {{1, 3}, {5, 4}}, {{-0.2, -2.0}, {-0.9, -1.5}})};
}

TEST(Compare, ReplayVsReplayHandComputed) {
    const json r = compare_json(jsonl(case_a()), jsonl(case_b()));
    EXPECT_EQ(r.at("sequences"), 2);
    EXPECT_EQ(r.at("positions"), 5);
    // |d| = x: .25, 0, .25; y: 1, .5 -> sorted 0 .25 .25 .5 1: median .25, mean 2/5, p95 at 3.8 -> .5 + .8 *
    // .5.
    EXPECT_DOUBLE_EQ(r.at("median_abs_dlogprob").get<double>(), 0.25);
    EXPECT_DOUBLE_EQ(r.at("mean_abs_dlogprob").get<double>(), 0.4);
    EXPECT_DOUBLE_EQ(r.at("p95_abs_dlogprob").get<double>(), 0.9);
    EXPECT_DOUBLE_EQ(r.at("max_abs_dlogprob").get<double>(), 1.0);
    // top-1: x 5/6 no, 7/7 yes, 9/9 yes; y 1/1 yes, 4/5 no -> 3/5.
    EXPECT_DOUBLE_EQ(r.at("top1_agreement").get<double>(), 0.6);
    // ranks: x 1=1, 3!=2, 1=1; y 2=2, 1=1 -> 4/5.
    EXPECT_DOUBLE_EQ(r.at("rank_agreement").get<double>(), 0.8);
    // KL over shared ids: x0 {5,6}: p = (2/3, 1/3), q = (1/3, 2/3) -> KL = ln2 / 3; x2 {9,10}: both
    // shifted by the same amount -> 0; x1, y0, y1 share one id -> not counted.
    EXPECT_EQ(r.at("kl_positions"), 2);
    EXPECT_NEAR(r.at("kl_max").get<double>(), kLn2 / 3, 1e-12);
    EXPECT_NEAR(r.at("kl_mean").get<double>(), kLn2 / 6, 1e-12);
    EXPECT_NEAR(r.at("kl_median").get<double>(), kLn2 / 6, 1e-12);
    EXPECT_EQ(r.at("missing_in_b"), 0);
    EXPECT_EQ(r.at("missing_in_a"), 0);
    // Per sequence.
    const json& per = r.at("per_sequence");
    ASSERT_EQ(per.size(), 2u);
    EXPECT_EQ(per[0].at("id"), "x");
    EXPECT_DOUBLE_EQ(per[0].at("median_abs_dlogprob").get<double>(), 0.25);
    EXPECT_DOUBLE_EQ(per[0].at("mean_abs_dlogprob").get<double>(), 0.5 / 3);
    EXPECT_DOUBLE_EQ(per[0].at("max_abs_dlogprob").get<double>(), 0.25);
    EXPECT_NEAR(per[0].at("top1_agreement").get<double>(), 2.0 / 3, 1e-15);
    EXPECT_NEAR(per[0].at("rank_agreement").get<double>(), 2.0 / 3, 1e-15);
    EXPECT_EQ(per[1].at("id"), "y");
    EXPECT_DOUBLE_EQ(per[1].at("median_abs_dlogprob").get<double>(), 0.75);
    EXPECT_DOUBLE_EQ(per[1].at("p95_abs_dlogprob").get<double>(), 0.975);
    EXPECT_DOUBLE_EQ(per[1].at("top1_agreement").get<double>(), 0.5);
    EXPECT_EQ(per[1].at("kl_positions"), 0);
}

TEST(Compare, KlIsTakenAsAGivenB) {
    // KL is not symmetric: the report is KL(A || B) with A the first file.
    const json a = replay_record("s", {-1.0}, {}, {{1, 2}}, {{std::log(0.9), std::log(0.1)}});
    const json b = replay_record("s", {-1.0}, {}, {{1, 2}}, {{std::log(0.5), std::log(0.5)}});
    const json ab = compare_json(jsonl({a}), jsonl({b}));
    const json ba = compare_json(jsonl({b}), jsonl({a}));
    const double kl_ab = 0.9 * std::log(0.9 / 0.5) + 0.1 * std::log(0.1 / 0.5);
    const double kl_ba = 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1);
    EXPECT_NEAR(ab.at("kl_mean").get<double>(), kl_ab, 1e-12);
    EXPECT_NEAR(ba.at("kl_mean").get<double>(), kl_ba, 1e-12);
    EXPECT_EQ(ab.at("rank_agreement"), nullptr);  // no ranks: undefined, not 0
}

TEST(Compare, MissingIdsErrorRecordsAndTextReport) {
    auto a = case_a();
    a.push_back(replay_record("only-a", {-1.0}, {}, {}, {}));
    a.push_back(json{{"id", "bad"}, {"error", "in.jsonl:9: empty token sequence"}, {"line", 9}});
    auto b = case_b();
    b.push_back(replay_record("only-b", {-1.0}, {}, {}, {}));
    b.push_back(replay_record(7, {-1.0}, {}, {}, {}));
    const json r = compare_json(jsonl(a), jsonl(b));
    EXPECT_EQ(r.at("sequences"), 2);
    EXPECT_EQ(r.at("missing_in_b"), 1);  // only-a (the error record is skipped)
    EXPECT_EQ(r.at("missing_in_a"), 2);  // only-b, 7
    // The text report through the CLI.
    const std::string dir = test::temp_dir("compare-cli");
    test::write_text(dir + "/a.jsonl", jsonl(a));
    test::write_text(dir + "/b.jsonl", jsonl(b));
    std::string out;
    ASSERT_EQ(test::run_ds4replay("compare " + dir + "/a.jsonl " + dir + "/b.jsonl", &out), 0) << out;
    EXPECT_NE(out.find(": 2 sequences, 5 positions (1 id of A not in B) (2 ids of B not in A)"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("|d logprob|  median 0.2500  mean 0.4000  p95 0.9000  max 1.0000"), std::string::npos)
        << out;
    EXPECT_NE(out.find("top-1 agreement 60.0%  rank agreement 80.0%"), std::string::npos) << out;
    EXPECT_NE(out.find("KL(A||B) over shared top-k (2 positions)"), std::string::npos) << out;
    EXPECT_NE(out.find("\"x\""), std::string::npos) << out;
    ASSERT_EQ(test::run_ds4replay("compare --no-per-sequence " + dir + "/a.jsonl " + dir + "/b.jsonl", &out),
              0)
        << out;
    EXPECT_EQ(out.find("per sequence"), std::string::npos) << out;
}

// --- API records ------------------------------------------------------------------------------

class CompareApi : public ::testing::Test {
protected:
    void SetUp() override {
        tokenizer_ = test::tiny_model_dir() + "/tokenizer.json";
        Tokenizer tok = Tokenizer::load(tokenizer_);
        std::map<std::string, int> count;
        for (int64_t i = 0; i < tok.size(); ++i)
            if (tok.has_token(i)) ++count[tok.decode_one(i)];
        // Ids whose decoding is unique and plain ASCII, and one ambiguous text.
        for (int64_t i = 0; i < tok.size(); ++i) {
            if (!tok.has_token(i)) continue;
            const std::string t = tok.decode_one(i);
            if (count[t] == 1 && !t.empty() && static_cast<unsigned char>(t[0]) < 0x80 && ids_.size() < 6) {
                ids_.push_back(static_cast<int>(i));
                text_[static_cast<int>(i)] = t;
            }
            if (count[t] > 1 && ambiguous_.empty()) ambiguous_ = t;
        }
        ASSERT_EQ(ids_.size(), 6u);
        ASSERT_EQ(ambiguous_, "\xEF\xBF\xBD");  // U+FFFD: the byte tokens of partial UTF-8
    }

    // n_tokens 6: positions 0..4. Position 3 top-k: ids_[0] (p .5), ids_[1] (p .25); position 4: ids_[2].
    json replay() const {
        return replay_record(
            "r1", {-1.0, -2.0, -3.0, -0.5, -0.25}, {1, 2, 3, 1, 1},
            {{ids_[3], ids_[4]},
             {ids_[3], ids_[4]},
             {ids_[3], ids_[4]},
             {ids_[0], ids_[1]},
             {ids_[2], ids_[5]}},
            {{-0.1, -3.0}, {-0.1, -3.0}, {-0.1, -3.0}, {std::log(0.5), std::log(0.25)}, {-0.25, -2.0}});
    }
    // The two generated tokens: entry 0 <-> position 3, entry 1 <-> position 4.
    json content() const {
        return json::array({{{"token", text_.at(ids_[0])},
                             {"logprob", -0.75},
                             {"top_logprobs",
                              {{{"token", text_.at(ids_[0])}, {"logprob", std::log(0.25)}},
                               {{"token", "token_id:" + std::to_string(ids_[1])}, {"logprob", std::log(0.5)}},
                               {{"token", "not-a-token-text"}, {"logprob", -9999.0}}}}},
                            {{"token", "whatever"},
                             {"logprob", -0.25},
                             {"top_logprobs",
                              {{{"token_id", ids_[5]}, {"token", "?"}, {"logprob", -0.1}},
                               {{"token", ambiguous_}, {"logprob", -3.0}}}}}});
    }
    std::string tokenizer_;
    std::vector<int> ids_;
    std::map<int, std::string> text_;
    std::string ambiguous_;
};

void expect_api_stats(const json& r) {
    EXPECT_EQ(r.at("sequences"), 1);
    EXPECT_EQ(r.at("positions"), 2);
    // Aligned to the last positions: |-0.75 - -0.5| = .25 and |-0.25 - -0.25| = 0 (aligned to the
    // first ones they would be .25 and 1.75).
    EXPECT_DOUBLE_EQ(r.at("max_abs_dlogprob").get<double>(), 0.25);
    EXPECT_DOUBLE_EQ(r.at("mean_abs_dlogprob").get<double>(), 0.125);
    // Top-1: position 3 replay ids_[0], API ids_[1] (sorted by logprob) -> differ; position 4 replay
    // ids_[2], API ids_[5] -> differ.
    EXPECT_DOUBLE_EQ(r.at("top1_agreement").get<double>(), 0.0);
    EXPECT_EQ(r.at("rank_agreement"), nullptr);
    // KL at position 3 over {ids_[0], ids_[1]}: replay (2/3, 1/3), API (1/3, 2/3) -> ln2 / 3 either way.
    EXPECT_EQ(r.at("kl_positions"), 1);
    EXPECT_NEAR(r.at("kl_mean").get<double>(), kLn2 / 3, 1e-12);
    EXPECT_EQ(r.at("ambiguous_topk_entries"), 1);
    EXPECT_EQ(r.at("per_sequence").at(0).at("id"), "r1");
}

TEST_F(CompareApi, BareLogprobsRecordsAgainstTheReplay) {
    const json api = {{"id", "r1"}, {"logprobs", {{"content", content()}}}};
    expect_api_stats(compare_json(jsonl({replay()}), jsonl({api}), tokenizer_));
    expect_api_stats(compare_json(jsonl({api}), jsonl({replay()}), tokenizer_));
}

TEST_F(CompareApi, WholeChatCompletionResponse) {
    const json resp = {{"id", "r1"},
                       {"object", "chat.completion"},
                       {"model", "deepseek-v4.1-flash"},
                       {"choices",
                        {{{"index", 0},
                          {"message", {{"role", "assistant"}, {"content", "..."}}},
                          {"logprobs", {{"content", content()}}},
                          {"finish_reason", "stop"}}}}};
    expect_api_stats(compare_json(jsonl({replay()}), jsonl({resp}), tokenizer_));
}

TEST_F(CompareApi, SentinelAndTokenIdsNeedNoTokenizerButTextDoes) {
    // Only "token_id:N" strings / token_id fields and sentinels: no tokenizer needed.
    json c = content();
    c[0]["top_logprobs"][0]["token"] = "token_id:" + std::to_string(ids_[0]);
    c[1]["top_logprobs"].erase(1);
    const json api = {{"id", "r1"}, {"logprobs", {{"content", c}}}};
    const json r = compare_json(jsonl({replay()}), jsonl({api}));
    EXPECT_EQ(r.at("kl_positions"), 1);
    EXPECT_EQ(r.at("ambiguous_topk_entries"), 0);
    // With token text and no tokenizer: a clear error.
    const json api_text = {{"id", "r1"}, {"logprobs", {{"content", content()}}}};
    EXPECT_NE(compare_error(jsonl({replay()}), jsonl({api_text}))
                  .find("give --tokenizer tokenizer.json (or --model DIR)"),
              std::string::npos);
}

TEST_F(CompareApi, MalformedApiRecords) {
    auto api_with = [&](const json& c) {
        return jsonl({json{{"id", "r1"}, {"logprobs", {{"content", c}}}}});
    };
    const std::string rep = jsonl({replay()});
    json c = content();
    c[0]["top_logprobs"][1]["token"] = "token_id:12x";
    EXPECT_NE(compare_error(rep, api_with(c), tokenizer_).find("b.jsonl:1: bad token \"token_id:12x\""),
              std::string::npos);
    c = content();
    c[0]["top_logprobs"][0]["token"] = "no such token text";
    EXPECT_NE(compare_error(rep, api_with(c), tokenizer_)
                  .find("b.jsonl:1: token text \"no such token text\" is not the decoding"),
              std::string::npos);
    c = content();
    c[1]["top_logprobs"][0]["token_id"] = -4;
    EXPECT_NE(compare_error(rep, api_with(c), tokenizer_).find("\"token_id\" must be a non-negative integer"),
              std::string::npos);
    c = content();
    c[0].erase("logprob");
    EXPECT_NE(compare_error(rep, api_with(c), tokenizer_).find("b.jsonl:1: malformed record"),
              std::string::npos);
    // More generated tokens than the replay has positions.
    c = content();
    for (int i = 0; i < 4; ++i) c.push_back(c[1]);
    EXPECT_NE(compare_error(rep, api_with(c), tokenizer_)
                  .find("6 compared positions but the replay record has only 5"),
              std::string::npos);
    // Two API files.
    EXPECT_NE(compare_error(api_with(content()), api_with(content()), tokenizer_)
                  .find("both files hold API records"),
              std::string::npos);
}

// --- malformed files ----------------------------------------------------------------------------

TEST(Compare, MalformedFiles) {
    const std::string good = jsonl(case_a());
    EXPECT_NE(
        compare_error(good, good + "{\"id\": \"z\", \"logprob\": [1,\n").find("b.jsonl:3: not valid JSON"),
        std::string::npos);
    EXPECT_NE(compare_error("[1, 2]\n", good).find("a.jsonl:1: expected a JSON object with an \"id\""),
              std::string::npos);
    EXPECT_NE(compare_error(good, "\n{\"id\": \"x\", \"scores\": [1]}\n")
                  .find("b.jsonl:2: neither a ds4replay record"),
              std::string::npos);
    EXPECT_NE(compare_error(good, "{\"id\": \"x\", \"logprob\": [-1, \"a\", 0]}\n")
                  .find("b.jsonl:1: malformed record"),
              std::string::npos);
    EXPECT_NE(compare_error(good, "{\"id\": \"x\", \"logprob\": [-1, -1, -1], \"rank\": [1]}\n")
                  .find("b.jsonl:1: malformed record"),
              std::string::npos);
    EXPECT_NE(compare_error(good, jsonl({replay_record("x", {-1.0, -1.0}, {}, {}, {})}))
                  .find("id \"x\": 3 positions in"),
              std::string::npos);
    EXPECT_NE(compare_error(good, jsonl({replay_record("q", {-1.0}, {}, {}, {})})).find("no common ids"),
              std::string::npos);
}

TEST(Compare, CliExitCodes) {
    const std::string dir = test::temp_dir("compare-cli");
    test::write_text(dir + "/a.jsonl", jsonl(case_a()));
    test::write_text(dir + "/bad.jsonl", "{\"id\": \"x\", \"logprob\": [1,\n");
    std::string out;
    EXPECT_EQ(test::run_ds4replay("compare " + dir + "/a.jsonl " + dir + "/bad.jsonl", &out), 2);
    EXPECT_NE(out.find("ds4replay: error: " + dir + "/bad.jsonl:1: not valid JSON"), std::string::npos)
        << out;
    EXPECT_EQ(test::run_ds4replay("compare " + dir + "/a.jsonl " + dir + "/missing.jsonl", &out), 2);
    EXPECT_NE(out.find(dir + "/missing.jsonl: cannot open (No such file or directory)"), std::string::npos)
        << out;
    EXPECT_EQ(test::run_ds4replay("compare " + dir + "/a.jsonl " + dir, &out), 2);
    EXPECT_NE(out.find(dir + ": is a directory"), std::string::npos) << out;
    EXPECT_EQ(test::run_ds4replay("compare " + dir + "/a.jsonl", &out), 2);  // usage
    // --json on the CLI is the same object as the API's.
    ASSERT_EQ(test::run_ds4replay("compare --json " + dir + "/a.jsonl " + dir + "/a.jsonl", &out), 0);
    const json r = json::parse(out);
    EXPECT_EQ(r.at("max_abs_dlogprob"), 0.0);
    EXPECT_EQ(r.at("top1_agreement"), 1.0);
    EXPECT_EQ(r.at("kl_max"), 0.0);
}

}  // namespace
}  // namespace ds4r
