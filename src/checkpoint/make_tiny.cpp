// make-tiny: presets, config.json / index rendering, the plan, and the streaming checkpoint writer.
#include "ds4r/make_tiny.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "checkpoint/make_tiny_weights.h"
#include "checkpoint/safetensors_writer.h"
#include "ds4r/engram.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/tokenizer.h"
#include "ds4r/zero_weights.h"

namespace ds4r {

namespace fs = std::filesystem;

std::optional<TinyPreset> tiny_preset_from_name(std::string_view name) {
    if (name == "tiny") return TinyPreset::Tiny;
    if (name == "full-width") return TinyPreset::FullWidth;
    if (name == "tiny-roles") return TinyPreset::TinyRoles;
    return std::nullopt;
}

const char* tiny_preset_name(TinyPreset p) {
    return p == TinyPreset::Tiny ? "tiny" : p == TinyPreset::TinyRoles ? "tiny-roles" : "full-width";
}

int tiny_preset_default_layers(TinyPreset p) {
    return p == TinyPreset::Tiny ? 6 : p == TinyPreset::TinyRoles ? 8 : 4;
}

namespace {

// Keeps the ids < n of a layer list (the --layers truncation).
std::vector<int> below(std::vector<int> v, int n) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](int x) { return x >= n; }), v.end());
    return v;
}

// The full model's layer list lengths: the presets describe a 6-layer (tiny), 8-layer (tiny-roles)
// or 40-layer model.
int preset_max_layers(TinyPreset p) {
    return p == TinyPreset::Tiny ? 6 : p == TinyPreset::TinyRoles ? 8 : 40;
}

bool is_prime(int64_t n) {
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (int64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return false;
    return true;
}

// Rows of each Engram table = the sum of its layer's hash primes (docs/MODEL.md 4.2 "Layout"): for every
// layer and n-gram size the search restarts at engram_vocab_size - 1; each head takes the next prime
// not yet used by any layer.
std::vector<int64_t> engram_table_rows(const ModelConfig& c) {
    std::set<int64_t> seen;
    std::vector<int64_t> rows;
    for (size_t li = 0; li < c.engram_layer_ids.size(); ++li) {
        int64_t total = 0;
        for (int64_t g = 0; g < c.engram_ngram_groups(); ++g) {
            int64_t cur = c.engram_vocab_size - 1;
            for (int64_t h = 0; h < c.engram_n_heads; ++h) {
                int64_t p = cur + 1;
                while (!is_prime(p) || seen.count(p)) ++p;
                seen.insert(p);
                total += p;
                cur = p;
            }
        }
        rows.push_back(total);
    }
    return rows;
}

}  // namespace

