// `ds4replay report`: record parsing, per-sequence statistics, paired differences, the text summary and
// the command's error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/report.h"

namespace ds4r {
namespace {

ReportRecord parse(const std::string& line) {
    ReportRecord r;
    EXPECT_TRUE(parse_report_record(line, "r.jsonl", 7, &r));
    return r;
}

// Expects an InputError whose message starts with "r.jsonl:7:" and contains `what`.
void expect_bad(const std::string& line, const std::string& what) {
    ReportRecord r;
    try {
        parse_report_record(line, "r.jsonl", 7, &r);
        ADD_FAILURE() << "accepted: " << line;
    } catch (const InputError& e) {
        const std::string m = e.what();
        EXPECT_EQ(m.rfind("r.jsonl:7: ", 0), 0u) << m;
        EXPECT_NE(m.find(what), std::string::npos) << m;
    }
}

TEST(ReportStats, HandComputedSequence) {
    // logprobs -1, -2, -3 (mean -2), entropies 1.5, 2.5, 0.5 (mean 1.5), ranks 1, 4, 1.
    ReportRecord r = parse(
        R"({"id": "s", "n_tokens": 4, "logprob": [-1, -2, -3], "entropy": [1.5, 2.5, 0.5], "rank": [1, 4, 1]})");
    SequenceStats s = sequence_stats(r);
    EXPECT_EQ(s.n_tokens, 4);
    EXPECT_EQ(s.positions, 3);
    EXPECT_DOUBLE_EQ(s.sum_logprob, -6.0);
    EXPECT_DOUBLE_EQ(s.mean_logprob, -2.0);
    EXPECT_DOUBLE_EQ(s.perplexity, std::exp(2.0));
    EXPECT_DOUBLE_EQ(s.mean_entropy, 1.5);
    EXPECT_DOUBLE_EQ(s.typicality_gap, -0.5);
    EXPECT_DOUBLE_EQ(s.top1_agreement, 2.0 / 3.0);
}

TEST(ReportStats, TotalsPoolPositionsNotSequences) {
    std::vector<ReportRecord> rs{
        parse(R"({"id": 1, "n_tokens": 2, "logprob": [-4], "rank": [2], "entropy": [1]})"),
        parse(
            R"({"id": 2, "n_tokens": 4, "logprob": [-1, -1, -1], "rank": [1, 1, 1], "entropy": [1, 1, 1]})"),
        parse(R"({"id": 3, "n_tokens": 1, "logprob": []})"),
    };
    EXPECT_EQ(rs[0].id, "1");  // non-string ids as their JSON text
    SequenceStats t = total_stats(rs);
    EXPECT_EQ(t.n_tokens, 7);
    EXPECT_EQ(t.positions, 4);
    EXPECT_DOUBLE_EQ(t.sum_logprob, -7.0);
    EXPECT_DOUBLE_EQ(t.mean_logprob, -7.0 / 4);  // not the mean of the sequences' means (-2.5)
    EXPECT_DOUBLE_EQ(t.top1_agreement, 3.0 / 4);
    // A one-token sequence: nothing scored, means undefined.
    SequenceStats one = sequence_stats(rs[2]);
    EXPECT_EQ(one.positions, 0);
    EXPECT_EQ(one.sum_logprob, 0.0);
    EXPECT_TRUE(std::isnan(one.mean_logprob));
    EXPECT_TRUE(std::isnan(one.perplexity));
    EXPECT_TRUE(std::isnan(one.top1_agreement));
}

TEST(ReportStats, OptionalFieldsAndTokens) {
    ReportRecord r = parse(R"({"id": "x", "n_tokens": 3, "logprob": [-1, -2], "tokens": [5, 6, 7],
        "token_text": ["a", "b", "<c>"], "topk_ids": [[6, 1], [2, 7]], "topk_logprobs": [[-1, -3], [-0.5, -2]]})");
    EXPECT_EQ(r.tokens, (std::vector<int64_t>{5, 6, 7}));
    EXPECT_EQ(r.token_text.size(), 3u);
    ASSERT_EQ(r.topk_ids.size(), 2u);
    EXPECT_EQ(r.topk_ids[1], (std::vector<int64_t>{2, 7}));
    EXPECT_DOUBLE_EQ(r.topk_logprobs[1][0], -0.5);
    SequenceStats s = sequence_stats(r);
    EXPECT_TRUE(std::isnan(s.mean_entropy));
    EXPECT_TRUE(std::isnan(s.typicality_gap));
    EXPECT_TRUE(std::isnan(s.top1_agreement));
    EXPECT_EQ(token_texts(r, nullptr)[2], "<c>");
    // input_ids is the tokens alias; without a tokenizer or token_text the texts are empty.
    ReportRecord q = parse(R"({"id": "y", "n_tokens": 2, "logprob": [-1], "input_ids": [3, 4]})");
    EXPECT_EQ(q.tokens, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(token_texts(q, nullptr), (std::vector<std::string>{"", ""}));
}

TEST(ReportStats, ErrorRecordsAreSkipped) {
    ReportRecord r;
    EXPECT_FALSE(
        parse_report_record(R"({"id": "bad", "error": "token out of range", "line": 3})", "r.jsonl", 7, &r));
}

TEST(ReportStats, MalformedRecordsNameFileAndLine) {
    expect_bad("{\"id\": 1, \"logprob\": [", "not valid JSON");
    expect_bad("[1, 2, 3]", "expected a JSON object");
    expect_bad(R"({"logprob": [-1]})", "without an \"id\"");
    expect_bad(R"({"id": 1, "tokens": [1, 2]})", "without \"logprob\"");
    expect_bad(R"({"id": 1, "n_tokens": 3, "logprob": [-1]})", "\"logprob\" has 1 entries, expected 2");
    expect_bad(R"({"id": 1, "n_tokens": 0, "logprob": []})", "\"n_tokens\" must be an integer >= 1");
    expect_bad(R"({"id": 1, "n_tokens": 2, "logprob": ["x"]})", "\"logprob\"[0] must be a number");
    expect_bad(R"({"id": 1, "n_tokens": 2, "logprob": [-1], "rank": [1.5]})",
               "\"rank\"[0] must be an integer");
    expect_bad(R"({"id": 1, "n_tokens": 2, "logprob": [-1], "tokens": [1]})",
               "\"tokens\" must be an array of n_tokens");
    expect_bad(R"({"id": 1, "n_tokens": 2, "logprob": [-1], "token_text": ["a", 2]})",
               "\"token_text\"[1] must be a string");
    expect_bad(R"({"id": 1, "n_tokens": 2, "logprob": [-1], "topk_ids": [[1, 2]], "topk_logprobs": [[-1]]})",
               "must be arrays of one length");
}

// Two records with tokens: A = [1 2 3 4 5 6], B = [1 2 9 9 5 6] (the middle changed).
TEST(ReportPairs, AlignsOnCommonPrefixAndSuffix) {
    ReportRecord a = parse(R"({"id": "A", "n_tokens": 6, "tokens": [1, 2, 3, 4, 5, 6],
        "logprob": [-1, -2, -3, -4, -5]})");
    ReportRecord b = parse(R"({"id": "B", "n_tokens": 7, "tokens": [1, 2, 9, 9, 9, 5, 6],
        "logprob": [-1, -7, -7, -7, -4, -6]})");
    PairDiff d = compare_pair(a, b);
    EXPECT_TRUE(d.aligned_on_tokens);
    EXPECT_EQ(d.prefix_tokens, 2);
    EXPECT_EQ(d.suffix_tokens, 2);
    EXPECT_DOUBLE_EQ(d.sum_a, -15);
    EXPECT_DOUBLE_EQ(d.sum_b, -32);
    EXPECT_DOUBLE_EQ(d.delta, 17);
    // Prefix: token 1 scored by logprob[0] on both sides: -1 - -1 = 0.
    EXPECT_DOUBLE_EQ(d.delta_prefix, 0);
    // Middle: A's tokens 2, 3 (-2 - 3 = -5) against B's tokens 2, 3, 4 (-7 * 3 = -21): +16.
    EXPECT_EQ(d.middle_a, 2);
    EXPECT_EQ(d.middle_b, 3);
    EXPECT_DOUBLE_EQ(d.delta_middle, 16);
    // Suffix: A's tokens 4, 5 (-4, -5) against B's tokens 5, 6 (-4, -6): 0 + 1.
    EXPECT_DOUBLE_EQ(d.delta_suffix, 1);
    EXPECT_DOUBLE_EQ(d.delta_prefix + d.delta_middle + d.delta_suffix, d.delta);
    ASSERT_EQ(d.aligned.size(), 3u);
    EXPECT_EQ(d.aligned[2].token_a, 5);
    EXPECT_EQ(d.aligned[2].token_b, 6);
    EXPECT_DOUBLE_EQ(d.aligned[2].diff, 1);
}

