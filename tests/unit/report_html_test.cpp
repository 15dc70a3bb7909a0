// `ds4replay report --html`: escaping, the page's structure (self-contained, one span per token, the
// per-token data for the tooltip), and the whole command on the golden checkpoint's tokenizer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "cli_run_util.h"
#include "ds4r/report.h"
#include "ds4r/tokenizer.h"

namespace ds4r {
namespace {

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
    return n;
}

ReportRecord parse(const std::string& line) {
    ReportRecord r;
    EXPECT_TRUE(parse_report_record(line, "r.jsonl", 1, &r));
    return r;
}

// The JSON text of <script type="application/json" id="ds4r-data">.
nlohmann::json page_data(const std::string& html) {
    const std::string open = "<script type=\"application/json\" id=\"ds4r-data\">";
    const size_t b = html.find(open);
    EXPECT_NE(b, std::string::npos);
    const size_t e = html.find("</script>", b);
    return nlohmann::json::parse(html.substr(b + open.size(), e - b - open.size()));
}

TEST(ReportHtml, EscapeAllFiveCharacters) {
    EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
    EXPECT_EQ(html_escape("plain \xe2\x9f\xa8text\xe2\x9f\xa9"), "plain \xe2\x9f\xa8text\xe2\x9f\xa9");
    EXPECT_EQ(json_for_script(R"({"t": "</script><b>&"})"),
              R"({"t": "\u003c/script\u003e\u003cb\u003e\u0026"})");
    // What json_for_script returns parses back to the same value.
    EXPECT_EQ(nlohmann::json::parse(json_for_script(R"({"t": "</script>&"})"))["t"], "</script>&");
}

TEST(ReportHtml, HostileTextIsEscapedEverywhere) {
    ReportFile f;
    f.records.push_back(parse(R"({"id": "<img src=x onerror=alert(1)>", "n_tokens": 3, "tokens": [1, 2, 3],
        "token_text": ["<script>alert(1)</script>", "&amp;", "\"'"], "logprob": [-1, -2], "rank": [1, 3],
        "entropy": [1, 1], "topk_ids": [[2, 5], [9, 3]], "topk_logprobs": [[-1, -2], [-0.1, -2]]})"));
    const std::string h = render_html_report(f, {}, nullptr, "dir/<r>.jsonl");
    EXPECT_EQ(h.find("<img src=x"), std::string::npos);
    EXPECT_EQ(h.find("<script>alert"), std::string::npos);
    EXPECT_NE(h.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
    EXPECT_NE(h.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
    EXPECT_NE(h.find("&amp;amp;"), std::string::npos);
    EXPECT_NE(h.find("dir/&lt;r&gt;.jsonl"), std::string::npos);
    // Exactly two script elements (the data and the code); the data holds no raw '<'.
    EXPECT_EQ(count(h, "<script"), 2u);
    EXPECT_EQ(count(h, "</script>"), 2u);
    nlohmann::json d = page_data(h);
    EXPECT_EQ(d[0]["id"], "<img src=x onerror=alert(1)>");
}

TEST(ReportHtml, StructureSelfContained) {
    ReportFile f;
    f.records.push_back(
        parse(R"({"id": "a", "n_tokens": 4, "tokens": [1, 2, 3, 4], "token_text": ["x", "y", "z", "w"],
        "logprob": [-0.1, -5, -13], "rank": [1, 2, 40], "entropy": [0.5, 2, 3],
        "topk_ids": [[2, 7], [8, 3], [1, 2]], "topk_logprobs": [[-0.1, -3], [-1, -5], [-1, -2]]})"));
    f.records.push_back(parse(R"({"id": "b", "n_tokens": 2, "logprob": [-2]})"));
    std::vector<PairDiff> pairs{compare_pair(f.records[0], f.records[1])};
    const std::string h = render_html_report(f, pairs, nullptr, "r.jsonl");
    EXPECT_EQ(h.rfind("<!DOCTYPE html>\n", 0), 0u);
    EXPECT_LT(h.find(kReportHtmlMarker), 256u);
    // No external resources: no src= / href= other than in-page anchors, no url(), no @import.
    EXPECT_EQ(count(h, " src="), 0u);
    std::regex href(R"RE(href="([^"]*)")RE");
    for (auto it = std::sregex_iterator(h.begin(), h.end(), href); it != std::sregex_iterator(); ++it)
        EXPECT_EQ((*it)[1].str().rfind("#seq-", 0), 0u) << (*it)[0];
    EXPECT_EQ(h.find("url("), std::string::npos);
    EXPECT_EQ(h.find("@import"), std::string::npos);
    EXPECT_EQ(h.find("http"), std::string::npos);
    // One table row per sequence plus the totals; the histogram; the pair box; one span per token.
    EXPECT_EQ(count(h, "<a href=\"#seq-"), 2u + 2u);  // table + pair heading
    EXPECT_NE(h.find("<tfoot><tr><td>total</td>"), std::string::npos);
    EXPECT_NE(h.find("<svg class=\"hist\""), std::string::npos);
    EXPECT_EQ(count(h, "<rect class=\"bar\""), 40u);
    EXPECT_NE(h.find("class=\"pairbox\""), std::string::npos);
    EXPECT_EQ(count(h, "<span class=\"t"), 4u + 2u);
    EXPECT_EQ(count(h, "<span class=\"t first"), 2u);
    // Record b has no tokens: its positions are shown, and the page says why.
    EXPECT_NE(h.find(">#1</span>"), std::string::npos);
    EXPECT_NE(h.find("Some records carry no token ids"), std::string::npos);
    // Per-token data for the tooltip: logprob, rank, entropy and [id, text, logprob] alternatives.
    nlohmann::json d = page_data(h);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0]["lp"][2], -13);
    EXPECT_EQ(d[0]["rank"][2], 40);
    EXPECT_EQ(d[0]["alt"][1][0][0], 8);
    EXPECT_EQ(d[0]["alt"][1][0][2], -1);
    EXPECT_EQ(d[1]["alt"].size(), 0u);
    // The script marks success on <html> (the browser check reads it).
    EXPECT_NE(h.find("data-ds4r-ok"), std::string::npos);
}

TEST(ReportHtml, TextStopsAtMaxTextTokens) {
    ReportFile f;
    for (int i = 0; i < 3; ++i)
        f.records.push_back(parse(R"({"id": "s", "n_tokens": 4, "logprob": [-1, -2, -3]})"));
    // 6 tokens allowed: the first sequence (4) is shown, the next would pass 6, so it and the third are
    // left out of the text (still in the table).
    const std::string h = render_html_report(f, {}, nullptr, "r.jsonl", 6);
    EXPECT_EQ(count(h, "<span class=\"t"), 4u);
    EXPECT_EQ(count(h, "<tr><td data-v="), 3u);
    EXPECT_NE(h.find("The text of 2 more sequences is left out"), std::string::npos);
    nlohmann::json d = page_data(h);
    ASSERT_EQ(d.size(), 3u);
    EXPECT_TRUE(d[1].is_null());
    // The first sequence is shown even when it alone is longer than the limit.
    EXPECT_EQ(count(render_html_report(f, {}, nullptr, "r.jsonl", 2), "<span class=\"t"), 4u);
}

TEST(ReportHtml, NoTokensAnywhereSaysSo) {
    ReportFile f;
    f.records.push_back(parse(R"({"id": "a", "n_tokens": 3, "logprob": [-1, -2]})"));
    const std::string h = render_html_report(f, {}, nullptr, "r.jsonl");
    EXPECT_NE(h.find("The records carry no token ids"), std::string::npos);
    EXPECT_NE(h.find(">#2</span>"), std::string::npos);
}

TEST(ReportHtml, TokenizerDecodesTokensAndAlternatives) {
    const Tokenizer tok = Tokenizer::load(test::golden_model_dir() + "/tokenizer.json");
    ReportFile f;
    f.records.push_back(parse(R"({"id": "a", "n_tokens": 3, "tokens": [0, 300, 301], "logprob": [-1, -2],
        "topk_ids": [[300, 508], [1, 301]], "topk_logprobs": [[-1, -2], [-1, -2]]})"));
    const std::string h = render_html_report(f, {}, &tok, "r.jsonl");
    EXPECT_NE(h.find(html_escape(tok.decode_one(300))), std::string::npos);
    nlohmann::json d = page_data(h);
    EXPECT_EQ(d[0]["alt"][0][0][1], tok.decode_one(300));
    EXPECT_EQ(d[0]["alt"][0][1][1], tok.decode_one(508));
    // Token 0 (an added token) is marked special.
    EXPECT_NE(h.find("<span class=\"t first sp\" data-p=\"0\">" + html_escape(tok.decode_one(0))),
              std::string::npos)
        << h.substr(h.find("<div class=\"toks"), 400);
}

// The command end to end on the golden results file, with the golden tokenizer.
TEST(ReportCli, HtmlOfGoldenResults) {
    const std::string dir = test::temp_dir("report_html");
    // The golden expected results carry no tokens: add the input's tokens (what --echo-tokens writes).
    std::ifstream tokens(test::data_dir() + "/tiny-a/tokens.jsonl"),
        results(test::data_dir() + "/tiny-a/expected.jsonl");
    std::string tl, rl, merged;
    int n = 0;
    while (std::getline(tokens, tl) && std::getline(results, rl)) {
        auto r = nlohmann::json::parse(rl);
        r["tokens"] = nlohmann::json::parse(tl)["tokens"];
        merged += r.dump() + "\n";
        ++n;
    }
    ASSERT_GT(n, 3);
    test::write_text(dir + "/r.jsonl", merged);
    std::string out;
    ASSERT_EQ(test::run_ds4replay("report " + dir + "/r.jsonl --model " + test::golden_model_dir() +
                                      " --html " + dir + "/r.html --pairs seq02,seq03",
                                  &out),
              0)
        << out;
    EXPECT_NE(out.find("seq04"), std::string::npos) << out;
    EXPECT_NE(out.find("pair seq02 vs seq03"), std::string::npos) << out;
    const std::string h = test::slurp(dir + "/r.html");
    EXPECT_EQ(count(h, "<tr><td data-v="), static_cast<size_t>(n));
    EXPECT_EQ(page_data(h).size(), static_cast<size_t>(n));
}

}  // namespace
}  // namespace ds4r