ModelConfig make_tiny_base_config(TinyPreset preset, int layers) {
    const int max_layers = preset_max_layers(preset);
    if (layers <= 0) layers = tiny_preset_default_layers(preset);
    if (layers > max_layers)
        DS4R_THROW(InputError, "make-tiny: --layers %d is more than the %s preset's %d layers", layers,
                   tiny_preset_name(preset), max_layers);
    ModelConfig c;
    c.form = "hf";
    c.n_mtp_layers = 0;
    c.n_shared_experts = 1;
    c.score_func = "sqrtsoftplus";
    c.route_scale = 1.5;
    c.swiglu_limit = 10.0;
    c.norm_eps = 1e-20;
    c.rope_theta = 10000.0;
    c.compress_rope_theta = 160000.0;
    c.rope_factor = 16;
    c.beta_fast = 32;
    c.beta_slow = 1;
    c.hc_mult = 4;
    c.hc_sinkhorn_iters = 20;
    c.hc_eps = 1e-6;
    c.engram_max_ngram_size = 4;
    c.engram_pad_id = 2;
    std::vector<int> ratios, kv, index, engram;
    if (preset == TinyPreset::Tiny || preset == TinyPreset::TinyRoles) {
        // The golden tiny-a (tests/data/tiny-a/meta.json).
        c.vocab_size = 512;
        c.dim = 256;
        c.moe_inter_dim = 128;
        c.n_heads = 4;
        c.head_dim = 64;
        c.rope_head_dim = 16;
        c.q_lora_rank = 64;
        c.o_groups = 2;
        c.o_lora_rank = 32;
        c.window_size = 16;
        c.n_routed_experts = 16;
        c.n_activated_experts = 6;
        c.original_seq_len = 32;
        c.max_position_embeddings = 512;
        ratios = {0, 2, 2, 1, 1, 1};
        kv = {1, 3};
        index = {1, 3, 5};
        c.index_n_heads = 4;
        c.index_head_dim = 64;
        c.index_topk = 8;
        c.candidate_source_layer = 3;
        c.candidate_topk_blocks = 3;
        c.candidate_block_size = 4;
        engram = {0, 1};
        c.engram_vocab_size = 100;
        c.engram_n_heads = 2;
        c.engram_head_dim = 64;
        if (preset == TinyPreset::TinyRoles) {
            // tiny-a's dimensions with another role pattern (issue 10), one the reference runs: a
            // key-less indexer (4) before the candidate source (5), so it scores without candidates
            // and with layer 2's keys; 6 reuses 5's top-k; 7 is a key-less indexer inside 5's pool.
            ratios = {0, 0, 2, 2, 2, 1, 1, 1};
            kv = {2, 5};
            index = {2, 4, 5, 7};
            c.candidate_source_layer = 5;
        }
    } else {
        // The release (docs/MODEL.md 2.1).
        c.vocab_size = 129280;
        c.dim = 5120;
        c.moe_inter_dim = 2304;
        c.n_heads = 64;
        c.head_dim = 512;
        c.rope_head_dim = 64;
        c.q_lora_rank = 1280;
        c.o_groups = 8;
        c.o_lora_rank = 1024;
        c.window_size = 128;
        c.n_routed_experts = 384;
        c.n_activated_experts = 6;
        c.original_seq_len = 65536;
        c.max_position_embeddings = 1048576;
        for (int l = 0; l < 40; ++l) ratios.push_back(l < 2 ? 0 : l < 20 ? 2 : 1);
        kv = {2, 8, 14, 20};
        index = {2, 8, 14, 20, 24, 28, 32, 36};
        c.index_n_heads = 32;
        c.index_head_dim = 128;
        c.index_topk = 512;
        c.candidate_source_layer = 20;
        c.candidate_topk_blocks = 2048;
        c.candidate_block_size = 8;
        engram = {1, 14};
        c.engram_vocab_size = 16000000;
        c.engram_n_heads = 8;
        c.engram_head_dim = 256;
    }
    c.n_layers = layers;
    c.compress_ratios.assign(ratios.begin(), ratios.begin() + layers);
    c.kv_source_layers = below(kv, layers);
    c.index_source_layers = below(index, layers);
    c.engram_layer_ids = below(engram, layers);
    if (c.candidate_source_layer >= layers) c.candidate_source_layer = -1;
    return c;
}