TEST(ReportPairs, EdgeCasesAddUp) {
    // Identical, A a prefix of B, disjoint first token, one side entirely the other's suffix.
    const char* cases[][2] = {
        {R"({"id": "A", "n_tokens": 3, "tokens": [1, 2, 3], "logprob": [-1, -2]})",
         R"({"id": "B", "n_tokens": 3, "tokens": [1, 2, 3], "logprob": [-1, -2]})"},
        {R"({"id": "A", "n_tokens": 2, "tokens": [1, 2], "logprob": [-1]})",
         R"({"id": "B", "n_tokens": 4, "tokens": [1, 2, 3, 4], "logprob": [-1.5, -2, -3]})"},
        {R"({"id": "A", "n_tokens": 3, "tokens": [7, 2, 3], "logprob": [-1, -2]})",
         R"({"id": "B", "n_tokens": 3, "tokens": [8, 2, 3], "logprob": [-4, -8]})"},
        {R"({"id": "A", "n_tokens": 2, "tokens": [2, 3], "logprob": [-1]})",
         R"({"id": "B", "n_tokens": 3, "tokens": [1, 2, 3], "logprob": [-4, -8]})"},
        {R"({"id": "A", "n_tokens": 1, "tokens": [5], "logprob": []})",
         R"({"id": "B", "n_tokens": 2, "tokens": [6, 5], "logprob": [-4]})"},
    };
    for (auto& c : cases) {
        PairDiff d = compare_pair(parse(c[0]), parse(c[1]));
        EXPECT_NEAR(d.delta_prefix + d.delta_middle + d.delta_suffix, d.delta, 1e-12)
            << c[0] << " / " << c[1];
    }
    PairDiff same = compare_pair(parse(cases[0][0]), parse(cases[0][1]));
    EXPECT_EQ(same.prefix_tokens, 3);
    EXPECT_EQ(same.delta, 0);
    PairDiff disjoint = compare_pair(parse(cases[2][0]), parse(cases[2][1]));
    EXPECT_EQ(disjoint.prefix_tokens, 0);
    EXPECT_EQ(disjoint.suffix_tokens, 2);
    EXPECT_DOUBLE_EQ(disjoint.delta_suffix, 3 + 6);
}

