// make-tiny: the layout (config, tokenizer, index, shards, headers) against the binding, the
// determinism of the bytes, the weight statistics, the streaming writer, and the CLI round trip.
#include "ds4r/make_tiny.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "checkpoint/make_tiny_weights.h"
#include "checkpoint/safetensors_writer.h"
#include "ds4r/binding.h"
#include "ds4r/checkpoint.h"
#include "ds4r/config.h"
#include "ds4r/engram.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/numeric.h"
#include "ds4r/tokenizer.h"
#include "test_util.h"

using namespace ds4r;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A few lines of safetensors parsing, independent of the checkpoint module.
struct StTensor {
    std::string dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // relative to the data start
};
struct StFile {
    uint64_t data_start = 0, file_size = 0;
    std::map<std::string, StTensor> tensors;
    json metadata;
    std::vector<uint8_t> bytes;  // the whole file (tiny shards only)
};

StFile read_st(const std::string& path) {
    StFile f;
    f.bytes = read_whole_file(path, 64u << 20);
    f.file_size = f.bytes.size();
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f.bytes[static_cast<size_t>(i)]) << (8 * i);
    f.data_start = 8 + n;
    json h = json::parse(f.bytes.begin() + 8, f.bytes.begin() + static_cast<std::ptrdiff_t>(8 + n));
    for (auto& [k, v] : h.items()) {
        if (k == "__metadata__") {
            f.metadata = v;
            continue;
        }
        StTensor t;
        t.dtype = v.at("dtype").get<std::string>();
        t.shape = v.at("shape").get<Shape>();
        t.begin = v.at("data_offsets")[0].get<uint64_t>();
        t.end = v.at("data_offsets")[1].get<uint64_t>();
        f.tensors[k] = t;
    }
    return f;
}

const uint8_t* tensor_data(const StFile& f, const std::string& name) {
    return f.bytes.data() + f.data_start + f.tensors.at(name).begin;
}

// The shard a tensor belongs in: 1 embed, 2..N+1 layer L, N+2 head + norm, then one per Engram table.
int expected_shard(const TensorSpec& s, const ModelConfig& c) {
    const int L = static_cast<int>(c.n_layers);
    if (s.name == "embed.weight") return 1;
    if (s.layer < 0) return L + 2;
    if (s.use == TensorUse::EngramTable) return L + 3 + c.engram_index(s.layer);
    return s.layer + 2;
}

std::string shard_file(int k, int total) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", k, total);
    return b;
}

MakeTinyResult make(const std::string& dir, TinyPreset preset, int layers, uint64_t seed, int threads = 0,
                    bool force = false) {
    MakeTinyOptions o;
    o.preset = preset;
    o.layers = layers;
    o.seed = seed;
    o.threads = threads;
    o.force = force;
    return make_tiny(dir, o);
}

// Checks a written tiny checkpoint against the binding: config, roles, index, every shard header.
void check_layout(const std::string& dir, int n_layers) {
    SCOPED_TRACE(dir);
    const ModelConfig cfg = load_model_config(path_join(dir, "config.json"));
    EXPECT_EQ(cfg.form, "hf");
    EXPECT_EQ(cfg.n_layers, n_layers);
    const auto roles = derive_layer_roles(cfg, "config.json");
    const auto specs = all_tensor_specs(cfg, roles);
    const int total = 1 + n_layers + 1 + static_cast<int>(cfg.engram_layer_ids.size());

    json idx = json::parse(read_text_file(path_join(dir, "model.safetensors.index.json"), 1u << 24));
    const json& wm = idx.at("weight_map");
    EXPECT_EQ(wm.size(), specs.size());
    std::map<std::string, StFile> shards;
    uint64_t sum = 0;
    for (int k = 1; k <= total; ++k) {
        const std::string f = shard_file(k, total);
        ASSERT_TRUE(file_exists(path_join(dir, f))) << f;
        shards[f] = read_st(path_join(dir, f));
        EXPECT_EQ(shards[f].metadata, json({{"format", "pt"}}));
        EXPECT_EQ(shards[f].data_start % 8, 0u);
    }
    for (const TensorSpec& s : specs) {
        SCOPED_TRACE(s.name);
        ASSERT_TRUE(wm.contains(s.name));
        const std::string f = shard_file(expected_shard(s, cfg), total);
        EXPECT_EQ(wm.at(s.name).get<std::string>(), f);
        const StFile& st = shards[f];
        auto it = st.tensors.find(s.name);
        ASSERT_NE(it, st.tensors.end());
        EXPECT_EQ(it->second.dtype, dtype_name(s.dtype));
        EXPECT_EQ(it->second.shape, s.shape);
        const uint64_t bytes = dtype_size(s.dtype) * static_cast<uint64_t>(shape_numel(s.shape));
        EXPECT_EQ(it->second.end - it->second.begin, bytes);
        sum += bytes;
    }
    // Each shard holds exactly its tensors, contiguous from offset 0 to the end of the file.
    size_t n_in_shards = 0;
    for (auto& [f, st] : shards) {
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        for (auto& [n, t] : st.tensors) ranges.emplace_back(t.begin, t.end);
        std::sort(ranges.begin(), ranges.end());
        uint64_t pos = 0;
        for (auto& [b, e] : ranges) {
            EXPECT_EQ(b, pos) << f;
            pos = e;
        }
        EXPECT_EQ(st.data_start + pos, st.file_size) << f;
        n_in_shards += st.tensors.size();
    }
    EXPECT_EQ(n_in_shards, specs.size());
    EXPECT_EQ(idx.at("metadata").at("total_size").get<uint64_t>(), sum);
    // The compressed vocab is the generated tokenizer's (the checked build must pass).
    const Tokenizer tok = Tokenizer::load(path_join(dir, "tokenizer.json"));
    EXPECT_EQ(tok.size(), cfg.vocab_size);
    EXPECT_EQ(build_engram_token_map(tok, cfg, "tokenizer.json", true).num_keys,
              cfg.engram_compressed_vocab_size);
}