std::string make_tiny_config_json(const ModelConfig& c) {
    using oj = nlohmann::ordered_json;
    const bool full = c.dim == 5120;
    // Integral values as JSON integers (the release writes "factor": 16, not 16.0).
    auto num = [](double v) -> oj {
        if (v == static_cast<double>(static_cast<int64_t>(v))) return static_cast<int64_t>(v);
        return v;
    };
    oj root;
    root["architectures"] = {"DeepseekV41ForCausalLM"};
    root["model_type"] = "deepseek_v41";
    root["dtype"] = "bfloat16";
    root["transformers_version"] = "5.6.0";
    root["bos_token_id"] = c.bos_token_id;
    root["eos_token_id"] = c.eos_token_id;
    root["pad_token_id"] = c.pad_token_id;
    root["quantization_config"] = {{"quant_method", "fp8"},
                                   {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {c.weight_block_size, c.weight_block_size}},
                                   {"scale_fmt", "ue8m0"},
                                   {"expert_dtype", "fp4"}};
    oj t;
    t["model_type"] = "deepseek_v41_text";
    t["vocab_size"] = c.vocab_size;
    t["hidden_size"] = c.dim;
    t["moe_intermediate_size"] = c.moe_inter_dim;
    t["num_hidden_layers"] = c.n_layers;
    t["num_attention_heads"] = c.n_heads;
    t["num_key_value_heads"] = 1;
    t["head_dim"] = c.head_dim;
    t["qk_rope_head_dim"] = c.rope_head_dim;
    t["q_lora_rank"] = c.q_lora_rank;
    t["o_lora_rank"] = c.o_lora_rank;
    t["o_groups"] = c.o_groups;
    t["hidden_act"] = "silu";
    t["swiglu_limit"] = c.swiglu_limit;
    t["rms_norm_eps"] = c.norm_eps;
    t["attention_bias"] = false;
    t["attention_dropout"] = 0.0;
    t["initializer_range"] = 0.02;
    t["use_cache"] = true;
    t["tie_word_embeddings"] = false;
    t["max_position_embeddings"] = c.max_position_embeddings;
    t["rope_theta"] = c.rope_theta;
    t["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", num(c.rope_factor)},
                         {"beta_fast", num(c.beta_fast)},
                         {"beta_slow", num(c.beta_slow)},
                         {"original_max_position_embeddings", c.original_seq_len}};
    t["n_routed_experts"] = c.n_routed_experts;
    t["n_shared_experts"] = c.n_shared_experts;
    t["num_experts_per_tok"] = c.n_activated_experts;
    t["scoring_func"] = c.score_func;
    t["topk_method"] = "noaux_tc";
    t["norm_topk_prob"] = c.norm_topk_prob;
    t["routed_scaling_factor"] = c.route_scale;
    t["sliding_window"] = c.window_size;
    t["compress_ratios"] = c.compress_ratios;
    t["compress_rope_theta"] = c.compress_rope_theta;
    t["kv_source_layer_ids"] = c.kv_source_layers;
    t["index_source_layer_ids"] = c.index_source_layers;
    t["index_n_heads"] = c.index_n_heads;
    t["index_head_dim"] = c.index_head_dim;
    t["index_topk"] = c.index_topk;
    t["candidate_source_layer_id"] = c.candidate_source_layer;
    t["candidate_topk_blocks"] = c.candidate_topk_blocks;
    t["candidate_block_size"] = c.candidate_block_size;
    t["hc_mult"] = c.hc_mult;
    t["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
    t["hc_eps"] = c.hc_eps;
    t["engram_layer_ids"] = c.engram_layer_ids;
    t["engram_num_embeddings"] = c.engram_num_embeddings;
    t["engram_max_ngram_size"] = c.engram_max_ngram_size;
    t["engram_vocab_size"] = c.engram_vocab_size;
    t["engram_n_heads"] = c.engram_n_heads;
    t["engram_head_dim"] = c.engram_head_dim;
    t["engram_pad_token_id"] = c.engram_pad_id;
    t["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
    // No MTP / DSpark blocks are written (the prefill never reads them, docs/MODEL.md 3.5); the DSpark
    // keys keep the release's values (target layers truncated like every layer list).
    t["num_nextn_predict_layers"] = 0;
    t["dspark_block_size"] = 5;
    t["dspark_noise_token_id"] = full ? int64_t{128799} : c.vocab_size - 6;
    t["dspark_target_layer_ids"] =
        full ? below({37, 38, 39}, static_cast<int>(c.n_layers)) : std::vector<int>{};
    t["dspark_markov_rank"] = full ? 256 : 16;
    t["dspark_n_routed_experts"] = full ? int64_t{128} : c.n_routed_experts;
    t["dspark_num_experts_per_tok"] = 3;
    root["text_config"] = std::move(t);
    return root.dump(2) + "\n";
}

uint64_t MakeTinyPlan::layer_bytes(int layer) const {
    uint64_t n = 0;
    for (const auto& s : specs)
        if (s.layer == layer && s.use != TensorUse::EngramTable)
            n += dtype_size(s.dtype) * static_cast<uint64_t>(shape_numel(s.shape));
    return n;
}

MakeTinyPlan plan_make_tiny(TinyPreset preset, int layers, int64_t engram_rows) {
    MakeTinyPlan p;
    p.preset = preset;
    ModelConfig c = make_tiny_base_config(preset, layers);
    if (engram_rows > 0) {
        // Each table's rows are the sum of n_groups x n_heads primes just above engram_vocab_size.
        const int64_t primes = c.engram_ngram_groups() * c.engram_n_heads;
        if (engram_rows < primes * 4 || engram_rows > (int64_t{1} << 40))
            DS4R_THROW(InputError, "make-tiny: --engram-rows %lld: expected %lld .. 2^40",
                       (long long)engram_rows, (long long)(primes * 4));
        c.engram_vocab_size = engram_rows / primes;
    }
    p.tokenizer_json = make_tiny_tokenizer_json(c.vocab_size);
    const Tokenizer tok = Tokenizer::parse(p.tokenizer_json, "tokenizer.json");
    DS4R_CHECK(tok.size() == c.vocab_size, "make-tiny: generated tokenizer has %lld ids, expected %lld",
               (long long)tok.size(), (long long)c.vocab_size);
    // The compressed vocab is whatever this tokenizer's normalized keys count (docs/MODEL.md 4.2): the
    // real tokenizer's 99,092 does not apply to a synthetic vocabulary.
    c.engram_compressed_vocab_size =
        build_engram_token_map(tok, c, "tokenizer.json", /*check=*/false).num_keys;
    if (!c.engram_layer_ids.empty()) {
        c.engram_num_embeddings = engram_table_rows(c);
        // The hashing module's own layout must agree (it throws, naming the layer, if not).
        DS4R_CHECK(build_engram_layout(c).table_rows == c.engram_num_embeddings,
                   "make-tiny: Engram table rows disagree with build_engram_layout");
    }
    p.config_json = make_tiny_config_json(c);
    // What readers will see: the config parsed back, roles derived from it.
    p.cfg = parse_model_config(p.config_json, "config.json");
    p.roles = derive_layer_roles(p.cfg, "config.json");
    p.specs = all_tensor_specs(p.cfg, p.roles);

    const int L = static_cast<int>(p.cfg.n_layers);
    const int n_tables = static_cast<int>(p.cfg.engram_layer_ids.size());
    // full-width follows the release's shard grouping (docs/MODEL.md 3.1): 1 vision + aligner,
    // 2 embed, one shard per layer (layer L in shard L + 3), head + norm, mtp.0..2, then the Engram
    // tables (48 shards at 40 layers). The vision and MTP tensors are not generated (a prefill never
    // reads them): their shards hold one small placeholder tensor each, so that every shard of the
    // set is listed in the index. tiny keeps the golden tiny-a's grouping (no vision / MTP shards).
    const bool release_grouping = preset == TinyPreset::FullWidth;
    const int lead = release_grouping ? 2 : 1;  // shards before layer 0's
    const int n_mtp = release_grouping ? 3 : 0;
    const int head_shard = lead + L, first_table = lead + L + 1 + n_mtp;
    const int total = first_table + n_tables;
    auto shard_name = [&](int k) {
        char b[64];
        std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", k, total);
        return std::string(b);
    };
    p.shards.resize(static_cast<size_t>(total));
    for (int k = 0; k < total; ++k) p.shards[static_cast<size_t>(k)].file = shard_name(k + 1);
    for (int k = 0; k < n_tables; ++k) {
        p.shards[static_cast<size_t>(first_table + k)].sparse =
            preset == TinyPreset::FullWidth && engram_rows <= 0;
        p.shards[static_cast<size_t>(first_table + k)].random_table = engram_rows > 0;
    }
    std::vector<size_t> shard_of_spec(p.specs.size());
    for (size_t i = 0; i < p.specs.size(); ++i) {
        const TensorSpec& s = p.specs[i];
        if (s.name == "embed.weight")
            shard_of_spec[i] = static_cast<size_t>(lead - 1);
        else if (s.layer < 0)
            shard_of_spec[i] = static_cast<size_t>(head_shard);  // head + final norm
        else if (s.use == TensorUse::EngramTable)
            shard_of_spec[i] = static_cast<size_t>(first_table + p.cfg.engram_index(s.layer));
        else
            shard_of_spec[i] = static_cast<size_t>(lead + s.layer);
    }
    if (release_grouping) {
        // Placeholders (unused by the prefill, like the release's tensors of these shards): appended
        // last so that the generated tensors' bytes do not depend on them.
        auto placeholder = [&](const std::string& name, int shard) {
            p.specs.push_back({name, DType::BF16, {p.cfg.dim}, -1, TensorUse::Global, /*optional=*/true});
            shard_of_spec.push_back(static_cast<size_t>(shard));
        };
        placeholder("vision.make_tiny_placeholder", 0);
        for (int m = 0; m < n_mtp; ++m)
            placeholder("mtp." + std::to_string(m) + ".make_tiny_placeholder", head_shard + 1 + m);
    }
    for (size_t i = 0; i < p.specs.size(); ++i) {
        const TensorSpec& s = p.specs[i];
        const size_t k = shard_of_spec[i];
        const uint64_t bytes = dtype_size(s.dtype) * static_cast<uint64_t>(shape_numel(s.shape));
        p.shards[k].tensors.push_back(i);
        p.shards[k].tensor_bytes += bytes;
        p.total_tensor_bytes += bytes;
        if (p.shards[k].sparse) p.sparse_bytes += bytes;
    }
    return p;
}

std::string make_tiny_index_json(const MakeTinyPlan& p) {
    nlohmann::json weight_map = nlohmann::json::object();  // std::map: names sorted
    for (const auto& sh : p.shards)
        for (size_t i : sh.tensors) weight_map[p.specs[i].name] = sh.file;
    nlohmann::json root;
    root["metadata"] = {{"total_size", p.total_tensor_bytes}};
    root["weight_map"] = std::move(weight_map);
    return root.dump(2) + "\n";
}

namespace {

constexpr uint64_t kWindowBytes = 64ull << 20;  // generated bytes per thread-pool round

void write_text_file(const std::string& path, const std::string& text) {
    AtomicFileWriter w(path);
    w.write(text);
    w.commit();
}

// Writes are issued one at a time on a background thread, so generation of the next window
// overlaps the write of the previous one.
class AsyncWrites {
public:
    void submit(std::function<void()> fn) {
        wait();
        pending_ = std::async(std::launch::async, std::move(fn));
    }
    void wait() {
        if (pending_.valid()) pending_.get();
    }
    ~AsyncWrites() {
        if (pending_.valid()) pending_.wait();
    }

private:
    std::future<void> pending_;
};

struct ShardWriteState {
    SafetensorsWriter* writer;
    AsyncWrites* writes;
    tiny::WorkerPool* pool;
    std::vector<tiny::BandScratch>* scratch;  // [workers]
    std::vector<uint8_t>* buffers;            // [2] window buffers, alternated
    int* next_buffer;
    std::atomic<uint64_t>* bytes_done;
    std::function<void()> report;
};

// Generates one value tensor (+ its scale) band by band into the shard.
void write_tensor(ShardWriteState& st, const tiny::TensorRecipe& r, size_t wi, int64_t si, uint64_t seed) {
    std::vector<uint8_t> scales(r.has_scale ? static_cast<size_t>(shape_numel(r.scale.shape)) : 0);
    const int64_t bands = r.bands();
    int64_t b = 0;
    while (b < bands) {
        int64_t e = b;
        uint64_t bytes = 0;
        while (e < bands) {
            const uint64_t nb = static_cast<uint64_t>(r.band_rows(e)) * r.weight_row_bytes();
            if (e > b && bytes + nb > kWindowBytes) break;
            bytes += nb;
            ++e;
        }
        std::vector<uint8_t>& buf = st.buffers[*st.next_buffer];
        *st.next_buffer ^= 1;
        // The write that last used this buffer was submitted two windows ago and has completed:
        // submit() waits for each write before starting the next.
        buf.resize(static_cast<size_t>(bytes));
        const uint64_t base = r.weight_band_offset(b);
        st.pool->run(e - b, [&](int64_t i, int worker) {
            const int64_t band = b + i;
            tiny::generate_band(r, seed, band, buf.data() + (r.weight_band_offset(band) - base),
                                scales.data() + r.scale_band_offset(band),
                                (*st.scratch)[static_cast<size_t>(worker)]);
        });
        SafetensorsWriter* w = st.writer;
        std::atomic<uint64_t>* done = st.bytes_done;
        uint8_t* data = buf.data();
        st.writes->submit([w, wi, base, data, bytes, done] {
            w->write(wi, base, data, static_cast<size_t>(bytes));
            *done += bytes;
        });
        st.report();
        b = e;
    }
    if (r.has_scale) {
        st.writes->wait();
        st.writer->write(static_cast<size_t>(si), 0, scales.data(), scales.size());
        *st.bytes_done += scales.size();
    }
}

// Dense random Engram table (--engram-rows): e4m3 codes that are neither zero nor NaN and e8m0 scales
// 2^-8..2^-1, from xorshift64* words, written in 64 MiB sequential windows (generation overlaps writes).
void write_random_table(ShardWriteState& st, size_t wi, uint64_t weight_bytes, size_t si,
                        uint64_t scale_bytes, uint64_t seed) {
    auto fill = [](uint8_t* p, size_t n, uint64_t& x, bool scales) {
        for (size_t i = 0; i < n; i += 8) {
            x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
            uint64_t w = x * 0x2545F4914F6CDD1Dull;
            uint8_t b[8];
            std::memcpy(b, &w, 8);
            for (int k = 0; k < 8 && i + k < n; ++k) {
                uint8_t v = b[k];
                if (scales) {
                    v = static_cast<uint8_t>(119 + (v & 7));  // 2^-8 .. 2^-1
                } else {
                    if ((v & 0x7f) == 0) v |= 0x08;     // +-0 -> +-2^-6
                    if ((v & 0x7f) == 0x7f) v ^= 0x01;  // NaN -> 448
                }
                p[i + static_cast<size_t>(k)] = v;
            }
        }
    };
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + wi;
    if (x == 0) x = 1;
    for (int part = 0; part < 2; ++part) {
        const size_t idx = part == 0 ? wi : si;
        const uint64_t total = part == 0 ? weight_bytes : scale_bytes;
        for (uint64_t off = 0; off < total; off += kWindowBytes) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(kWindowBytes, total - off));
            std::vector<uint8_t>& buf = st.buffers[*st.next_buffer];
            *st.next_buffer ^= 1;  // the write that used this buffer has completed (submit waits)
            buf.resize(n);
            fill(buf.data(), n, x, part == 1);
            SafetensorsWriter* w = st.writer;
            std::atomic<uint64_t>* done = st.bytes_done;
            uint8_t* data = buf.data();
            st.writes->submit([w, idx, off, data, n, done] {
                w->write(idx, off, data, n);
                *done += n;
            });
            st.report();
        }
    }
    st.writes->wait();
}