TEST(ReportPairs, TokenTextAlignsWithoutIds) {
    // encode --with-text | score: records carry "token_text" but no ids.
    PairDiff d = compare_pair(
        parse(R"({"id": "A", "n_tokens": 4, "token_text": ["<s>", "a", "b", "."], "logprob": [-1, -2, -3]})"),
        parse(
            R"({"id": "B", "n_tokens": 4, "token_text": ["<s>", "a", "c", "."], "logprob": [-1, -5, -4]})"));
    EXPECT_TRUE(d.aligned_on_tokens);
    EXPECT_EQ(d.prefix_tokens, 2);
    EXPECT_EQ(d.suffix_tokens, 1);
    EXPECT_DOUBLE_EQ(d.delta_middle, 3);
    EXPECT_DOUBLE_EQ(d.delta_suffix, 1);
}

TEST(ReportPairs, WithoutTokensPositionsOneForOne) {
    PairDiff d = compare_pair(parse(R"({"id": "A", "n_tokens": 3, "logprob": [-1, -2]})"),
                              parse(R"({"id": "B", "n_tokens": 4, "logprob": [-2, -2, -5]})"));
    EXPECT_FALSE(d.aligned_on_tokens);
    EXPECT_DOUBLE_EQ(d.delta_suffix, 1);
    EXPECT_DOUBLE_EQ(d.delta_middle, 5);
    EXPECT_DOUBLE_EQ(d.delta, 6);
    EXPECT_EQ(d.aligned.size(), 2u);
}

std::string text_report(const ReportFile& f, const std::vector<PairDiff>& pairs) {
    std::FILE* tmp = std::tmpfile();
    write_text_report(f, pairs, "r.jsonl", tmp);
    std::string s(static_cast<size_t>(std::ftell(tmp)), '\0');
    std::rewind(tmp);
    EXPECT_EQ(std::fread(s.data(), 1, s.size(), tmp), s.size());
    std::fclose(tmp);
    return s;
}

