// Engram hashing (docs/MODEL.md 4.2): normalizer, compressed token map, prime layout, multipliers,
// hash ids, and the host row gather of docs/MODEL.md 4.8 step 1, against the golden tiny-a data.
#include "ds4r/engram.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ds4r/config.h"
#include "ds4r/engram_io.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/npy.h"
#include "ds4r/numeric.h"
#include "ds4r/tokenizer.h"
#include "model/unicode9_tables.h"
#include "test_util.h"

using namespace ds4r;

namespace {

std::string tiny_a() {
    return test::data_dir() + "/tiny-a";
}

ModelConfig tiny_a_config() {
    return load_model_config(tiny_a() + "/model/config.json");
}

// The released model's Engram fields (docs/MODEL.md 2.1).
ModelConfig released_engram_config() {
    ModelConfig c;
    c.engram_layer_ids = {1, 14};
    c.engram_num_embeddings = {384006168, 384016682};
    c.engram_max_ngram_size = 4;
    c.engram_vocab_size = 16000000;
    c.engram_n_heads = 8;
    c.engram_head_dim = 256;
    c.engram_pad_id = 2;
    c.engram_compressed_vocab_size = 99092;
    return c;
}

template <class T>
std::vector<T> load_vec(const std::string& path, const char* descr) {
    NpyArray a = load_npy(path);
    EXPECT_EQ(a.descr, descr) << path;
    return a.to_vector<T>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// engram_normalize
// ---------------------------------------------------------------------------------------------

TEST(EngramNormalize, CaseAccentsAndCompatibilityForms) {
    EXPECT_EQ(engram_normalize("Hello"), "hello");
    EXPECT_EQ(engram_normalize(" Caf\xC3\xA9"), "cafe");  // " Café": NFD + StripAccents
    EXPECT_EQ(engram_normalize("E\xCC\x81"), "e");        // decomposed É
    EXPECT_EQ(engram_normalize("\xEF\xBC\xA1\xEF\xBC\xA2\xEF\xBC\xA3"), "abc");  // full-width ＡＢＣ (NFKC)
    EXPECT_EQ(engram_normalize("\xEF\xBC\x8C"), ",");                            // full-width comma
    EXPECT_EQ(engram_normalize("\xEF\xAC\x81"), "fi");                           // ligature ﬁ
    EXPECT_EQ(engram_normalize("\xE2\x91\xA0"), "1");                            // ①
    EXPECT_EQ(engram_normalize("\xE2\x85\xAB"), "xii");                          // Ⅻ
    EXPECT_EQ(engram_normalize("<\xEF\xBD\x9C"
                               "User\xEF\xBD\x9C>"),
              "<|user|>");
    // 국 (U+AD6D): NFD splits the syllable into three jamo, which are letters (Lo), so they stay.
    EXPECT_EQ(engram_normalize("\xEA\xB5\xAD"), "\xE1\x84\x80\xE1\x85\xAE\xE1\x86\xA8");
}

TEST(EngramNormalize, DottedCapitalIAndGreekSigma) {
    // İ (U+0130): NFD gives I + U+0307, StripAccents drops the dot, then "i".
    EXPECT_EQ(engram_normalize("\xC4\xB0stanbul"), "istanbul");
    // Lowercase is char-wise (char::to_lowercase): no Final_Sigma rule, every Σ becomes σ.
    EXPECT_EQ(engram_normalize("\xCE\xA3\xCE\x91\xCE\xA3"), "\xCF\x83\xCE\xB1\xCF\x83");  // ΣΑΣ -> σασ
    EXPECT_EQ(engram_normalize("\xCE\x9F\xCE\xA3"), "\xCE\xBF\xCF\x83");                  // ΟΣ -> οσ
    EXPECT_EQ(engram_normalize("\xCE\xA9"), "\xCF\x89");                                  // Ω -> ω
    // Ohm sign U+2126 -> Ω (NFKC) -> ω.
    EXPECT_EQ(engram_normalize("\xE2\x84\xA6"), "\xCF\x89");
}

TEST(EngramNormalize, StripAccentsDropsEveryMarkCategory) {
    // Devanagari "हिन्दी": ि U+093F and ी U+0940 are Mc (spacing marks), ् U+094D is Mn. The
    // tokenizers StripAccents drops General_Category Mark, all three kinds.
    EXPECT_EQ(engram_normalize("\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80"),
              "\xE0\xA4\xB9\xE0\xA4\xA8\xE0\xA4\xA6");
    // U+20DD COMBINING ENCLOSING CIRCLE is Me.
    EXPECT_EQ(engram_normalize("a\xE2\x83\x9D"), "a");
    // Categories as of Unicode 9.0: U+1CF2 was Mc (Lo since 10.0) and goes; U+111C9 SHARADA SANDHI
    // MARK was Po (Mn since) and stays.
    EXPECT_EQ(engram_normalize("a\xE1\xB3\xB2"), "a");
    EXPECT_EQ(engram_normalize("a\xF0\x91\x87\x89"), "a\xF0\x91\x87\x89");
}

TEST(EngramNormalize, CodePointsNewerThanUnicode9AreLeftAlone) {
    // The tokenizers normalizers use Unicode 9.0 tables. U+0D00 (Malayalam, Mn, Unicode 10.0) is
    // unassigned for them: not a mark, so not stripped. U+1E030 (Unicode 15.0) has a compatibility
    // decomposition to U+0430 that NFKC of Unicode 9.0 does not know.
    EXPECT_EQ(engram_normalize("\xE0\xB4\x95\xE0\xB4\x80"), "\xE0\xB4\x95\xE0\xB4\x80");
    EXPECT_EQ(engram_normalize("\xF0\x9E\x80\xB0"), "\xF0\x9E\x80\xB0");
    // ... while marks around it still go: "é" + U+0D00 + "É".
    EXPECT_EQ(engram_normalize("\xC3\xA9\xE0\xB4\x80\xC3\x89"),
              "e\xE0\xB4\x80"
              "e");
}

TEST(EngramNormalize, Unicode9TablesAreWellFormed) {
    // Sorted, disjoint ranges with the sizes of Unicode 9.0: 128,237 assigned characters (incl. 65
    // controls) + 137,468 private use + 2,048 surrogates + 66 noncharacters; 2,097 marks.
    auto check = [](const auto& table, int64_t expected_total) {
        int64_t total = 0;
        int64_t prev_last = -1;
        for (const auto& r : table) {
            EXPECT_LE(r.first, r.last);
            EXPECT_GT(static_cast<int64_t>(r.first), prev_last);
            prev_last = r.last;
            total += static_cast<int64_t>(r.last) - r.first + 1;
        }
        EXPECT_EQ(total, expected_total);
    };
    check(unicode9::kAssigned, 128237 + 137468 + 2048 + 66);
    check(unicode9::kMarks, 2097);
}

TEST(EngramNormalize, Whitespace) {
    EXPECT_EQ(engram_normalize(" "), " ");  // '^ $' -> U+E000 survives Strip -> " "
    EXPECT_EQ(engram_normalize("  "), " ");
    EXPECT_EQ(engram_normalize("\n"), " ");
    EXPECT_EQ(engram_normalize("\r\n"), " ");
    EXPECT_EQ(engram_normalize("\t\t"), " ");
    EXPECT_EQ(engram_normalize("\xE3\x80\x80"), " ");  // U+3000 -> ' ' by NFKC
    EXPECT_EQ(engram_normalize(" \xC2\xA0 "), " ");    // NBSP -> ' ' by NFKC, one run
    EXPECT_EQ(engram_normalize(" a "), "a");
    EXPECT_EQ(engram_normalize("a \t\n b"), "a b");
    EXPECT_EQ(engram_normalize("\nThe"), "the");
    EXPECT_EQ(engram_normalize(""), "");
    EXPECT_EQ(engram_normalize("\x0b"), "");                      // VT is not in [ \t\r\n], Strip removes it
    EXPECT_EQ(engram_normalize(" \x0b"), "");                     // " \v" is not exactly " "
    EXPECT_EQ(engram_normalize("a\xE2\x80\xA8"), "a");            // U+2028 is whitespace for Strip
    EXPECT_EQ(engram_normalize("\xE2\x80\x8B"), "\xE2\x80\x8B");  // U+200B is not White_Space
    // A literal U+E000 in the text is also turned into a space by the last step.
    EXPECT_EQ(engram_normalize("a\xEE\x80\x80"
                               "b"),
              "a b");
}

// ---------------------------------------------------------------------------------------------
// Compressed token map
// ---------------------------------------------------------------------------------------------

TEST(EngramTokenMap, MatchesGoldenTinyA) {
    ModelConfig cfg = tiny_a_config();
    const std::string path = tiny_a() + "/model/tokenizer.json";
    Tokenizer tok = Tokenizer::load(path);
    EngramTokenMap m = build_engram_token_map(tok, cfg, path);
    std::vector<int32_t> golden = load_vec<int32_t>(tiny_a() + "/engram_token_map.npy", "<i4");
    EXPECT_EQ(m.map, golden);
    EXPECT_EQ(m.num_keys, 405);
    EXPECT_EQ(m.num_keys, cfg.engram_compressed_vocab_size);

    std::ifstream meta_file(tiny_a() + "/meta.json");
    nlohmann::json meta = nlohmann::json::parse(meta_file);
    EXPECT_EQ(m.pad_compressed, meta.at("engram_pad_compressed").get<int32_t>());
    EXPECT_EQ(m.pad_compressed, 2);
    // "İstanbul" and "istanbul" share a key; raw-token keys (U+FFFD) stay distinct.
    EXPECT_EQ(m.map[485], m.map[501]);
    EXPECT_NE(m.map[441], m.map[487]);
}

TEST(EngramTokenMap, CountMismatchIsACheckpointError) {
    ModelConfig cfg = tiny_a_config();
    cfg.engram_compressed_vocab_size = 404;
    const std::string path = tiny_a() + "/model/tokenizer.json";
    Tokenizer tok = Tokenizer::load(path);
    try {
        build_engram_token_map(tok, cfg, path);
        FAIL() << "no exception";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("405"), std::string::npos) << e.what();
    }
    EngramTokenMap m = build_engram_token_map(tok, cfg, path, /*check=*/false);
    EXPECT_EQ(m.num_keys, 405);
}

TEST(EngramTokenMap, KeyRulesOnASyntheticTokenizer) {
    // ids: 0 "a", 1 "A", 2 hole, 3 "Ġ" (" "), 4 "ĠĠ" ("  "), 5 "ċ" (VT, normalizes to ""),
    // 6 "æĹ" (partial UTF-8: raw key), 7 "Ã©" ("é" -> "e"), 8 "e".
    Tokenizer tok = Tokenizer::parse(
        R"({"decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {
            "a": 0, "A": 1, "\u0120": 3, "\u0120\u0120": 4, "\u010b": 5, "\u00e6\u0139": 6,
            "\u00c3\u00a9": 7, "e": 8}}})",
        "synthetic.json");
    ModelConfig cfg;
    cfg.engram_pad_id = 2;
    EngramTokenMap m = build_engram_token_map(tok, cfg, "synthetic.json", /*check=*/false);
    const std::vector<int32_t> expected = {0, 0, 1, 2, 2, 3, 4, 5, 5};
    EXPECT_EQ(m.map, expected);
    EXPECT_EQ(m.num_keys, 6);
    EXPECT_EQ(m.pad_compressed, 1);  // the hole's key ""
    cfg.engram_pad_id = 9;
    EXPECT_THROW(build_engram_token_map(tok, cfg, "synthetic.json", false), CheckpointError);
}

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

