// InputReader (include/ds4r/input.h): the tokens.jsonl grammar and every rejection, each naming its
// line; the reader goes on after a bad line; byte accounting for the progress ETA.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/input.h"
#include "ds4r/output.h"

namespace ds4r {
namespace {

constexpr int64_t kVocab = 512;

// One line's outcome: a record, or the error message and the id salvaged for --skip-bad.
struct Outcome {
    bool ok = false;
    InputRecord rec;
    std::string error, bad_id;
    int64_t line = 0;
};

std::vector<Outcome> read_all(InputReader& r) {
    std::vector<Outcome> out;
    for (;;) {
        Outcome o;
        try {
            if (!r.next(o.rec, &o.bad_id)) break;
            o.ok = true;
        } catch (const InputError& e) {
            o.error = e.what();
        }
        o.line = r.line();
        out.push_back(std::move(o));
    }
    return out;
}

std::vector<Outcome> read_text(const std::string& text, int64_t max_len = 64) {
    auto r = InputReader::from_string(text, "in.jsonl", kVocab, max_len);
    return read_all(r);
}

// A single bad line between two good ones: the error names line 2 and says `what`; lines 1 and 3
// are read normally around it.
void expect_bad_middle_line(const std::string& bad, const std::string& what,
                            const std::string& salvaged_id = "") {
    auto o =
        read_text("{\"id\": \"a\", \"tokens\": [1, 2]}\n" + bad + "\n{\"id\": \"c\", \"tokens\": [3]}\n");
    ASSERT_EQ(o.size(), 3u) << bad;
    EXPECT_TRUE(o[0].ok);
    EXPECT_FALSE(o[1].ok) << bad;
    EXPECT_EQ(o[1].line, 2);
    EXPECT_EQ(o[1].error.rfind("in.jsonl:2: ", 0), 0u) << o[1].error;
    EXPECT_NE(o[1].error.find(what), std::string::npos)
        << "message: " << o[1].error << "\nexpected: " << what;
    EXPECT_EQ(o[1].bad_id, salvaged_id) << bad;
    ASSERT_TRUE(o[2].ok) << o[2].error;
    EXPECT_EQ(o[2].rec.id_json, "\"c\"");
    EXPECT_EQ(o[2].rec.line, 3);
}

TEST(InputReader, ObjectArrayAliasExtrasAndBlankLines) {
    auto o = read_text(
        "{\"id\": \"a\", \"tokens\": [0, 511], \"meta\": {\"k\": [1, \"x\"]}, \"n_tokens\": 99, \"error\": "
        "1}\n"
        "\n  \t\n"
        "[5, 6, 7]\n"
        "{\"id\": 17, \"input_ids\": [9]}\n"
        "{\"tokens\": [4]}\n");
    ASSERT_EQ(o.size(), 4u);
    for (const auto& x : o) ASSERT_TRUE(x.ok) << x.error;
    EXPECT_EQ(o[0].rec.id_json, "\"a\"");
    EXPECT_EQ(o[0].rec.tokens, (std::vector<int32_t>{0, 511}));
    EXPECT_EQ(o[0].rec.line, 1);
    // Extra fields are carried; names the output uses (n_tokens, error, ...) are not.
    EXPECT_EQ(nlohmann::json::parse(o[0].rec.extra_json),
              nlohmann::json::parse("{\"meta\": {\"k\": [1, \"x\"]}}"));
    EXPECT_EQ(o[1].rec.id_json, "4");  // bare array: its line number (blank lines count)
    EXPECT_EQ(o[1].rec.tokens, (std::vector<int32_t>{5, 6, 7}));
    EXPECT_EQ(o[1].rec.extra_json, "{}");
    EXPECT_EQ(o[2].rec.id_json, "17");
    EXPECT_EQ(o[2].rec.tokens, (std::vector<int32_t>{9}));
    EXPECT_EQ(o[3].rec.id_json, "6");  // object without id: its line number
}

TEST(InputReader, LastLineWithoutNewlineIsAcceptedWhenComplete) {
    auto o = read_text("{\"id\": 1, \"tokens\": [1]}\n{\"id\": 2, \"tokens\": [2, 3]}");
    ASSERT_EQ(o.size(), 2u);
    ASSERT_TRUE(o[1].ok) << o[1].error;
    EXPECT_EQ(o[1].rec.tokens, (std::vector<int32_t>{2, 3}));
}

TEST(InputReader, MalformedJson) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1, 2", "not valid JSON");
}

TEST(InputReader, MissingTokens) {
    expect_bad_middle_line("{\"id\": \"b\", \"text\": \"hi\"}", "no \"tokens\" array", "\"b\"");
}

TEST(InputReader, TokensNotAnArray) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": \"1 2 3\"}",
                           "\"tokens\" must be an array of integers", "\"b\"");
    expect_bad_middle_line("{\"id\": \"b\", \"input_ids\": 5}", "\"input_ids\" must be an array of integers",
                           "\"b\"");
}