TEST(ReportText, TableRowsTotalsAndPairs) {
    ReportFile f;
    f.records.push_back(parse(
        R"({"id": "seq-a", "n_tokens": 3, "tokens": [1, 2, 3], "logprob": [-1, -3], "entropy": [1, 2], "rank": [1, 2]})"));
    f.records.push_back(parse(R"({"id": "seq-b", "n_tokens": 3, "tokens": [1, 2, 4], "logprob": [-1, -5]})"));
    f.error_records = 1;
    const std::string s = text_report(f, {compare_pair(f.records[0], f.records[1])});
    EXPECT_NE(s.find("r.jsonl: 2 sequences, 6 tokens, 4 scored positions (1 error records skipped)"),
              std::string::npos)
        << s;
    // seq-a: sum -4, mean -2, perplexity e^2 = 7.39, entropy 1.5, gap -0.5, top-1 50%.
    EXPECT_NE(s.find("seq-a"), std::string::npos);
    EXPECT_NE(s.find("-4.000"), std::string::npos) << s;
    EXPECT_NE(s.find("7.39"), std::string::npos) << s;
    EXPECT_NE(s.find("-0.5000"), std::string::npos) << s;
    EXPECT_NE(s.find("50.0%"), std::string::npos) << s;
    EXPECT_NE(s.find("total"), std::string::npos);
    EXPECT_NE(s.find("pair seq-a vs seq-b: sum logprob -4.0000 vs -6.0000, difference +2.0000"),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("common prefix 2 tokens: +0.0000; changed middle (1 vs 1 scored tokens): +2.0000"),
              std::string::npos)
        << s;
}

TEST(ReportCli, BadLineExitsTwoNamingFileAndLine) {
    const std::string dir = test::temp_dir("report_cli");
    const std::string path = dir + "/r.jsonl";
    test::write_text(path,
                     "{\"id\": 1, \"n_tokens\": 2, \"logprob\": [-1]}\n\n{\"id\": 2, \"logprob\": [-1,\n");
    std::string out;
    EXPECT_EQ(test::run_ds4replay("report " + test::shell_quote(path), &out), 2) << out;
    EXPECT_NE(out.find(path + ":3: not valid JSON"), std::string::npos) << out;

    test::write_text(path, "{\"id\": 1, \"n_tokens\": 2, \"logprob\": [-1]}\n");
    EXPECT_EQ(test::run_ds4replay("report " + test::shell_quote(path) + " --pairs 1,9", &out), 2) << out;
    EXPECT_NE(out.find("no record with id \"9\""), std::string::npos) << out;
    EXPECT_EQ(test::run_ds4replay("report " + test::shell_quote(path) + " --pairs 1", &out), 2) << out;
    EXPECT_EQ(test::run_ds4replay("report " + test::shell_quote(dir + "/missing.jsonl"), &out), 2) << out;
    EXPECT_NE(out.find("cannot open results file"), std::string::npos) << out;

    // --html never replaces a file it did not write.
    const std::string mine = dir + "/notes.html";
    test::write_text(mine, "<html>my notes</html>");
    EXPECT_EQ(
        test::run_ds4replay("report " + test::shell_quote(path) + " --html " + test::shell_quote(mine), &out),
        2)
        << out;
    EXPECT_EQ(test::slurp(mine), "<html>my notes</html>");
    // A report it wrote is replaced on the next run.
    const std::string rep = dir + "/r.html";
    ASSERT_EQ(
        test::run_ds4replay("report " + test::shell_quote(path) + " --html " + test::shell_quote(rep), &out),
        0)
        << out;
    EXPECT_EQ(
        test::run_ds4replay("report " + test::shell_quote(path) + " --html " + test::shell_quote(rep), &out),
        0)
        << out;
    EXPECT_EQ(test::run_ds4replay(
                  "report " + test::shell_quote(path) + " --html " + test::shell_quote(mine) + " --overwrite",
                  &out),
              0)
        << out;
    EXPECT_NE(test::slurp(mine).find(kReportHtmlMarker), std::string::npos);
}

}  // namespace
}  // namespace ds4r