std::map<std::string, std::vector<uint8_t>> read_dir(const std::string& dir) {
    std::map<std::string, std::vector<uint8_t>> out;
    for (const auto& e : fs::directory_iterator(dir))
        out[e.path().filename().string()] = read_whole_file(e.path().string(), 64u << 20);
    return out;
}

struct Moments {
    double n = 0, s = 0, s2 = 0;
    void add(double v) {
        n += 1;
        s += v;
        s2 += v * v;
    }
    double mean() const { return s / n; }
    double std() const { return std::sqrt(std::max(0.0, s2 / n - mean() * mean())); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plans and configs (no disk)
// ---------------------------------------------------------------------------------------------

TEST(MakeTinyPlan, TinyMatchesGoldenDimensionsAndRoles) {
    const ModelConfig g = load_model_config(test::data_dir() + "/tiny-a/model/config.json");
    const MakeTinyPlan p = plan_make_tiny(TinyPreset::Tiny, 0);
    const ModelConfig& c = p.cfg;
    EXPECT_EQ(c.vocab_size, g.vocab_size);
    EXPECT_EQ(c.dim, g.dim);
    EXPECT_EQ(c.moe_inter_dim, g.moe_inter_dim);
    EXPECT_EQ(c.n_layers, g.n_layers);
    EXPECT_EQ(c.n_heads, g.n_heads);
    EXPECT_EQ(c.head_dim, g.head_dim);
    EXPECT_EQ(c.rope_head_dim, g.rope_head_dim);
    EXPECT_EQ(c.q_lora_rank, g.q_lora_rank);
    EXPECT_EQ(c.o_groups, g.o_groups);
    EXPECT_EQ(c.o_lora_rank, g.o_lora_rank);
    EXPECT_EQ(c.window_size, g.window_size);
    EXPECT_EQ(c.n_routed_experts, g.n_routed_experts);
    EXPECT_EQ(c.n_activated_experts, g.n_activated_experts);
    EXPECT_EQ(c.original_seq_len, g.original_seq_len);
    EXPECT_EQ(c.max_position_embeddings, g.max_position_embeddings);
    EXPECT_EQ(c.rope_factor, g.rope_factor);
    EXPECT_EQ(c.compress_rope_theta, g.compress_rope_theta);
    EXPECT_EQ(c.compress_ratios, g.compress_ratios);
    EXPECT_EQ(c.kv_source_layers, g.kv_source_layers);
    EXPECT_EQ(c.index_source_layers, g.index_source_layers);
    EXPECT_EQ(c.index_topk, g.index_topk);
    EXPECT_EQ(c.candidate_source_layer, g.candidate_source_layer);
    EXPECT_EQ(c.candidate_topk_blocks, g.candidate_topk_blocks);
    EXPECT_EQ(c.candidate_block_size, g.candidate_block_size);
    EXPECT_EQ(c.engram_layer_ids, g.engram_layer_ids);
    // Same prime layout as tiny-a (engram_vocab_size 100, 2 heads): [660, 864].
    EXPECT_EQ(c.engram_num_embeddings, g.engram_num_embeddings);
    EXPECT_EQ(c.engram_head_dim, g.engram_head_dim);
    const auto groles = derive_layer_roles(g, "golden");
    ASSERT_EQ(p.roles.size(), groles.size());
    for (size_t l = 0; l < groles.size(); ++l) EXPECT_EQ(p.roles[l].describe(), groles[l].describe()) << l;
    // The golden shards have the same tensors apart from the optional bias_vl (16 x F32 per layer).
    json gi = json::parse(
        read_text_file(test::data_dir() + "/tiny-a/model/model.safetensors.index.json", 1u << 24));
    EXPECT_EQ(p.total_tensor_bytes, gi["metadata"]["total_size"].get<uint64_t>() + 6 * 16 * 4);
    size_t optional = 0;
    for (const auto& s : p.specs) {
        if (s.optional) {
            ++optional;
            EXPECT_FALSE(gi["weight_map"].contains(s.name)) << s.name;
        } else {
            EXPECT_TRUE(gi["weight_map"].contains(s.name)) << s.name;
        }
    }
    EXPECT_EQ(optional, 6u);
}

TEST(MakeTinyPlan, ConfigJsonHasTheReleasedForm) {
    const MakeTinyPlan p = plan_make_tiny(TinyPreset::Tiny, 0);
    const json mine = json::parse(p.config_json);
    const json gold = json::parse(read_text_file(test::data_dir() + "/tiny-a/model/config.json", 1u << 20));
    for (auto& [k, v] : gold.items()) {
        ASSERT_TRUE(mine.contains(k)) << k;
        if (k != "text_config") {
            EXPECT_EQ(mine[k], v) << k;
        }
    }
    // Every text_config key of the golden file, spelled the same, with the same value except the
    // tokenizer-dependent compressed vocab size.
    for (auto& [k, v] : gold["text_config"].items()) {
        ASSERT_TRUE(mine["text_config"].contains(k)) << k;
        if (k != "engram_compressed_vocab_size") {
            EXPECT_EQ(mine["text_config"][k], v) << k;
        }
    }
    for (const char* k : {"dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids",
                          "dspark_markov_rank", "dspark_n_routed_experts", "dspark_num_experts_per_tok"})
        EXPECT_TRUE(mine["text_config"].contains(k)) << k;
    EXPECT_EQ(mine["quantization_config"]["weight_block_size"], json({32, 32}));
}

TEST(MakeTinyPlan, LayersTruncateTheLayerLists) {
    const MakeTinyPlan p3 = plan_make_tiny(TinyPreset::Tiny, 3);
    EXPECT_EQ(p3.cfg.n_layers, 3);
    EXPECT_EQ(p3.cfg.compress_ratios, (std::vector<int>{0, 2, 2}));
    EXPECT_EQ(p3.cfg.kv_source_layers, (std::vector<int>{1}));
    EXPECT_EQ(p3.cfg.index_source_layers, (std::vector<int>{1}));
    EXPECT_EQ(p3.cfg.candidate_source_layer, -1);
    EXPECT_EQ(p3.cfg.engram_num_embeddings, (std::vector<int64_t>{660, 864}));
    EXPECT_EQ(p3.shards.size(), 1u + 3 + 1 + 2);
    const MakeTinyPlan p1 = plan_make_tiny(TinyPreset::Tiny, 1);
    EXPECT_EQ(p1.cfg.engram_layer_ids, (std::vector<int>{0}));
    EXPECT_EQ(p1.cfg.engram_num_embeddings, (std::vector<int64_t>{660}));
    EXPECT_TRUE(p1.cfg.index_source_layers.empty());
    EXPECT_THROW(plan_make_tiny(TinyPreset::Tiny, 7), InputError);
    EXPECT_THROW(plan_make_tiny(TinyPreset::FullWidth, 41), InputError);
    EXPECT_EQ(tiny_preset_from_name("full-width"), TinyPreset::FullWidth);
    EXPECT_FALSE(tiny_preset_from_name("huge").has_value());
}

TEST(MakeTinyPlan, FullWidthBytesMatchModelMd) {
    // docs/MODEL.md 3.5: a plain layer is 7,389,500,888 B (bias_vl included); role extras: Full ratio-2
    // +16.19 MB, Full ratio-1 +10.95 MB, Reindex +5.58 MB; 40 layers 295.66 GB (without the Engram
    // projections). docs/MODEL.md 3.4: tensors per layer 2,334 / 2,337 / 2,342 / 2,341 / 2,340 / 2,348.
    const MakeTinyPlan p = plan_make_tiny(TinyPreset::FullWidth, 40);
    const ModelConfig& c = p.cfg;
    EXPECT_EQ(c.vocab_size, 129280);
    EXPECT_EQ(c.dim, 5120);
    EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
    EXPECT_EQ(c.candidate_source_layer, 20);
    const uint64_t plain = 7389500888ull;
    EXPECT_EQ(p.layer_bytes(0), plain);
    EXPECT_EQ(p.layer_bytes(5), plain);
    EXPECT_NEAR(static_cast<double>(p.layer_bytes(2) - plain), 16.19e6, 0.005e6);
    EXPECT_NEAR(static_cast<double>(p.layer_bytes(20) - plain), 10.95e6, 0.005e6);
    EXPECT_NEAR(static_cast<double>(p.layer_bytes(24) - plain), 5.58e6, 0.005e6);
    std::map<int, int> count;
    uint64_t backbone = 0;
    for (const auto& s : p.specs) {
        if (s.layer < 0) continue;
        ++count[s.layer];
        if (s.name.find(".engram.") == std::string::npos)
            backbone += dtype_size(s.dtype) * static_cast<uint64_t>(shape_numel(s.shape));
    }
    EXPECT_EQ(count[3], 2334);
    EXPECT_EQ(count[24], 2337);
    EXPECT_EQ(count[2], 2342);
    EXPECT_EQ(count[8], 2342);
    EXPECT_EQ(count[20], 2341);
    EXPECT_EQ(count[1], 2340);
    EXPECT_EQ(count[14], 2348);
    EXPECT_NEAR(backbone / 1e9, 295.66, 0.005);
    // The release's grouping (docs/MODEL.md 3.1): 1 vision, 2 embed, layer L in L + 3, 43 head + norm,
    // 44-46 MTP, 47 / 48 the Engram tables: ~101.4 GB each (rows x 256 fp8 + rows x 8 e8m0), sparse.
    ASSERT_EQ(p.shards.size(), 48u);
    auto names_of = [&](size_t k) {
        std::vector<std::string> v;
        for (size_t i : p.shards[k].tensors) v.push_back(p.specs[i].name);
        return v;
    };
    EXPECT_EQ(names_of(0), std::vector<std::string>{"vision.make_tiny_placeholder"});
    EXPECT_EQ(names_of(1), std::vector<std::string>{"embed.weight"});
    EXPECT_EQ(p.shards[1].tensor_bytes, 129280ull * 5120 * 2);
    for (int L : {0, 1, 20, 39})
        for (size_t i : p.shards[static_cast<size_t>(L + 2)].tensors)
            if (p.specs[i].use != TensorUse::EngramTable) {
                EXPECT_EQ(p.specs[i].layer, L) << p.specs[i].name;
            }
    EXPECT_EQ(p.layer_bytes(7), p.shards[9].tensor_bytes);  // layer 7 in model-00010
    auto sorted = [](std::vector<std::string> v) {
        std::sort(v.begin(), v.end());
        return v;
    };
    EXPECT_EQ(sorted(names_of(42)), (std::vector<std::string>{"head.weight", "norm.weight"}));
    for (size_t m = 0; m < 3; ++m)
        EXPECT_EQ(names_of(43 + m),
                  std::vector<std::string>{"mtp." + std::to_string(m) + ".make_tiny_placeholder"});
    EXPECT_TRUE(p.shards[46].sparse && p.shards[47].sparse);
    EXPECT_FALSE(p.shards[45].sparse);
    EXPECT_EQ(p.shards[46].tensor_bytes, 384006168ull * 264);
    EXPECT_EQ(p.sparse_bytes, (384006168ull + 384016682ull) * 264);
    EXPECT_EQ(p.shards[0].file, "model-00001-of-00048.safetensors");
    EXPECT_EQ(p.shards[47].file, "model-00048-of-00048.safetensors");
}

TEST(MakeTinyPlan, FullWidthDefaultFourLayers) {
    const MakeTinyPlan p = plan_make_tiny(TinyPreset::FullWidth, 0);
    ASSERT_EQ(p.roles.size(), 4u);
    EXPECT_EQ(p.roles[0].ratio, 0);
    EXPECT_FALSE(p.roles[0].engram);
    EXPECT_EQ(p.roles[1].ratio, 0);
    EXPECT_TRUE(p.roles[1].engram);
    EXPECT_TRUE(p.roles[2].kv_source && p.roles[2].index_source && p.roles[2].owns_index_keys);
    EXPECT_EQ(p.roles[2].ratio, 2);
    EXPECT_EQ(p.roles[3].kv_from, 2);
    EXPECT_FALSE(p.roles[3].kv_source || p.roles[3].index_source);
    EXPECT_EQ(p.cfg.kv_source_layers, (std::vector<int>{2}));
    EXPECT_EQ(p.cfg.engram_layer_ids, (std::vector<int>{1}));
    EXPECT_EQ(p.cfg.engram_num_embeddings, (std::vector<int64_t>{384006168}));
    EXPECT_EQ(p.cfg.candidate_source_layer, -1);
    EXPECT_EQ(p.shards.size(), 2u + 4 + 1 + 3 + 1);  // the release's grouping with 4 layers, 1 table
    EXPECT_TRUE(p.shards[10].sparse);
    EXPECT_FALSE(p.shards[9].sparse);
    // config.json round trip: what readers parse is the plan's config.
    const ModelConfig back = parse_model_config(p.config_json, "config.json");
    EXPECT_EQ(back.engram_compressed_vocab_size, p.cfg.engram_compressed_vocab_size);
    EXPECT_GT(p.cfg.engram_compressed_vocab_size, 1000);
    EXPECT_LT(p.cfg.engram_compressed_vocab_size, 129280);
}

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

void check_tokenizer_json(const std::string& text, int64_t vocab_size) {
    const json t = json::parse(text);
    EXPECT_EQ(t["pre_tokenizer"]["type"], "ByteLevel");
    EXPECT_EQ(t["decoder"]["type"], "ByteLevel");
    EXPECT_EQ(t["model"]["type"], "BPE");
    const json& vocab = t["model"]["vocab"];
    const json& merges = t["model"]["merges"];
    EXPECT_EQ(static_cast<int64_t>(vocab.size()), vocab_size - 5);
    EXPECT_EQ(static_cast<int64_t>(merges.size()), vocab_size - 5 - 259);
    std::set<int64_t> ids;
    for (auto& [k, v] : vocab.items()) ids.insert(v.get<int64_t>());
    EXPECT_EQ(static_cast<int64_t>(ids.size()), vocab_size - 5);
    EXPECT_EQ(*ids.rbegin(), vocab_size - 6);
    // Every merge joins two earlier tokens into the next id.
    int64_t next = 259;
    for (const auto& m : merges) {
        const std::string a = m[0], b = m[1];
        ASSERT_TRUE(vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) << a << " + " << b;
        EXPECT_EQ(vocab[a + b].get<int64_t>(), next);
        EXPECT_LT(vocab[a].get<int64_t>(), next);
        EXPECT_LT(vocab[b].get<int64_t>(), next);
        ++next;
    }
    const json& added = t["added_tokens"];
    ASSERT_EQ(added.size(), 8u);
    EXPECT_EQ(added[0]["content"], "<｜begin▁of▁sentence｜>");
    EXPECT_EQ(added[1]["content"], "<｜end▁of▁sentence｜>");
    EXPECT_EQ(added[2]["content"], "<｜▁pad▁｜>");
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(added[static_cast<size_t>(i)]["id"], i);
        EXPECT_EQ(vocab[added[static_cast<size_t>(i)]["content"].get<std::string>()], i);
    }
    for (int i = 3; i < 8; ++i) {
        EXPECT_EQ(added[static_cast<size_t>(i)]["id"].get<int64_t>(), vocab_size - 8 + i);
        EXPECT_TRUE(added[static_cast<size_t>(i)]["special"].get<bool>());
    }
}

TEST(MakeTinyTokenizer, TinyVocabularyIsAValidByteLevelBpe) {
    const std::string text = make_tiny_tokenizer_json(512);
    check_tokenizer_json(text, 512);
    // The byte tokens have the ids of the golden tokenizer (and of the release): 3..258.
    const json mine = json::parse(text);
    const json gold =
        json::parse(read_text_file(test::data_dir() + "/tiny-a/model/tokenizer.json", 1u << 24));
    std::map<int64_t, std::string> gid, mid;
    for (auto& [k, v] : gold["model"]["vocab"].items()) gid[v.get<int64_t>()] = k;
    for (auto& [k, v] : mine["model"]["vocab"].items()) mid[v.get<int64_t>()] = k;
    for (int64_t id = 0; id < 259; ++id) EXPECT_EQ(mid[id], gid[id]) << id;
    // Byte tokens decode to their single byte; specials verbatim.
    const Tokenizer tok = Tokenizer::parse(text, "tokenizer.json");
    EXPECT_EQ(tok.size(), 512);
    EXPECT_EQ(tok.decode_one(3), "!");
    EXPECT_EQ(tok.decode_one(0), "<｜begin▁of▁sentence｜>");
    EXPECT_TRUE(tok.is_added(511));
    EXPECT_FALSE(tok.is_added(300));
    // The trained part makes real words ("Ġthe" = " the").
    EXPECT_TRUE(mine["model"]["vocab"].contains("Ġthe"));
    EXPECT_EQ(make_tiny_tokenizer_json(512), text);  // deterministic
    EXPECT_THROW(make_tiny_tokenizer_json(263), InputError);
}

TEST(MakeTinyTokenizer, FullWidthVocabularyIsAValidByteLevelBpe) {
    const std::string text = make_tiny_tokenizer_json(129280);
    check_tokenizer_json(text, 129280);
    const Tokenizer tok = Tokenizer::parse(text, "tokenizer.json");
    EXPECT_EQ(tok.size(), 129280);
}

// ---------------------------------------------------------------------------------------------
// Weights: quantization rules and statistics
// ---------------------------------------------------------------------------------------------

TEST(MakeTinyWeights, E8m0CeilScaleRoundsUpAndKeepsPowersOfTwo) {
    EXPECT_EQ(tiny::e8m0_ceil_scale(448.0f, 448.0f), 127);  // exactly 1
    EXPECT_EQ(tiny::e8m0_ceil_scale(449.0f, 448.0f), 128);  // just above: 2
    EXPECT_EQ(tiny::e8m0_ceil_scale(224.0f, 448.0f), 126);  // 0.5
    EXPECT_EQ(tiny::e8m0_ceil_scale(6.0f, 6.0f), 127);
    EXPECT_EQ(tiny::e8m0_ceil_scale(6.5f, 6.0f), 128);
    EXPECT_EQ(tiny::e8m0_ceil_scale(0.0f, 448.0f), 105);  // amax floor 1e-4: 1e-4/448 <= 2^-22
    EXPECT_EQ(tiny::e8m0_ceil_scale(0.0f, 6.0f), 1);      // floor 6 * 2^-126: 2^-126
}

TEST(MakeTinyWeights, NormalQuantilesAreStandardNormal) {
    const auto& q = tiny::normal_quantiles();
    ASSERT_EQ(q.size(), 32768u);
    EXPECT_TRUE(std::is_sorted(q.begin(), q.end()));
    EXPECT_NEAR(q[0], 1.9e-5, 1e-6);         // Phi^-1(0.5 + 0.5 / 65536)
    EXPECT_NEAR(q[16383], 0.6744897, 2e-4);  // ~ upper quartile
    EXPECT_NEAR(q[32767], 4.325, 0.005);     // Phi^-1(1 - 0.5 / 65536)
    double s2 = 0;
    for (float v : q) s2 += static_cast<double>(v) * v;
    EXPECT_NEAR(s2 / q.size(), 1.0, 2e-3);
}

TEST(MakeTinyWeights, BandsAreDeterministicAndSeedDependent) {
    TensorSpec w{"layers.0.attn.wq_a.weight", DType::F8_E4M3, {64, 256}, 0, TensorUse::Layer, false};
    TensorSpec s{"layers.0.attn.wq_a.scale", DType::F8_E8M0, {2, 8}, 0, TensorUse::Layer, false};
    ModelConfig cfg = make_tiny_base_config(TinyPreset::Tiny, 0);
    const tiny::TensorRecipe r = tiny::make_recipe(w, &s, cfg);
    EXPECT_EQ(r.bands(), 2);
    tiny::BandScratch scratch;
    std::vector<uint8_t> a(32 * 256), b(32 * 256), c(32 * 256), sa(8), sb(8), sc(8);
    tiny::generate_band(r, 7, 1, a.data(), sa.data(), scratch);
    tiny::generate_band(r, 7, 1, b.data(), sb.data(), scratch);
    tiny::generate_band(r, 8, 1, c.data(), sc.data(), scratch);
    EXPECT_EQ(a, b);
    EXPECT_EQ(sa, sb);
    EXPECT_NE(a, c);
    // A missing or misshaped scale is refused.
    EXPECT_THROW(tiny::make_recipe(w, nullptr, cfg), RuntimeError);
    TensorSpec bad = s;
    bad.shape = {2, 4};
    EXPECT_THROW(tiny::make_recipe(w, &bad, cfg), RuntimeError);
}

// The fast path (quantizing in the draw domain through code tables) gives exactly the bytes of
// quantizing the drawn values with numeric.h's converters.
TEST(MakeTinyWeights, FastQuantizationEqualsTheReference) {
    const ModelConfig cfg = make_tiny_base_config(TinyPreset::FullWidth, 4);
    struct Case {
        TensorSpec w, s;
    };
    const std::vector<Case> cases = {
        {{"layers.0.attn.wo_b.weight", DType::F8_E4M3, {70, 8192}, 0, TensorUse::Layer, false},
         {"layers.0.attn.wo_b.scale", DType::F8_E8M0, {3, 256}, 0, TensorUse::Layer, false}},
        {{"layers.0.ffn.experts.7.w2.weight", DType::I8, {40, 1152}, 0, TensorUse::Layer, false},
         {"layers.0.ffn.experts.7.w2.scale", DType::F8_E8M0, {40, 72}, 0, TensorUse::Layer, false}},
        {{"layers.1.engram.embed.weight", DType::F8_E4M3, {33, 256}, 1, TensorUse::EngramTable, false},
         {"layers.1.engram.embed.scale", DType::F8_E8M0, {33, 8}, 1, TensorUse::EngramTable, false}},
    };
    for (const auto& cs : cases) {
        SCOPED_TRACE(cs.w.name);
        const tiny::TensorRecipe r = tiny::make_recipe(cs.w, &cs.s, cfg);
        ASSERT_GE(r.bands(), 2);
        ASSERT_LT(r.band_rows(r.bands() - 1), 32);  // full bands and a short one
        for (int64_t b = 0; b < r.bands(); ++b) {
            const size_t wn = static_cast<size_t>(r.band_rows(b)) * r.weight_row_bytes(),
                         sn = r.scale_band_bytes(b);
            std::vector<uint8_t> wf(wn), wr(wn), sf(sn), sr(sn);
            tiny::BandScratch s1, s2;
            tiny::generate_band(r, 42, b, wf.data(), sf.data(), s1, true);
            tiny::generate_band(r, 42, b, wr.data(), sr.data(), s2, false);
            EXPECT_EQ(wf, wr);
            EXPECT_EQ(sf, sr);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Written checkpoints
// ---------------------------------------------------------------------------------------------

TEST(MakeTinyWrite, TinyCheckpointMatchesTheBinding) {
    const std::string dir = test::temp_dir("make-tiny") + "/model";
    const MakeTinyResult r = make(dir, TinyPreset::Tiny, 0, 0);
    for (const char* f : {"config.json", "tokenizer.json", "model.safetensors.index.json", "README.txt"})
        EXPECT_TRUE(file_exists(path_join(dir, f))) << f;
    EXPECT_EQ(r.files.size(), 4u + 10u);
    check_layout(dir, 6);
    // No temporary file is left behind.
    for (const auto& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
    // The checkpoint module validates it too.
    const Checkpoint ck = Checkpoint::open(dir);
    EXPECT_EQ(ck.config().n_layers, 6);
    EXPECT_EQ(ck.total_bytes(), r.plan.total_tensor_bytes);
}

TEST(MakeTinyWrite, TruncatedToThreeLayers) {
    const std::string dir = test::temp_dir("make-tiny-3") + "/model";
    make(dir, TinyPreset::Tiny, 3, 0);
    check_layout(dir, 3);
    const Checkpoint ck = Checkpoint::open(dir);
    EXPECT_EQ(ck.roles().size(), 3u);
    // A truncated model repeats the first layers of the full one byte for byte.
    const std::string full = test::temp_dir("make-tiny-6") + "/model";
    make(full, TinyPreset::Tiny, 6, 0);
    EXPECT_EQ(read_whole_file(dir + "/model-00002-of-00007.safetensors", 1u << 24),
              read_whole_file(full + "/model-00002-of-00010.safetensors", 1u << 24));
    EXPECT_EQ(read_whole_file(dir + "/model-00001-of-00007.safetensors", 1u << 24),
              read_whole_file(full + "/model-00001-of-00010.safetensors", 1u << 24));
}

TEST(MakeTinyWrite, SameSeedSameBytesRegardlessOfThreads) {
    const std::string base = test::temp_dir("make-tiny-seed");
    make(base + "/a", TinyPreset::Tiny, 0, 5, /*threads=*/1);
    make(base + "/b", TinyPreset::Tiny, 0, 5, /*threads=*/4);
    make(base + "/c", TinyPreset::Tiny, 0, 6, /*threads=*/2);
    const auto a = read_dir(base + "/a"), b = read_dir(base + "/b"), c = read_dir(base + "/c");
    ASSERT_EQ(a.size(), 14u);
    EXPECT_EQ(a, b);
    ASSERT_EQ(c.size(), a.size());
    for (auto& [name, bytes] : a) {
        if (name.rfind("model-", 0) == 0) {
            EXPECT_NE(bytes, c.at(name)) << name;  // every shard has random bytes that change with the seed
        } else if (name != "README.txt") {
            EXPECT_EQ(bytes, c.at(name)) << name;  // config, tokenizer, index do not depend on the seed
        }
    }
}

TEST(MakeTinyWrite, RefusesANonEmptyDirectoryWithoutForce) {
    const std::string dir = test::temp_dir("make-tiny-force");
    { std::ofstream(dir + "/model-00099-of-00099.safetensors") << "stale"; }
    EXPECT_THROW(make(dir, TinyPreset::Tiny, 1, 0), InputError);
    EXPECT_FALSE(file_exists(dir + "/config.json"));
    make(dir, TinyPreset::Tiny, 1, 0, 0, /*force=*/true);
    EXPECT_FALSE(file_exists(dir + "/model-00099-of-00099.safetensors"));  // stale shard removed
    check_layout(dir, 1);
    const std::string file = test::temp_dir("make-tiny-file") + "/f";
    { std::ofstream(file) << "x"; }
    EXPECT_THROW(make(file, TinyPreset::Tiny, 1, 0), InputError);
}

// The weight statistics: activations should neither vanish nor explode through random layers, so
// every kind of tensor must have the spread the reference generator gives it, and quantization must
// use its range (no saturated or NaN codes, scales that fit the block).
TEST(MakeTinyWrite, WeightStatisticsAreSane) {
    const std::string dir = test::temp_dir("make-tiny-stats") + "/model";
    const MakeTinyResult r = make(dir, TinyPreset::Tiny, 0, 11);
    const MakeTinyPlan& p = r.plan;
    std::map<std::string, StFile> files;
    for (const auto& sh : p.shards) files[sh.file] = read_st(path_join(dir, sh.file));
    auto shard_of = [&](const std::string& name) -> const StFile& {
        for (const auto& sh : p.shards)
            for (size_t i : sh.tensors)
                if (p.specs[i].name == name) return files.at(sh.file);
        throw std::runtime_error("no shard for " + name);
    };
    // Group relative moments: value / expected std, per kind.
    std::map<std::string, Moments> kind;
    size_t fp8_blocks = 0, fp4_blocks = 0;
    for (const TensorSpec& s : p.specs) {
        if (s.dtype == DType::F8_E8M0) continue;
        SCOPED_TRACE(s.name);
        const StFile& f = shard_of(s.name);
        const uint8_t* d = tensor_data(f, s.name);
        const int64_t n = shape_numel(s.shape);
        const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1;
        const int64_t stored_cols = s.shape.back();
        // Kind: the name without the layer and expert numbers ("ffn.experts.E.w1.weight").
        const std::string k =
            std::regex_replace(std::regex_replace(s.name, std::regex(R"(^layers\.\d+\.)"), ""),
                               std::regex(R"(experts\.\d+\.)"), "experts.E.");
        std::vector<double> v(static_cast<size_t>(s.dtype == DType::I8 ? 2 * n : n));
        if (s.dtype == DType::BF16) {
            for (int64_t i = 0; i < n; ++i)
                v[static_cast<size_t>(i)] =
                    bf16_to_f32(static_cast<uint16_t>(d[2 * i] | (d[2 * i + 1] << 8)));
        } else if (s.dtype == DType::F32) {
            for (int64_t i = 0; i < n; ++i) {
                float x;
                std::memcpy(&x, d + 4 * i, 4);
                v[static_cast<size_t>(i)] = x;
            }
        } else {
            const std::string sname = s.name.substr(0, s.name.size() - 6) + "scale";
            const uint8_t* sc = tensor_data(f, sname);
            const Shape& ssh = f.tensors.at(sname).shape;
            for (int64_t i = 0; i < ssh[0] * ssh[1]; ++i) {
                ASSERT_NE(sc[i], 0xff) << "NaN e8m0 scale";
                ASSERT_GT(sc[i], 90);
                ASSERT_LT(sc[i], 140);
            }
            if (s.dtype == DType::F8_E4M3) {
                const bool row_scaled = s.use == TensorUse::EngramTable;
                std::map<std::pair<int64_t, int64_t>, float> block_max;
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < stored_cols; ++j) {
                        const uint8_t code = d[i * stored_cols + j];
                        ASSERT_NE(code & 0x7f, 0x7f) << "NaN e4m3 code";
                        const float q = e4m3_to_f32(code);
                        const int64_t br = row_scaled ? i : i / 32;
                        auto& m = block_max[{br, j / 32}];
                        m = std::max(m, std::fabs(q));
                        v[static_cast<size_t>(i * stored_cols + j)] =
                            q * e8m0_to_f32(sc[br * ssh[1] + j / 32]);
                    }
                // Scale 2^ceil(log2(amax/448)): the largest code of every block is in [224, 448].
                for (auto& [b, m] : block_max) {
                    EXPECT_GE(m, 224.0f);
                    EXPECT_LE(m, 448.0f);
                }
                fp8_blocks += block_max.size();
            } else {  // I8: two e2m1 codes per byte, even element in the low nibble
                const int64_t K = 2 * stored_cols;
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t bk = 0; bk < K / 32; ++bk) {
                        float m = 0;
                        for (int64_t j = bk * 32; j < bk * 32 + 32; ++j) {
                            const uint8_t byte = d[i * stored_cols + j / 2];
                            const float q = e2m1_to_f32(j % 2 == 0 ? (byte & 15) : (byte >> 4));
                            m = std::max(m, std::fabs(q));
                            v[static_cast<size_t>(i * K + j)] = q * e8m0_to_f32(sc[i * (K / 32) + bk]);
                        }
                        EXPECT_GE(m, 3.0f);  // amax / scale in (3, 6]
                        ++fp4_blocks;
                    }
            }
        }
        const tiny::WeightInit init = tiny::weight_init_for(s, p.cfg);
        auto& mo = kind[k];
        for (double x : v) {
            ASSERT_TRUE(std::isfinite(x));
            if (init.dist == tiny::WeightInit::Normal)
                mo.add((x - init.a) / init.b);
            else
                mo.add(x);
        }
    }
    EXPECT_GT(fp8_blocks, 1000u);
    EXPECT_GT(fp4_blocks, 10000u);
    for (auto& [k, m] : kind) {
        SCOPED_TRACE(k);
        if (k.find("hc_attn_scale") != std::string::npos || k.find("hc_ffn_scale") != std::string::npos) {
            EXPECT_NEAR(m.mean(), 0.75, 0.1);  // U(0.5, 1)
            EXPECT_NEAR(m.std(), 0.144, 0.06);
            continue;
        }
        // Normalized to N(0, 1): few values (attn_sink: 24) get a wide band.
        const double tol = m.n < 100 ? 0.4 : m.n < 3000 ? 0.12 : 0.06;
        EXPECT_NEAR(m.mean(), 0.0, tol) << m.n;
        EXPECT_NEAR(m.std(), 1.0, tol) << m.n;
    }
    EXPECT_TRUE(kind.count("ffn.experts.E.w1.weight") && kind.count("attn.wq_a.weight") &&
                kind.count("embed.weight"));
}

// ---------------------------------------------------------------------------------------------
// The streaming writer
// ---------------------------------------------------------------------------------------------

TEST(SafetensorsWriter, WritesChunksAndSparseHoles) {
    const std::string dir = test::temp_dir("st-writer");
    const std::string path = dir + "/x.safetensors";
    const uint64_t big = 64ull << 20;  // a 64 MiB hole
    {
        SafetensorsWriter w(path, plan_safetensors({{"z.weight", DType::F8_E4M3, {static_cast<int64_t>(big)}},
                                                    {"a", DType::F32, {3}},
                                                    {"m", DType::BF16, {2, 2}}}));
        const auto& L = w.layout();
        ASSERT_EQ(L.entries[0].name, "a");  // sorted by name
        EXPECT_EQ(L.data_start % 8, 0u);
        EXPECT_FALSE(file_exists(path));  // only the temporary exists until commit
        const float a[3] = {1, 2, 3};
        w.write(0, 0, a, 4);
        EXPECT_THROW(w.write(0, 8, a, 4), RuntimeError);  // out of order
        w.write(0, 4, a + 1, 8);
        EXPECT_THROW(w.write(0, 12, a, 4), RuntimeError);  // past the end
        EXPECT_THROW(w.commit(), RuntimeError);            // "m" incomplete
        const uint16_t m[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
        w.write(1, 0, m, 8);
        w.leave_zero(2);
        w.commit();
    }
    const auto bytes = read_whole_file(path, big + (1u << 20));
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[static_cast<size_t>(i)]) << (8 * i);
    const json h = json::parse(bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(8 + n));
    EXPECT_EQ(h["a"]["data_offsets"], json({0, 12}));
    EXPECT_EQ(h["m"]["data_offsets"], json({12, 20}));
    EXPECT_EQ(h["z.weight"]["dtype"], "F8_E4M3");
    EXPECT_EQ(bytes.size(), 8 + n + 20 + big);
    float back[3];
    std::memcpy(back, bytes.data() + 8 + n, 12);
    EXPECT_EQ(back[2], 3.0f);
    EXPECT_TRUE(std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(8 + n + 20), bytes.end(),
                            [](uint8_t b) { return b == 0; }));
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, big / 4) << "the zero tensor should be a hole";
    // Destroyed without commit: nothing is left behind.
    { SafetensorsWriter w(dir + "/y.safetensors", plan_safetensors({{"a", DType::F32, {1}}})); }
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
    EXPECT_THROW(plan_safetensors({{"a", DType::F32, {1}}, {"a", DType::F32, {2}}}), RuntimeError);
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

TEST(MakeTinyCli, WritesACheckpointThatInspectAccepts) {
    const std::string dir = test::temp_dir("make-tiny-cli") + "/m";
    std::string out;
    int rc = test::run_command(test::binary_path() + " make-tiny " + dir + " --seed 3 --layers 2", &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("make-tiny: wrote"), std::string::npos) << out;
    check_layout(dir, 2);
    // Non-empty directory without --force: a usage error (exit 2), nothing overwritten.
    rc = test::run_command(test::binary_path() + " make-tiny " + dir, &out);
    EXPECT_EQ(rc, 2) << out;
    rc = test::run_command(test::binary_path() + " make-tiny " + dir + " --preset huge", &out);
    EXPECT_EQ(rc, 2) << out;
    rc = test::run_command(test::binary_path() + " inspect --model " + dir, &out);
    EXPECT_EQ(rc, 0) << out;
}

// True when `dir`'s filesystem keeps holes (a 1 GiB ftruncate allocates almost nothing).
bool holes_supported(const std::string& dir) {
    const std::string f = dir + "/hole-probe";
    { std::ofstream o(f); }
    std::filesystem::resize_file(f, uint64_t{1} << 30);
    struct stat st {};
    const bool ok =
        ::stat(f.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_blocks) * 512 < (uint64_t{1} << 20);
    std::filesystem::remove(f);
    return ok;
}

// The released scale (40 full-width layers, ~500 GB in the release's 48 shards) as headers plus holes:
// make-tiny writes it and inspect validates every header, offset and binding of it (docs/DESIGN.md section
// 6).
TEST(MakeTinyCli, HeadersOnlyCheckpointOfTheReleasedScaleInspects) {
    const std::string base = test::temp_dir("make-tiny-headers");
    if (!holes_supported(base)) GTEST_SKIP() << base << ": this filesystem does not keep sparse files";
    const std::string dir = base + "/m";
    std::string out;
    int rc = test::run_command(
        test::binary_path() + " make-tiny " + dir + " --preset full-width --layers 40 --headers-only", &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("HEADERS ONLY"), std::string::npos) << out;
    uint64_t on_disk = 0, apparent = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        struct stat st {};
        ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
        on_disk += static_cast<uint64_t>(st.st_blocks) * 512;
        apparent += static_cast<uint64_t>(st.st_size);
    }
    EXPECT_GT(apparent, 490ull * 1000 * 1000 * 1000);
    EXPECT_LT(on_disk, 200ull << 20) << "holes, not data";
    rc = test::run_command(test::binary_path() + " inspect --model " + dir, &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("40 layers"), std::string::npos) << out;
    EXPECT_NE(out.find("93422 tensors, 48 shards"), std::string::npos) << out;
    EXPECT_TRUE(std::filesystem::exists(dir + "/model-00048-of-00048.safetensors"));
    EXPECT_NE(out.find("weights:          ZEROS"), std::string::npos) << out;  // marked in the headers
    EXPECT_NE(out.find("checkpoint OK"), std::string::npos) << out;
}

// Every tensor of every preset's plan has an initialization rule (the full-width release grouping's
// vision / MTP placeholders included): writing weights never stops on a name the rules miss.
TEST(MakeTinyPlan, EveryTensorOfEveryPresetHasAnInitRule) {
    for (TinyPreset preset : {TinyPreset::Tiny, TinyPreset::FullWidth, TinyPreset::TinyRoles}) {
        const MakeTinyPlan p = plan_make_tiny(preset, preset == TinyPreset::FullWidth ? 40 : 0);
        for (const TensorSpec& s : p.specs)  // e8m0 scales are derived from their weights, not drawn
            if (s.dtype != DType::F8_E8M0) {
                EXPECT_NO_THROW(tiny::weight_init_for(s, p.cfg)) << s.name;
            }
    }
}
