// TextEncoder (src/text/): byte-level BPE of the V4.1 tokenizer.json against Hugging Face
// `tokenizers` 0.23.2 (tests/data/tokenizer/text_to_ids.jsonl, 237 texts), the round trip through
// Tokenizer::decode, and the pre-tokenizer pieces that differ between regex engines.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "encode_test_util.h"
#include "text/pretokenize.h"

namespace ds4r {
namespace {

using json = nlohmann::json;

std::string ids_text(const std::vector<int32_t>& v) {
    return json(v).dump();
}

TEST(EncodeText, AllGroundTruthTextsMatchTokenizers) {
    const auto lines = test::read_lines(test::tokenizer_data_dir() + "/text_to_ids.jsonl");
    ASSERT_EQ(lines.size(), 237u);
    TextEncoder& enc = test::v41_encoder();
    int mismatches = 0;
    for (const std::string& line : lines) {
        const json rec = json::parse(line);
        const std::string text = rec.at("text").get<std::string>();
        const auto want = rec.at("tokens").get<std::vector<int32_t>>();
        const auto got = enc.encode(text);
        if (got != want) {
            ++mismatches;
            ADD_FAILURE() << rec.at("id").dump() << " " << json(text).dump() << "\n  want " << ids_text(want)
                          << "\n  got  " << ids_text(got);
        }
    }
    EXPECT_EQ(mismatches, 0);
}

TEST(EncodeText, GroundTruthTextsRoundTripThroughDecode) {
    const auto lines = test::read_lines(test::tokenizer_data_dir() + "/text_to_ids.jsonl");
    for (const std::string& line : lines) {
        const json rec = json::parse(line);
        const std::string text = rec.at("text").get<std::string>();
        EXPECT_EQ(test::v41_tokenizer().decode(rec.at("tokens").get<std::vector<int32_t>>()), text)
            << rec.at("id").dump();
    }
}

TEST(EncodeText, SecondCallUsesTheWordCacheWithTheSameResult) {
    TextEncoder& enc = test::v41_encoder();
    const std::string s = "The quick brown fox jumps over the lazy dog. The quick brown fox!";
    EXPECT_EQ(enc.encode(s), enc.encode(s));
    EXPECT_TRUE(enc.encode("").empty());
}

TEST(EncodeText, SpecialTokensInlineAreOneIdEach) {
    TextEncoder& enc = test::v41_encoder();
    const auto ids = enc.encode("<｜begin▁of▁sentence｜>hi<｜User｜></think>");
    ASSERT_GE(ids.size(), 4u);
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(ids[ids.size() - 2], 128803);  // <｜User｜>
    EXPECT_EQ(ids.back(), 128822);           // </think>
}

TEST(EncodeText, InvalidUtf8IsAnInputError) {
    TextEncoder& enc = test::v41_encoder();
    EXPECT_THROW(enc.encode(std::string("ab\xC3(", 4)), InputError);
    EXPECT_THROW(enc.encode(std::string("\xED\xA0\x80", 3)), InputError);  // a surrogate
}

TEST(EncodeText, LongWordsWithoutSpacesStayFastAndExact) {
    TextEncoder& enc = test::v41_encoder();
    const std::string word(20000, 'a');  // one pre-token, longer than the cache takes
    const auto ids = enc.encode(word);
    EXPECT_EQ(test::v41_tokenizer().decode(ids), word);
    EXPECT_LT(ids.size(), word.size());
}

TEST(PreTokenizerRegex, OnigurumaWhitespaceIsRewrittenForPcre2) {
    // \s outside a class becomes a class; inside a class its members; \S its complement.
    EXPECT_EQ(text::oniguruma_to_pcre2(R"(\s+(?!\S))"), R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
    EXPECT_EQ(text::oniguruma_to_pcre2(R"([^\s\p{L}])"), R"([^\t-\r\x{85}\p{Z}\p{L}])");
    EXPECT_EQ(text::oniguruma_to_pcre2(R"([\]\s]\\s)"), R"([\]\t-\r\x{85}\p{Z}]\\s)");
}

TEST(PreTokenizerRegex, MongolianVowelSeparatorIsNotWhitespace) {
    // U+180E is Cf: not \s in Oniguruma (PCRE2's \h has it). Under the V4.1 pre-tokenizer it stays
    // apart from the following spaces: "\u180E" and "  " are two pieces.
    text::PreTokenizer pre(test::v41_tokenizer().pre_tokenizer_json(), "v41");
    std::vector<text::Piece> pieces;
    const std::string s = "\xE1\xA0\x8E  ";
    pre.split(s, pieces);
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces[0].end, 3u);
}

TEST(PreTokenizerSteps, UnsupportedStepsAreRefusedByName) {
    EXPECT_THROW(text::PreTokenizer(R"({"type": "Metaspace"})", "t"), CheckpointError);
    EXPECT_THROW(
        text::PreTokenizer(R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Contiguous"})", "t"),
        CheckpointError);
    EXPECT_THROW(
        text::PreTokenizer(R"({"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"})", "t"),
        CheckpointError);
}

TEST(PreTokenizerSteps, RemovedAndInvertedSplits) {
    std::vector<text::Piece> p;
    text::PreTokenizer removed(R"({"type": "Split", "pattern": {"String": ","}, "behavior": "Removed"})",
                               "t");
    removed.split("a,b,,c", p);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[2].begin, 5u);
    // invert: the matches are kept, what lies between them removed.
    text::PreTokenizer inv(
        R"({"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Removed", "invert": true})", "t");
    inv.split("ab, cd", p);
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[1].begin, 4u);
    EXPECT_EQ(p[1].end, 6u);
}

TEST(EncodeTiny, TinyCheckpointTokenizerRoundTrips) {
    // tiny-a's tokenizer: ByteLevel with GPT-2's regex and 248 merges.
    const Tokenizer tok = Tokenizer::load(test::golden_model_dir() + "/tokenizer.json");
    TextEncoder enc(tok);
    const std::string s = "Hello world, it's 2026!\n\tThe quick brown fox. 日本語 🙂";
    const auto ids = enc.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
    for (int32_t id : ids) EXPECT_TRUE(tok.has_token(id));
}

TEST(TokenizerDecode, JoinsBytesAcrossTokensBeforeUtf8) {
    const Tokenizer& tok = test::v41_tokenizer();
    const auto ids = test::v41_encoder().encode("🙂");  // several byte tokens for one character
    std::string per_token;
    for (int32_t id : ids) per_token += tok.decode_one(id);
    EXPECT_EQ(tok.decode(ids), "🙂");
    if (ids.size() > 1) {
        EXPECT_NE(per_token, "🙂");  // each piece alone is invalid UTF-8
    }
}

}  // namespace
}  // namespace ds4r