void check_out_dir(const std::string& dir, const MakeTinyPlan& plan, bool force) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
        if (!fs::is_directory(dir, ec))
            DS4R_THROW(InputError, "make-tiny: %s exists and is not a directory", dir.c_str());
        bool empty = fs::directory_iterator(dir, ec) == fs::directory_iterator();
        if (ec) DS4R_THROW(RuntimeError, "make-tiny: cannot list %s (%s)", dir.c_str(), ec.message().c_str());
        if (!empty && !force)
            DS4R_THROW(InputError, "make-tiny: output directory %s is not empty (use --force to overwrite)",
                       dir.c_str());
        if (!empty) {
            // Shards of an earlier, different layout would confuse readers: remove them.
            static const std::regex shard_re(R"(model-\d{5}-of-\d{5}\.safetensors(\.tmp\.\d+)?)");
            std::vector<std::string> keep;
            for (const auto& s : plan.shards) keep.push_back(s.file);
            for (const auto& ent : fs::directory_iterator(dir)) {
                const std::string name = ent.path().filename().string();
                if (std::regex_match(name, shard_re) &&
                    std::find(keep.begin(), keep.end(), name) == keep.end())
                    fs::remove(ent.path());
            }
        }
    }
    make_dirs(dir);
}

void check_free_space(const std::string& dir, const MakeTinyPlan& plan) {
    struct statvfs sv;
    if (::statvfs(dir.c_str(), &sv) != 0) return;  // unknown: let the writes report it
    const uint64_t avail = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
    const uint64_t need = plan.total_tensor_bytes - plan.sparse_bytes + (64ull << 20);
    if (avail < need)
        DS4R_THROW(RuntimeError, "make-tiny: %s has %.2f GB free, the checkpoint needs %.2f GB", dir.c_str(),
                   avail / 1e9, need / 1e9);
}

