// Tokenizer: tokenizer.json parsing and the single-token byte-level decode (docs/MODEL.md 4.2).
#include "ds4r/tokenizer.h"

#include <gtest/gtest.h>

#include <string>

#include "ds4r/error.h"
#include "test_util.h"

using namespace ds4r;

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string tiny_a_tokenizer_path() {
    return test::data_dir() + "/tiny-a/model/tokenizer.json";
}

// A minimal tokenizer.json with the given vocab / added_tokens / decoder JSON fragments.
std::string make_json(const std::string& vocab, const std::string& added = "[]",
                      const std::string& decoder = R"({"type": "ByteLevel"})") {
    return R"({"added_tokens": )" + added + R"(, "decoder": )" + decoder +
           R"(, "model": {"type": "BPE", "vocab": )" + vocab + "}}";
}

Tokenizer parse(const std::string& text) {
    return Tokenizer::parse(text, "test.json");
}

}  // namespace

TEST(Utf8Lossy, ValidTextIsCopied) {
    EXPECT_EQ(utf8_from_bytes_lossy("abc"), "abc");
    EXPECT_EQ(utf8_from_bytes_lossy("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80"),
              "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x9A\x80");
    EXPECT_EQ(utf8_from_bytes_lossy(std::string("a\0b", 3)), std::string("a\0b", 3));
    EXPECT_EQ(utf8_from_bytes_lossy(""), "");
}

TEST(Utf8Lossy, MaximalSubpartsBecomeOneReplacementEach) {
    const std::string& R = kReplacement;
    // A truncated 4-byte sequence is one maximal subpart (Rust's own doc example).
    EXPECT_EQ(utf8_from_bytes_lossy("Hello \xF0\x90\x80World"), "Hello " + R + "World");
    // Lone continuation bytes and never-lead bytes: one each.
    EXPECT_EQ(utf8_from_bytes_lossy("\x80\xBF"), R + R);
    EXPECT_EQ(utf8_from_bytes_lossy("\xC0\xAF"), R + R);
    EXPECT_EQ(utf8_from_bytes_lossy("\xF5\x80"), R + R);
    // E0 needs A0..BF next: E0 80 is two subparts.
    EXPECT_EQ(utf8_from_bytes_lossy("\xE0\x80"), R + R);
    // Surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..): every byte alone.
    EXPECT_EQ(utf8_from_bytes_lossy("\xED\xA0\x80"), R + R + R);
    EXPECT_EQ(utf8_from_bytes_lossy("\xF4\x90\x80\x80"), R + R + R + R);
    // A valid prefix cut by an ASCII byte: one replacement, the ASCII byte kept.
    EXPECT_EQ(utf8_from_bytes_lossy("a\xF1\x80\x80"
                                    "b"),
              "a" + R + "b");
    EXPECT_EQ(utf8_from_bytes_lossy("\xE2\x82"), R);
    EXPECT_EQ(utf8_from_bytes_lossy("\xE2\x82\xE2\x82\xAC"), R + "\xE2\x82\xAC");
}

TEST(ByteLevelDecode, MapsCharsThroughTheGpt2Table) {
    EXPECT_EQ(byte_level_decode("\xC4\xA0the"), " the");             // U+0120 'Ġ' is the space byte
    EXPECT_EQ(byte_level_decode("\xC4\x8A"), "\n");                  // U+010A 'Ċ' is 0x0A
    EXPECT_EQ(byte_level_decode("\xC4\x80"), std::string(1, '\0'));  // U+0100 is byte 0x00
    EXPECT_EQ(byte_level_decode("\xC5\x83"), kReplacement);          // U+0143 is byte 0xAD: invalid alone
    EXPECT_EQ(byte_level_decode("\xC3\x83\xC2\xA9"), "\xC3\xA9");    // "Ã©" -> bytes C3 A9 -> "é"
    // A partial UTF-8 byte token decodes to U+FFFD (the key then becomes the raw token).
    EXPECT_EQ(byte_level_decode("\xC3\xA6\xC4\xB9"), kReplacement);  // "æĹ" -> E6 97
}

TEST(ByteLevelDecode, TokenWithACharOutsideTheTableKeepsItsOwnBytes) {
    // ' ' (U+0020) and U+FF5C are not images of the byte table: the WHOLE token stays verbatim,
    // including its 'Ġ', as the tokenizers ByteLevel decoder does.
    EXPECT_EQ(byte_level_decode("a b"), "a b");
    EXPECT_EQ(byte_level_decode("\xC4\xA0x\xEF\xBD\x9C"), "\xC4\xA0x\xEF\xBD\x9C");
    EXPECT_EQ(byte_level_decode("<\xEF\xBD\x9C"
                                "User\xEF\xBD\x9C>"),
              "<\xEF\xBD\x9C"
              "User\xEF\xBD\x9C>");
}