TEST(InputReader, NonIntegerToken) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1, 2.5]}", "token 1 is 2.5, expected an integer id",
                           "\"b\"");
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1.0]}", "token 0 is 1.0, expected an integer id",
                           "\"b\"");
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [\"7\"]}", "token 0 is \"7\", expected an integer id",
                           "\"b\"");
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [true]}", "token 0 is true, expected an integer id",
                           "\"b\"");
}

TEST(InputReader, NegativeToken) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [3, -1]}",
                           "token 1 is -1, outside the vocabulary [0, 512)", "\"b\"");
}

TEST(InputReader, OutOfVocabularyToken) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [512]}",
                           "token 0 is 512, outside the vocabulary [0, 512)", "\"b\"");
    expect_bad_middle_line("[18446744073709551615]",
                           "token 0 is 18446744073709551615, outside the vocabulary", "2");
}

TEST(InputReader, EmptySequence) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": []}", "empty token sequence", "\"b\"");
    expect_bad_middle_line("[]", "empty token sequence", "2");
}

TEST(InputReader, OverLongSequence) {
    std::string toks;
    for (int i = 0; i < 65; ++i) toks += (i ? ", " : "") + std::to_string(i);
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [" + toks + "]}",
                           "sequence of 65 tokens is longer than the maximum 64 (--max-seq-len)", "\"b\"");
    // Exactly the maximum is fine.
    auto o = read_text("{\"id\": 1, \"tokens\": [1, 2, 3]}\n", 3);
    ASSERT_TRUE(o.at(0).ok) << o[0].error;
}

TEST(InputReader, HugeNumbers) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1e400]}", "number overflow");
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [99999999999999999999999]}",
                           "token 0 is a number too large for a token id", "\"b\"");
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [-99999999999999999999999]}",
                           "token 0 is a number too large for a token id", "\"b\"");
}

TEST(InputReader, BadIdType) {
    expect_bad_middle_line("{\"id\": 1.5, \"tokens\": [1]}",
                           "\"id\" must be a string or an integer, found 1.5");
    expect_bad_middle_line("{\"id\": [1], \"tokens\": [1]}", "\"id\" must be a string or an integer");
}

TEST(InputReader, NotAnObjectOrArray) {
    expect_bad_middle_line("42", "expected a JSON object");
    expect_bad_middle_line("\"tokens\"", "expected a JSON object");
    expect_bad_middle_line("null", "expected a JSON object");
}

TEST(InputReader, TokensAndInputIdsTogether) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1], \"input_ids\": [1]}",
                           "has both \"tokens\" and \"input_ids\"", "\"b\"");
}

TEST(InputReader, ByteOrderMark) {
    auto o = read_text("\xEF\xBB\xBF{\"id\": \"a\", \"tokens\": [1]}\n{\"id\": \"b\", \"tokens\": [2]}\n");
    ASSERT_EQ(o.size(), 2u);
    ASSERT_FALSE(o[0].ok);
    EXPECT_EQ(o[0].error.rfind("in.jsonl:1: ", 0), 0u) << o[0].error;
    EXPECT_NE(o[0].error.find("byte order mark"), std::string::npos) << o[0].error;
    EXPECT_EQ(o[0].bad_id, "\"a\"");  // the id is still read for the --skip-bad record
    EXPECT_TRUE(o[1].ok);
}