std::string make_readme(const MakeTinyPlan& p, uint64_t seed) {
    const ModelConfig& c = p.cfg;
    std::string s = strfmt(
        "ds4replay make-tiny checkpoint: preset %s, %lld layers, seed %llu.\n"
        "RANDOM weights in the released DeepSeek V4.1-Flash layout (names, dtypes, shapes from the tensor\n"
        "binding); not a trained model. Linear weights: normal, std 1/sqrt(fan_in); fp8 ones quantized per\n"
        "32x32 block (e4m3 RNE, e8m0 scale 2^ceil(log2(amax/448))), routed experts fp4 e2m1 with an e8m0\n"
        "scale per row per 32. Norm weights 1 + 0.1 z; embed std 0.5 and head std 1/sqrt(dim), bf16.\n"
        "Tokenizer: synthetic byte-level BPE, %lld ids; engram_compressed_vocab_size %lld is the number of\n"
        "distinct normalized keys of THIS tokenizer (the release's is 99092).\n"
        "%zu shards, %.3f GB of tensors.\n",
        tiny_preset_name(p.preset), (long long)c.n_layers, (unsigned long long)seed, (long long)c.vocab_size,
        (long long)c.engram_compressed_vocab_size, p.shards.size(), p.total_tensor_bytes / 1e9);
    if (p.sparse_bytes == p.total_tensor_bytes && p.total_tensor_bytes > 0)
        s += strfmt(
            "HEADERS ONLY (--headers-only): every shard is its safetensors header plus holes; all %.1f GB "
            "of\n"
            "tensors read as zero bytes. For checking inspect / validation at the released scale, not for "
            "scoring.\n",
            p.sparse_bytes / 1e9);
    else if (std::any_of(p.shards.begin(), p.shards.end(),
                         [](const TinyShard& sh) { return sh.random_table; }))
        s += strfmt(
            "Engram tables are DENSE random bytes (--engram-rows): %lld rows per table, non-zero finite "
            "e4m3\n"
            "codes with e8m0 scales 2^-8..2^-1; engram_vocab_size %lld sets the hashing's primes.\n",
            (long long)(c.engram_num_embeddings.empty() ? 0 : c.engram_num_embeddings[0]),
            (long long)c.engram_vocab_size);
    else if (p.sparse_bytes > 0)
        s += strfmt(
            "Engram tables are SPARSE files: only the safetensors header is written; the rows and scales "
            "are\n"
            "holes that read as zero bytes (e4m3 0 with e8m0 scale byte 0 = 2^-127: all-zero embeddings).\n"
            "%.1f GB apparent, almost nothing on disk; reading rows measures the page cache, not the disk.\n",
            p.sparse_bytes / 1e9);
    return s;
}

}  // namespace