TEST(Tokenizer, GoldenTinyA) {
    Tokenizer tok = Tokenizer::load(tiny_a_tokenizer_path());
    EXPECT_EQ(tok.size(), 512);
    for (int64_t id = 0; id < tok.size(); ++id) EXPECT_TRUE(tok.has_token(id)) << id;
    EXPECT_FALSE(tok.has_token(512));
    EXPECT_FALSE(tok.has_token(-1));
    EXPECT_TRUE(tok.is_added(0));
    EXPECT_TRUE(tok.is_added(507));
    EXPECT_FALSE(tok.is_added(3));
    EXPECT_EQ(tok.id_to_token(3), "!");
    EXPECT_EQ(tok.id_to_token(500), "\xC4\xA0thin");
    EXPECT_EQ(tok.decode_one(500), " thin");
    EXPECT_EQ(tok.decode_one(485), " \xC4\xB0stanbul");  // "ĠÄ°stanbul" -> " İstanbul"
    EXPECT_EQ(tok.decode_one(486), " \xCF\x89");         // " ω"
    EXPECT_EQ(tok.decode_one(201), "\n");
    EXPECT_EQ(tok.decode_one(273), "  ");
    EXPECT_EQ(tok.decode_one(0),
              "<\xEF\xBD\x9C"
              "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
    EXPECT_EQ(tok.decode_one(510), "<think>");
    EXPECT_EQ(tok.decode_one(441), kReplacement);  // "æĹ": 2 of 3 bytes of a CJK char
    // "ĢðŁĺ" -> 80 F0 9F 98: a lone continuation byte, then a cut 4-byte char.
    EXPECT_EQ(tok.decode_one(488), kReplacement + kReplacement);
    EXPECT_EQ(tok.decode_one(496), kReplacement + "\xEA\xB5\xAD");  // "ľêµŃ" -> 9C + "국"
    EXPECT_EQ(tok.decode_one(512), "");
}

TEST(Tokenizer, HolesAndAddedTokens) {
    Tokenizer tok = parse(make_json(R"({"a": 0, "\u0120b": 3})",
                                    R"([{"id": 5, "content": "<x y>", "special": true},
                                        {"id": 0, "content": "A", "special": false},
                                        {"id": 6, "content": "\u00e9", "special": false}])"));
    EXPECT_EQ(tok.size(), 7);
    EXPECT_TRUE(tok.has_token(0));
    EXPECT_FALSE(tok.has_token(1));
    EXPECT_FALSE(tok.has_token(4));
    EXPECT_EQ(tok.id_to_token(1), "");
    EXPECT_EQ(tok.decode_one(1), "");  // tokenizers' decode drops ids without a token
    // The added vocabulary wins over model.vocab for the same id.
    EXPECT_EQ(tok.id_to_token(0), "A");
    EXPECT_TRUE(tok.is_added(0));
    EXPECT_EQ(tok.decode_one(3), " b");
    EXPECT_EQ(tok.decode_one(5), "<x y>");
    // An added token made only of table chars is byte-decoded too: U+00E9 is byte 0xE9 -> U+FFFD.
    EXPECT_EQ(tok.decode_one(6), kReplacement);
}

TEST(Tokenizer, AcceptsByteLevelInsideAHarmlessSequence) {
    const std::string vocab = R"({"\u0120x": 0})";
    for (const char* dec :
         {R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}]})",
          R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Fuse"}]})",
          R"({"type": "Sequence", "decoders": [{"type": "Strip", "content": " ", "start": 0, "stop": 0},
                                 {"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}]})"}) {
        Tokenizer tok = parse(make_json(vocab, "[]", dec));
        EXPECT_EQ(tok.decode_one(0), " x") << dec;
    }
}

TEST(Tokenizer, RejectsMalformedFiles) {
    const std::string vocab = R"({"a": 0})";
    const char* bad[] = {
        "",
        "{",
        "[1, 2]",
        R"({"decoder": {"type": "ByteLevel"}})",                                    // no model
        R"({"decoder": {"type": "ByteLevel"}, "model": {"vocab": [["a", 0.0]]}})",  // Unigram-style vocab
        R"({"decoder": {"type": "ByteLevel"}, "model": {"type": "WordPiece", "vocab": {"a": 0}}})",
        R"({"model": {"vocab": {"a": 0}}})",  // no decoder
        R"({"decoder": null, "model": {"vocab": {"a": 0}}})",
    };
    for (const char* text : bad) EXPECT_THROW(parse(text), CheckpointError) << text;

    const char* bad_decoders[] = {
        R"({"type": "WordPiece"})",
        R"({"type": "Metaspace"})",
        R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Replace"}]})",
        R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "ByteLevel"}]})",
        R"({"type": "Sequence", "decoders": [{"type": "Fuse"}]})",
        R"({"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Strip", "start": 1, "stop": 0}]})",
        R"({"type": "Sequence"})",
        R"({"type": 3})",
        R"("ByteLevel")",
    };
    for (const char* dec : bad_decoders)
        EXPECT_THROW(parse(make_json(vocab, "[]", dec)), CheckpointError) << dec;

    const std::string bad_ids[] = {
        make_json(R"({"a": -1})"),
        make_json(R"({"a": 1.5})"),
        make_json(R"({"a": "1"})"),
        make_json(R"({"a": 0, "b": 0})"),    // duplicated id
        make_json(R"({"a": 99999999999})"),  // above the bound
        make_json(R"({"a": 18446744073709551615})"),
        make_json(R"({})"),  // no tokens
        make_json(vocab, R"([{"id": 1, "content": "x"}, {"id": 1, "content": "y"}])"),
        make_json(vocab, R"([{"id": 1}])"),
        make_json(vocab, R"([{"id": 1, "content": 7}])"),
        make_json(vocab, R"({"id": 1})"),
    };
    for (const std::string& text : bad_ids) EXPECT_THROW(parse(text), CheckpointError) << text;
}

TEST(Tokenizer, ErrorsNameTheFile) {
    try {
        Tokenizer::parse("{", "/some/dir/tokenizer.json");
        FAIL() << "no exception";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("/some/dir/tokenizer.json"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Tokenizer::load(test::data_dir() + "/no/such/tokenizer.json"), CheckpointError);
}