TEST(InputReader, CrlfLineEnd) {
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1]}\r", "CRLF", "\"b\"");
    // A whole CRLF file: every line is reported, the blank CRLF line is skipped.
    auto o = read_text("{\"id\": 1, \"tokens\": [1]}\r\n\r\n[2]\r\n");
    ASSERT_EQ(o.size(), 2u);
    EXPECT_FALSE(o[0].ok);
    EXPECT_FALSE(o[1].ok);
    EXPECT_EQ(o[1].line, 3);
    EXPECT_EQ(o[1].bad_id, "3");
}

TEST(InputReader, TruncatedLastLine) {
    auto o = read_text("{\"id\": \"a\", \"tokens\": [1]}\n{\"id\": \"b\", \"tokens\": [1, 2");
    ASSERT_EQ(o.size(), 2u);
    ASSERT_FALSE(o[1].ok);
    EXPECT_EQ(o[1].error.rfind("in.jsonl:2: ", 0), 0u) << o[1].error;
    EXPECT_NE(o[1].error.find("no newline: truncated?"), std::string::npos) << o[1].error;
}

TEST(InputReader, DeepNestingIsRejectedBeforeParsing) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    expect_bad_middle_line("{\"id\": \"b\", \"tokens\": [1], \"x\": " + deep + "}",
                           "nested deeper than 256 levels");
    // Brackets inside strings do not count.
    auto o = read_text("{\"id\": \"" + std::string(1000, '[') + "\", \"tokens\": [1]}\n");
    ASSERT_TRUE(o.at(0).ok) << o[0].error;
}

TEST(InputReader, InvalidUtf8IsRejectedAndTheErrorRecordStaysValidJson) {
    auto o = read_text("{\"id\": \"a\xFF\", \"tokens\": [1]}\n");
    ASSERT_EQ(o.size(), 1u);
    ASSERT_FALSE(o[0].ok);
    EXPECT_NE(o[0].error.find("not valid JSON"), std::string::npos) << o[0].error;
    // The message quotes the bad byte; the error record replaces it with U+FFFD.
    const std::string rec = format_error_record("1", 1, o[0].error);
    const auto j = nlohmann::json::parse(rec);
    EXPECT_EQ(j.at("line"), 1);
    EXPECT_EQ(j.at("id"), 1);
    EXPECT_NE(j.at("error").get<std::string>().find("in.jsonl:1: not valid JSON"), std::string::npos);
}

TEST(InputReader, ByteAccounting) {
    const std::string l1 = "{\"id\": 1, \"tokens\": [1]}\n";
    const std::string text = l1 + "\n[2, 3]\nnot json\n[4]";
    const uint64_t n1 = l1.size();
    auto r = InputReader::from_string(text, "in.jsonl", kVocab, 64);
    EXPECT_EQ(r.size_bytes(), static_cast<int64_t>(text.size()));
    InputRecord rec;
    ASSERT_TRUE(r.next(rec));
    EXPECT_EQ(r.bytes_consumed(), n1);  // the first line and its newline
    ASSERT_TRUE(r.next(rec));
    EXPECT_EQ(r.bytes_consumed(), n1 + 1 + 7);  // the blank line and "[2, 3]\n"
    EXPECT_THROW(r.next(rec), InputError);
    EXPECT_EQ(r.bytes_consumed(), n1 + 1 + 7 + 9);
    ASSERT_TRUE(r.next(rec));
    EXPECT_EQ(r.bytes_consumed(), text.size());
    EXPECT_FALSE(r.next(rec));
    EXPECT_EQ(r.line(), 5);
}

