// Engram hashing (docs/MODEL.md 4.2): the compressed token map, the prime layout, the hash multipliers
// and the per-position hash ids. Everything here is exact integer arithmetic and is checked against the
// golden data. Reading the table rows (docs/MODEL.md 4.8 step 1) is io/'s: ds4r/engram_io.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ds4r/config.h"

namespace ds4r {

class Tokenizer;

// token id -> compressed (normalized) id, one entry per id in range(len(tokenizer)).
struct EngramTokenMap {
    std::vector<int32_t> map;    // [len(tokenizer)]
    int64_t num_keys = 0;        // distinct normalized keys (must equal engram_compressed_vocab_size)
    int32_t pad_compressed = 0;  // map[engram_pad_id]
};
// Builds the map with the normalizer chain of docs/MODEL.md 4.2 (NFKC, NFD, StripAccents, Lowercase,
// whitespace runs -> ' ', '^ $' -> U+E000, Strip, U+E000 -> ' '; U+FFFD tokens keep their raw
// token string; empty normalized keys keep the un-normalized text; ids in order of first
// appearance). Throws CheckpointError naming `tokenizer_path` when num_keys differs from
// cfg.engram_compressed_vocab_size (pass check = false to skip that check, e.g. in make-tiny).
EngramTokenMap build_engram_token_map(const Tokenizer& tok, const ModelConfig& cfg,
                                      const std::string& tokenizer_path, bool check = true);
// The normalized key of one decoded text (exposed for tests).
std::string engram_normalize(const std::string& text);

// Prime layout of every Engram layer (docs/MODEL.md 4.2 "Layout").
struct EngramLayout {
    // primes[layer_idx][ngram_group][head]; ngram_group g covers n-grams of size g + 2.
    std::vector<std::vector<std::vector<int64_t>>> primes;
    std::vector<std::vector<int64_t>> offsets;  // [layer_idx][g * n_heads + h]: exclusive prefix sums
    std::vector<int64_t> table_rows;            // [layer_idx]: sum of the layer's primes
};
EngramLayout build_engram_layout(const ModelConfig& cfg);
// The same; throws CheckpointError naming `config_path` when a layer's primes do not sum to its
// engram_num_embeddings entry, or the Engram fields are out of range.
EngramLayout build_engram_layout(const ModelConfig& cfg, const std::string& config_path);

// numpy.random.default_rng(10007 * layer).integers(0, bound, size=max_ngram, dtype=int64) * 2 + 1,
// bound = max(1, (INT64_MAX // compressed_vocab) // 2), reproduced exactly (PCG64 + SeedSequence +
// Lemire bounded integers as numpy implements them).
std::vector<int64_t> engram_multipliers(int64_t layer, int64_t compressed_vocab, int64_t max_ngram);

// The released model's multipliers as published (docs/MODEL.md 4.2: layers 1 and 14 with compressed vocab
// 99,092 and n-grams up to 4), or an empty vector for any other (layer, vocab, n-gram) combination.
// docs/MODEL.md advises hard-coding them because numpy does not promise its stream stays the same; ds4replay
// computes them and `score --seed-check` verifies the two agree.
std::vector<int64_t> released_engram_multipliers(int64_t layer, int64_t compressed_vocab, int64_t max_ngram);
// numpy.random.default_rng(seed).integers(0, high, size=count, dtype=np.int64) for high >= 1, as
// numpy (>= 1.17) computes it: SeedSequence -> PCG64 -> Lemire bounded integers (32-bit draws
// when high - 1 fits in 32 bits). The building block of engram_multipliers, exposed for tests.
std::vector<int64_t> numpy_rng_integers(uint64_t seed, int64_t high, int64_t count);

// Hash ids of one sequence: out [s, n_engram_layers, n_hash_cols] int64 row indices into each
// layer's table (column order: 2-gram heads, 3-gram heads, ...). `tokens` are raw token ids;
// one outside the map throws InputError.
std::vector<int64_t> engram_hash_ids(const std::vector<int32_t>& tokens, const EngramTokenMap& map,
                                     const EngramLayout& layout, const ModelConfig& cfg);

// The table reader (EngramTable) and the pass gather live in ds4r/engram_io.h (io/).

}  // namespace ds4r