TEST(EngramLayout, MatchesGoldenTinyA) {
    ModelConfig cfg = tiny_a_config();
    EngramLayout lay = build_engram_layout(cfg);
    std::vector<int64_t> primes = load_vec<int64_t>(tiny_a() + "/engram_primes.npy", "<i8");
    std::vector<int64_t> offsets = load_vec<int64_t>(tiny_a() + "/engram_offsets.npy", "<i8");
    ASSERT_EQ(primes.size(), 12u);
    ASSERT_EQ(lay.primes.size(), 2u);
    size_t k = 0;
    for (size_t l = 0; l < 2; ++l)
        for (size_t g = 0; g < 3; ++g)
            for (size_t h = 0; h < 2; ++h, ++k) EXPECT_EQ(lay.primes[l][g][h], primes[k]) << l << g << h;
    k = 0;
    for (size_t l = 0; l < 2; ++l)
        for (size_t c = 0; c < 6; ++c, ++k) EXPECT_EQ(lay.offsets[l][c], offsets[k]);
    EXPECT_EQ(lay.table_rows, (std::vector<int64_t>{660, 864}));
}

TEST(EngramLayout, MatchesModelMdForTheReleasedConfig) {
    EngramLayout lay = build_engram_layout(released_engram_config());
    const std::vector<std::vector<std::vector<int64_t>>> primes = {
        {{16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183},
         {16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321},
         {16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463}},
        {{16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609, 16000627},
         {16000667, 16000669, 16000693, 16000697, 16000711, 16000729, 16000759, 16000769},
         {16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889}}};
    EXPECT_EQ(lay.primes, primes);
    const std::vector<int64_t> off1 = {0,         16000057,  32000136,  48000217,  64000314,  80000435,
                                       96000564,  112000697, 128000880, 144001069, 160001276, 176001487,
                                       192001740, 208002017, 224002306, 240002613, 256002934, 272003273,
                                       288003654, 304004047, 320004446, 336004849, 352005258, 368005705};
    const std::vector<int64_t> off14 = {0,         16000477,  32000964,  48001463,  64001970,  80002481,
                                        96003054,  112003663, 128004290, 144004957, 160005626, 176006319,
                                        192007016, 208007727, 224008456, 240009215, 256009984, 272010765,
                                        288011564, 304012377, 320013196, 336014037, 352014914, 368015793};
    EXPECT_EQ(lay.offsets[0], off1);
    EXPECT_EQ(lay.offsets[1], off14);
    EXPECT_EQ(lay.table_rows, (std::vector<int64_t>{384006168, 384016682}));
}