MakeTinyResult make_tiny(const std::string& out_dir, const MakeTinyOptions& opts) {
    const auto t0 = std::chrono::steady_clock::now();
    MakeTinyResult res;
    res.plan = plan_make_tiny(opts.preset, opts.layers, opts.engram_rows);
    if (opts.headers_only) {
        for (auto& sh : res.plan.shards) sh.sparse = true;
        res.plan.sparse_bytes = res.plan.total_tensor_bytes;
    }
    const MakeTinyPlan& plan = res.plan;
    check_out_dir(out_dir, plan, opts.force);
    check_free_space(out_dir, plan);
    res.readme = make_readme(plan, opts.seed);

    auto add_text = [&](const std::string& name, const std::string& text) {
        const std::string path = path_join(out_dir, name);
        write_text_file(path, text);
        res.files.push_back(path);
        res.bytes_on_disk += text.size();
    };
    add_text("config.json", plan.config_json);
    add_text("tokenizer.json", plan.tokenizer_json);

    tiny::WorkerPool pool(opts.threads);
    std::vector<tiny::BandScratch> scratch(static_cast<size_t>(pool.size()));
    std::vector<uint8_t> buffers[2];
    int next_buffer = 0;
    std::atomic<uint64_t> bytes_done{0};
    MakeTinyProgress prog;
    prog.bytes_total = plan.total_tensor_bytes - plan.sparse_bytes;
    auto report = [&] {
        if (!opts.progress) return;
        prog.bytes_done = bytes_done.load();
        opts.progress(prog);
    };

    for (const TinyShard& sh : plan.shards) {
        const std::string path = path_join(out_dir, sh.file);
        prog.file = sh.file;
        std::vector<SafetensorsEntry> entries;
        for (size_t i : sh.tensors)
            entries.push_back({plan.specs[i].name, plan.specs[i].dtype, plan.specs[i].shape});
        // --headers-only marks every shard: readers (Checkpoint::zero_weights, score) can tell that the
        // weights are holes.
        std::map<std::string, std::string> metadata{{"format", "pt"}};
        if (opts.headers_only) metadata[kZeroWeightsMetadataKey] = "make-tiny --headers-only";
        SafetensorsWriter writer(path, plan_safetensors(std::move(entries), metadata));
        const SafetensorsLayout& lay = writer.layout();
        AsyncWrites writes;
        ShardWriteState st{&writer, &writes, &pool, &scratch, buffers, &next_buffer, &bytes_done, report};
        std::map<std::string, size_t> spec_of;
        for (size_t i : sh.tensors) spec_of[plan.specs[i].name] = i;
        for (size_t wi = 0; wi < lay.entries.size(); ++wi) {
            const std::string& name = lay.entries[wi].name;
            auto ends = [&](const std::string& suf) {
                return name.size() > suf.size() &&
                       name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
            };
            // A `.scale` tensor is generated together with its weight.
            if (ends(".scale") && lay.find(name.substr(0, name.size() - 6) + ".weight") >= 0) continue;
            int64_t si = -1;
            if (ends(".weight")) si = lay.find(name.substr(0, name.size() - 7) + ".scale");
            const TensorSpec& wspec = plan.specs[spec_of.at(name)];
            const TensorSpec* sspec =
                si >= 0 ? &plan.specs[spec_of.at(lay.entries[static_cast<size_t>(si)].name)] : nullptr;
            if (sh.sparse) {
                // Full-width Engram tables: holes of a sparse file (the README says so).
                writer.leave_zero(wi);
                if (si >= 0) writer.leave_zero(static_cast<size_t>(si));
                continue;
            }
            if (sh.random_table && sspec) {
                write_random_table(
                    st, wi, dtype_size(wspec.dtype) * static_cast<uint64_t>(shape_numel(wspec.shape)),
                    static_cast<size_t>(si),
                    dtype_size(sspec->dtype) * static_cast<uint64_t>(shape_numel(sspec->shape)), opts.seed);
                continue;
            }
            const tiny::TensorRecipe r = tiny::make_recipe(wspec, sspec, plan.cfg);
            write_tensor(st, r, wi, si, opts.seed);
        }
        writes.wait();
        writer.commit();
        res.files.push_back(path);
        res.bytes_on_disk += lay.file_size;
        report();
    }
    add_text("README.txt", res.readme);
    add_text("model.safetensors.index.json", make_tiny_index_json(plan));  // last: marks completion
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace ds4r