TEST(InputReader, FilesPipesAndDirectories) {
    const std::string dir = test::temp_dir("input-reader");
    const std::string path = dir + "/in.jsonl";
    std::string text;
    for (int i = 0; i < 3000; ++i)
        text += "{\"id\": " + std::to_string(i) + ", \"tokens\": [" + std::to_string(i % 512) + "]}\n";
    test::write_text(path, text);
    {
        InputReader r(path, kVocab, 64);
        EXPECT_EQ(r.size_bytes(), static_cast<int64_t>(text.size()));
        InputRecord rec;
        int n = 0;
        while (r.next(rec)) {
            ASSERT_EQ(rec.id_json, std::to_string(n));
            ++n;
        }
        EXPECT_EQ(n, 3000);
        EXPECT_EQ(r.bytes_consumed(), text.size());
    }
    // A line across the 1 MiB read-chunk boundary.
    {
        std::string big =
            "{\"id\": \"big\", \"tokens\": [1], \"pad\": \"" + std::string(1500000, 'x') + "\"}\n[7]\n";
        test::write_text(path, big);
        InputReader r(path, kVocab, 64);
        InputRecord rec;
        ASSERT_TRUE(r.next(rec));
        EXPECT_EQ(rec.id_json, "\"big\"");
        EXPECT_EQ(rec.extra_json.size(), 1500000u + 10);
        ASSERT_TRUE(r.next(rec));
        EXPECT_EQ(rec.tokens, (std::vector<int32_t>{7}));
    }
    // A FIFO: size unknown (-1), read to the end.
    {
        const std::string fifo = dir + "/fifo";
        ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
        std::thread writer([&] { test::write_text(fifo, "[1]\n[2]\n"); });
        InputReader r(fifo, kVocab, 64);
        EXPECT_EQ(r.size_bytes(), -1);
        InputRecord rec;
        EXPECT_TRUE(r.next(rec));
        EXPECT_TRUE(r.next(rec));
        EXPECT_FALSE(r.next(rec));
        writer.join();
    }
    try {
        InputReader r(dir + "/missing.jsonl", kVocab, 64);
        ADD_FAILURE() << "a missing file was opened";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("missing.jsonl: cannot open input (No such file or directory)"),
                  std::string::npos)
            << e.what();
    }
    try {
        InputReader r(dir, kVocab, 64);
        ADD_FAILURE() << "a directory was opened";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace ds4r

namespace ds4r {
namespace {

// Every seed and every crasher of fuzz_input_jsonl (tests/fuzz/) through the reader with the fuzz
// target's invariants, in the ordinary (and the ASan) build: lines in order, accepted records
// within bounds with JSON ids / extras, error records valid JSON, the whole input consumed.
TEST(InputReader, FuzzCorpusAndCrashersReplay) {
    namespace fs = std::filesystem;
    const fs::path fuzz = fs::path(test::data_dir()).parent_path() / "fuzz";
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(fuzz / "corpus" / "fuzz_input_jsonl"))
        files.push_back(e.path());
    for (const auto& e : fs::directory_iterator(fuzz / "crashers"))
        if (e.path().filename().string().rfind("fuzz_input_jsonl-", 0) == 0) files.push_back(e.path());
    ASSERT_GE(files.size(), 5u);
    int64_t accepted = 0, rejected = 0;
    for (const auto& p : files) {
        SCOPED_TRACE(p.string());
        const std::string bytes = test::slurp(p.string());
        auto r = InputReader::from_string(bytes, "fuzz.jsonl", 1000, 64);
        int64_t prev = 0;
        for (;;) {
            InputRecord rec;
            std::string bad_id;
            try {
                if (!r.next(rec, &bad_id)) break;
                ++accepted;
                EXPECT_GT(rec.line, prev);
                prev = rec.line;
                EXPECT_FALSE(rec.tokens.empty());
                EXPECT_LE(rec.tokens.size(), 64u);
                for (int32_t t : rec.tokens) EXPECT_TRUE(t >= 0 && t < 1000);
                const auto id = nlohmann::json::parse(rec.id_json);
                EXPECT_TRUE(id.is_string() || id.is_number_integer());
                EXPECT_TRUE(nlohmann::json::parse(rec.extra_json).is_object());
            } catch (const InputError& e) {
                ++rejected;
                EXPECT_GT(r.line(), prev);
                prev = r.line();
                EXPECT_EQ(std::string(e.what()).rfind("fuzz.jsonl:" + std::to_string(r.line()) + ": ", 0), 0u)
                    << e.what();
                const std::string id = bad_id.empty() ? std::to_string(r.line()) : bad_id;
                const auto er = nlohmann::json::parse(format_error_record(id, r.line(), e.what()));
                EXPECT_EQ(er.at("line"), r.line());
            }
        }
        EXPECT_EQ(r.bytes_consumed(), bytes.size());
    }
    EXPECT_GT(accepted, 0);
    EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace ds4r