TEST(EngramLayout, RowCountMismatchIsACheckpointError) {
    ModelConfig cfg = released_engram_config();
    cfg.engram_num_embeddings[1] += 1;
    try {
        build_engram_layout(cfg, "/ckpt/config.json");
        FAIL() << "no exception";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("/ckpt/config.json"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("384016682"), std::string::npos) << e.what();
    }
    cfg = released_engram_config();
    cfg.engram_num_embeddings.pop_back();
    EXPECT_THROW(build_engram_layout(cfg), CheckpointError);
    cfg = released_engram_config();
    cfg.engram_max_ngram_size = 1;
    EXPECT_THROW(build_engram_layout(cfg), CheckpointError);
    cfg = released_engram_config();
    cfg.engram_n_heads = 0;
    EXPECT_THROW(build_engram_layout(cfg), CheckpointError);
}

// ---------------------------------------------------------------------------------------------
// Multipliers (numpy default_rng reproduction)
// ---------------------------------------------------------------------------------------------

TEST(EngramMultipliers, NumpyDocumentedExample) {
    // numpy's default_rng docstring: default_rng(12345).integers(low=0, high=10, size=3) is
    // [6, 2, 7]. high - 1 fits in 32 bits, so this covers the buffered 32-bit Lemire path.
    EXPECT_EQ(numpy_rng_integers(12345, 10, 3), (std::vector<int64_t>{6, 2, 7}));
    EXPECT_EQ(numpy_rng_integers(12345, 1, 4), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(EngramMultipliers, MatchModelMdForTheReleasedConfig) {
    EXPECT_EQ(engram_multipliers(1, 99092, 4),
              (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
    EXPECT_EQ(engram_multipliers(14, 99092, 4),
              (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
    // bound = (INT64_MAX // 99092) // 2 = 46,539,438,283,891: every multiplier is odd and below 2 * bound.
    for (int64_t m : engram_multipliers(14, 99092, 4)) {
        EXPECT_EQ(m % 2, 1);
        EXPECT_LT(m, 2 * int64_t{46539438283891});
    }
}

TEST(EngramMultipliers, MatchGoldenTinyA) {
    ModelConfig cfg = tiny_a_config();
    std::vector<int64_t> golden = load_vec<int64_t>(tiny_a() + "/engram_multipliers.npy", "<i8");
    ASSERT_EQ(golden.size(), 8u);
    for (size_t l = 0; l < 2; ++l) {
        std::vector<int64_t> m = engram_multipliers(cfg.engram_layer_ids[l], cfg.engram_compressed_vocab_size,
                                                    cfg.engram_max_ngram_size);
        EXPECT_EQ(m, std::vector<int64_t>(golden.begin() + static_cast<long>(4 * l),
                                          golden.begin() + static_cast<long>(4 * l + 4)))
            << "layer " << cfg.engram_layer_ids[l];
    }
    EXPECT_THROW(engram_multipliers(-1, 405, 4), CheckpointError);
    EXPECT_THROW(engram_multipliers(1, 0, 4), CheckpointError);
}

// ---------------------------------------------------------------------------------------------
// Hash ids
// ---------------------------------------------------------------------------------------------

TEST(EngramHash, MatchesGoldenDumpsForEverySequence) {
    ModelConfig cfg = tiny_a_config();
    const std::string path = tiny_a() + "/model/tokenizer.json";
    EngramTokenMap map = build_engram_token_map(Tokenizer::load(path), cfg, path);
    EngramLayout lay = build_engram_layout(cfg);
    std::ifstream in(tiny_a() + "/tokens.jsonl");
    std::string line;
    int n_seq = 0;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        nlohmann::json j = nlohmann::json::parse(line);
        const std::string id = j.at("id").get<std::string>();
        std::vector<int32_t> tokens = j.at("tokens").get<std::vector<int32_t>>();
        NpyArray golden = load_npy(tiny_a() + "/dumps/" + id + "_engram_hash.npy");
        ASSERT_EQ(golden.descr, "<i8");
        ASSERT_EQ(golden.shape, (Shape{static_cast<int64_t>(tokens.size()), 2, 6})) << id;
        std::vector<int64_t> ids = engram_hash_ids(tokens, map, lay, cfg);
        EXPECT_EQ(ids, golden.to_vector<int64_t>()) << id;
        ++n_seq;
    }
    EXPECT_EQ(n_seq, 12);
}

TEST(EngramHash, FormulaOnAHandComputedCase) {
    // Two tokens; lookbacks before the start use the pad's compressed id.
    ModelConfig cfg = tiny_a_config();
    const std::string path = tiny_a() + "/model/tokenizer.json";
    EngramTokenMap map = build_engram_token_map(Tokenizer::load(path), cfg, path);
    EngramLayout lay = build_engram_layout(cfg);
    const std::vector<int32_t> tokens = {90, 81};
    std::vector<int64_t> ids = engram_hash_ids(tokens, map, lay, cfg);
    ASSERT_EQ(ids.size(), 2u * 2u * 6u);
    for (size_t li = 0; li < 2; ++li) {
        std::vector<int64_t> m = engram_multipliers(cfg.engram_layer_ids[li], 405, 4);
        const int64_t c0 = map.map[90], c1 = map.map[81], pad = map.pad_compressed;
        // position 1: tok = (c1, c0, pad, pad)
        const int64_t r2 = (c1 * m[0]) ^ (c0 * m[1]);
        const int64_t r3 = r2 ^ (pad * m[2]);
        const int64_t r4 = r3 ^ (pad * m[3]);
        const int64_t r[3] = {r2, r3, r4};
        for (size_t g = 0; g < 3; ++g)
            for (size_t h = 0; h < 2; ++h)
                EXPECT_EQ(ids[(1 * 2 + li) * 6 + g * 2 + h],
                          r[g] % lay.primes[li][g][h] + lay.offsets[li][g * 2 + h]);
    }
    EXPECT_THROW(engram_hash_ids({512}, map, lay, cfg), InputError);
    EXPECT_THROW(engram_hash_ids({-1}, map, lay, cfg), InputError);
    EXPECT_TRUE(engram_hash_ids({}, map, lay, cfg).empty());
}

// ---------------------------------------------------------------------------------------------
// EngramTable
// ---------------------------------------------------------------------------------------------

namespace {

struct TensorLocation {
    uint64_t offset = 0;  // absolute file offset of the data
    std::vector<int64_t> shape;
};

// A few lines of safetensors: u64 header length, JSON header, data; offsets relative to the data.
TensorLocation locate(const std::string& file, const std::string& name) {
    std::ifstream in(file, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    nlohmann::json h = nlohmann::json::parse(header);
    const auto& t = h.at(name);
    return {8 + n + t.at("data_offsets").at(0).get<uint64_t>(), t.at("shape").get<std::vector<int64_t>>()};
}

std::vector<uint8_t> read_bytes(const std::string& file, uint64_t offset, size_t n) {
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    std::vector<uint8_t> v(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
    return v;
}

// e4m3fn by its definition: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN.
double e4m3_by_hand(uint8_t b) {
    const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    return sign ? -mag : mag;
}

void check_table(const std::string& shard, const std::string& layer_prefix) {
    TensorLocation w = locate(shard, layer_prefix + "engram.embed.weight");
    TensorLocation s = locate(shard, layer_prefix + "engram.embed.scale");
    ASSERT_EQ(w.shape.size(), 2u);
    const int64_t rows = w.shape[0], hd = w.shape[1];
    ASSERT_EQ(s.shape, (std::vector<int64_t>{rows, hd / 32}));
    std::vector<uint8_t> wb = read_bytes(shard, w.offset, static_cast<size_t>(rows * hd));
    std::vector<uint8_t> sb = read_bytes(shard, s.offset, static_cast<size_t>(rows * hd / 32));

    std::vector<int64_t> ids;
    for (int64_t r = rows - 1; r >= 0; r -= 7) ids.push_back(r);
    ids.push_back(0);
    ids.push_back(0);  // repeated rows are fine
    for (EngramIoMode io : {EngramIoMode::Mmap, EngramIoMode::Pread, EngramIoMode::Auto}) {
        const char* mode = engram_io_name(io);
        EngramTableOptions opt;
        opt.io = io;
        EngramTable table(shard, w.offset, s.offset, rows, hd, opt);
        EXPECT_EQ(table.rows(), rows);
        EXPECT_EQ(table.head_dim(), hd);
        std::vector<uint16_t> out(ids.size() * static_cast<size_t>(hd));
        table.gather_bf16(ids.data(), ids.size(), out.data());
        int nonzero = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
            for (int64_t d = 0; d < hd; ++d) {
                const uint8_t code = wb[static_cast<size_t>(ids[i] * hd + d)];
                const uint8_t scale = sb[static_cast<size_t>(ids[i] * (hd / 32) + d / 32)];
                ASSERT_NE(code & 0x7f, 0x7f);
                const double expected = e4m3_by_hand(code) * std::pow(2.0, scale - 127);
                const uint16_t got = out[i * static_cast<size_t>(hd) + static_cast<size_t>(d)];
                EXPECT_EQ(static_cast<double>(bf16_to_f32(got)), expected)
                    << mode << " row " << ids[i] << " d " << d;
                nonzero += expected != 0;
            }
        }
        EXPECT_GT(nonzero, 0);
        const int64_t bad[] = {rows, -1};
        for (int64_t b : bad) EXPECT_THROW(table.gather_bf16(&b, 1, out.data()), RuntimeError);
    }
    // Extents past the end of the file, or a row width that is not a multiple of 32.
    EXPECT_THROW(EngramTable(shard, w.offset, s.offset, rows + 1, hd), CheckpointError);
    EXPECT_THROW(EngramTable(shard, w.offset, s.offset, rows, 48), CheckpointError);
    EXPECT_THROW(EngramTable(shard + ".missing", w.offset, s.offset, rows, hd), CheckpointError);
}

}  // namespace

TEST(EngramTable, GatherMatchesManualDequantizationLayer0) {
    check_table(tiny_a() + "/model/model-00006-of-00007.safetensors", "layers.0.");
}

TEST(EngramTable, GatherMatchesManualDequantizationLayer1) {
    check_table(tiny_a() + "/model/model-00007-of-00007.safetensors", "layers.1.");
}
