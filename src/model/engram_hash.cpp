// Engram prime layout, hash multipliers and per-position hash ids (docs/MODEL.md 4.2 "Layout",
// "Multipliers", "Hash"). All exact integer arithmetic.
//
// The multipliers are numpy.random.default_rng(10007 * layer).integers(0, bound, size, int64).
// numpy does not promise that stream stays the same, so it is rebuilt here from what numpy does
// (numpy/random: bit_generator.pyx SeedSequence, _pcg64.pyx + src/pcg64 PCG64 XSL-RR 128/64,
// _bounded_integers.pyx.in + distributions.c Lemire bounded integers) and tested against the values
// docs/MODEL.md 4.2 lists and the golden engram_multipliers.npy.
#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ds4r/engram.h"
#include "ds4r/error.h"

namespace ds4r {

namespace {

using u128 = unsigned __int128;

// ---------------------------------------------------------------------------------------------
// Primality: deterministic Miller-Rabin for 64-bit n (these 12 bases cover n < 3.3e24).
// ---------------------------------------------------------------------------------------------
uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
    return static_cast<uint64_t>(u128(a) * b % m);
}

uint64_t pow_mod(uint64_t a, uint64_t e, uint64_t m) {
    uint64_t r = 1 % m;
    a %= m;
    while (e) {
        if (e & 1) r = mul_mod(r, a, m);
        a = mul_mod(a, a, m);
        e >>= 1;
    }
    return r;
}

bool is_prime_u64(uint64_t n) {
    static constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2) return false;
    for (uint64_t p : kBases) {
        if (n % p == 0) return n == p;
    }
    uint64_t d = n - 1;
    int r = 0;
    while ((d & 1) == 0) {
        d >>= 1;
        ++r;
    }
    for (uint64_t a : kBases) {
        uint64_t x = pow_mod(a, d, n);
        if (x == 1 || x == n - 1) continue;
        bool composite = true;
        for (int i = 1; i < r; ++i) {
            x = mul_mod(x, x, n);
            if (x == n - 1) {
                composite = false;
                break;
            }
        }
        if (composite) return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// numpy SeedSequence (pool size 4, uint32 arithmetic) -> 4 uint64 words of PCG64 seed material.
// ---------------------------------------------------------------------------------------------
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t* hash_const) {
    value ^= *hash_const;
    *hash_const *= kMultA;
    value *= *hash_const;
    value ^= value >> kXShift;
    return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = kMixMultL * x - kMixMultR * y;
    r ^= r >> kXShift;
    return r;
}

// SeedSequence(entropy).generate_state(4, np.uint64) for a non-negative integer entropy (no
// spawn key).
std::array<uint64_t, 4> seed_sequence_state(uint64_t entropy) {
    // _int_to_uint32_array: 32-bit words, lowest first; 0 is one word 0.
    std::vector<uint32_t> words;
    if (entropy == 0) words.push_back(0);
    for (uint64_t v = entropy; v > 0; v >>= 32) words.push_back(static_cast<uint32_t>(v));

    // mix_entropy
    uint32_t pool[kPoolSize];
    uint32_t hc = kInitA;
    for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < words.size() ? words[i] : 0u, &hc);
    for (size_t src = 0; src < kPoolSize; ++src)
        for (size_t dst = 0; dst < kPoolSize; ++dst)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hc));
    for (size_t src = kPoolSize; src < words.size(); ++src)
        for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(words[src], &hc));

    // generate_state: 8 uint32 words cycling over the pool, viewed little-endian as 4 uint64.
    uint32_t state32[8];
    uint32_t hb = kInitB;
    for (size_t i = 0; i < 8; ++i) {
        uint32_t v = pool[i % kPoolSize];
        v ^= hb;
        hb *= kMultB;
        v *= hb;
        v ^= v >> kXShift;
        state32[i] = v;
    }
    std::array<uint64_t, 4> out;
    for (size_t j = 0; j < 4; ++j) out[j] = uint64_t{state32[2 * j]} | (uint64_t{state32[2 * j + 1]} << 32);
    return out;
}

// numpy's PCG64 (XSL-RR 128/64) with its 32-bit half buffering.
class Pcg64 {
public:
    explicit Pcg64(const std::array<uint64_t, 4>& seed) {
        // pcg64_set_seed: word 0 is the high half of the 128-bit state seed, word 2 of the stream.
        u128 initstate = (u128(seed[0]) << 64) | seed[1];
        u128 initseq = (u128(seed[2]) << 64) | seed[3];
        state_ = 0;
        inc_ = (initseq << 1) | 1;
        step();
        state_ += initstate;
        step();
    }
    uint64_t next64() {
        step();
        uint64_t hi = static_cast<uint64_t>(state_ >> 64), lo = static_cast<uint64_t>(state_);
        unsigned rot = static_cast<unsigned>(state_ >> 122);
        uint64_t x = hi ^ lo;
        return (x >> rot) | (x << ((64 - rot) & 63));
    }
    uint32_t next32() {
        if (has_u32_) {
            has_u32_ = false;
            return u32_;
        }
        uint64_t v = next64();
        has_u32_ = true;
        u32_ = static_cast<uint32_t>(v >> 32);
        return static_cast<uint32_t>(v);
    }

private:
    void step() { state_ = state_ * kMult + inc_; }
    static constexpr u128 kMult = (u128(2549297995355413924ULL) << 64) | 4865540595714422341ULL;
    u128 state_, inc_;
    bool has_u32_ = false;
    uint32_t u32_ = 0;
};

// random_bounded_uint64_fill with use_masked = false: values in [0, rng].
uint64_t bounded_uint64(Pcg64& g, uint64_t rng) {
    if (rng == 0) return 0;
    if (rng <= 0xFFFFFFFFull) {
        if (rng == 0xFFFFFFFFull) return g.next32();
        const uint32_t rng32 = static_cast<uint32_t>(rng), excl = rng32 + 1;
        uint64_t m = uint64_t{g.next32()} * excl;
        uint32_t leftover = static_cast<uint32_t>(m);
        if (leftover < excl) {
            const uint32_t threshold = (UINT32_MAX - rng32) % excl;
            while (leftover < threshold) {
                m = uint64_t{g.next32()} * excl;
                leftover = static_cast<uint32_t>(m);
            }
        }
        return m >> 32;
    }
    if (rng == UINT64_MAX) return g.next64();
    const uint64_t excl = rng + 1;
    u128 m = u128(g.next64()) * excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < excl) {
        const uint64_t threshold = (UINT64_MAX - rng) % excl;
        while (leftover < threshold) {
            m = u128(g.next64()) * excl;
            leftover = static_cast<uint64_t>(m);
        }
    }
    return static_cast<uint64_t>(m >> 64);
}

// Python's a % b for b > 0 (numpy / torch int64 remainder takes the divisor's sign).
int64_t floor_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return r < 0 ? r + b : r;
}

}  // namespace

EngramLayout build_engram_layout(const ModelConfig& cfg) {
    return build_engram_layout(cfg, "config.json");
}

EngramLayout build_engram_layout(const ModelConfig& cfg, const std::string& config_path) {
    const char* path = config_path.c_str();
    const int64_t groups = cfg.engram_ngram_groups(), heads = cfg.engram_n_heads;
    const size_t n_layers = cfg.engram_layer_ids.size();
    if (groups < 1 || groups > 64)
        throw CheckpointError(strfmt("%s: engram_max_ngram_size %lld: expected 2..65", path,
                                     (long long)cfg.engram_max_ngram_size));
    if (heads < 1 || heads > 4096)
        throw CheckpointError(strfmt("%s: engram_n_heads %lld: expected 1..4096", path, (long long)heads));
    if (n_layers > 1024)
        throw CheckpointError(strfmt("%s: %zu Engram layers is more than supported", path, n_layers));
    if (cfg.engram_vocab_size < 0 || cfg.engram_vocab_size > (int64_t{1} << 60))
        throw CheckpointError(
            strfmt("%s: engram_vocab_size %lld out of range", path, (long long)cfg.engram_vocab_size));
    if (cfg.engram_num_embeddings.size() != n_layers)
        throw CheckpointError(strfmt("%s: engram_num_embeddings has %zu entries for %zu Engram layers", path,
                                     cfg.engram_num_embeddings.size(), n_layers));

    EngramLayout out;
    std::set<uint64_t> seen;  // one global set of primes for all layers (docs/MODEL.md 4.2)
    for (size_t li = 0; li < n_layers; ++li) {
        std::vector<std::vector<int64_t>> layer_primes(static_cast<size_t>(groups));
        std::vector<int64_t> offsets;
        int64_t total = 0;
        for (int64_t g = 0; g < groups; ++g) {
            // Every n-gram size restarts the search at engram_vocab_size - 1.
            int64_t current = cfg.engram_vocab_size - 1;
            for (int64_t h = 0; h < heads; ++h) {
                int64_t c = current + 1;
                while (!(is_prime_u64(static_cast<uint64_t>(std::max<int64_t>(c, 0))) &&
                         !seen.count(static_cast<uint64_t>(c))))
                    ++c;
                seen.insert(static_cast<uint64_t>(c));
                layer_primes[static_cast<size_t>(g)].push_back(c);
                offsets.push_back(total);  // exclusive prefix sum over (g, h) order
                total += c;
                current = c;
            }
        }
        const int64_t expected = cfg.engram_num_embeddings[li];
        if (total != expected)
            throw CheckpointError(
                strfmt("%s: engram_num_embeddings[%zu] (layer %d) is %lld, but the layer's %lld hash primes "
                       "sum to %lld (docs/MODEL.md 4.2 layout)",
                       path, li, cfg.engram_layer_ids[li], (long long)expected, (long long)(groups * heads),
                       (long long)total));
        out.primes.push_back(std::move(layer_primes));
        out.offsets.push_back(std::move(offsets));
        out.table_rows.push_back(total);
    }
    return out;
}

std::vector<int64_t> numpy_rng_integers(uint64_t seed, int64_t high, int64_t count) {
    DS4R_CHECK(high >= 1 && count >= 0, "numpy_rng_integers: high %lld, count %lld", (long long)high,
               (long long)count);
    Pcg64 gen(seed_sequence_state(seed));
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(count));
    // integers(0, high) draws on the closed interval [0, high - 1].
    for (int64_t k = 0; k < count; ++k)
        out.push_back(static_cast<int64_t>(bounded_uint64(gen, static_cast<uint64_t>(high - 1))));
    return out;
}

std::vector<int64_t> released_engram_multipliers(int64_t layer, int64_t compressed_vocab, int64_t max_ngram) {
    if (compressed_vocab != 99092 || max_ngram != 4) return {};
    if (layer == 1) return {76632096046245LL, 4839876093313LL, 35959672319349LL, 73987337458391LL};
    if (layer == 14) return {67716810739261LL, 51510806800915LL, 30921347202721LL, 82619226485591LL};
    return {};
}

std::vector<int64_t> engram_multipliers(int64_t layer, int64_t compressed_vocab, int64_t max_ngram) {
    if (layer < 0 || layer > std::numeric_limits<int64_t>::max() / 10007)
        throw CheckpointError(
            strfmt("Engram layer id %lld cannot seed the hash multipliers", (long long)layer));
    if (compressed_vocab < 1)
        throw CheckpointError(
            strfmt("engram_compressed_vocab_size %lld must be positive", (long long)compressed_vocab));
    if (max_ngram < 0 || max_ngram > 4096)
        throw CheckpointError(strfmt("engram_max_ngram_size %lld out of range", (long long)max_ngram));
    // bound = max(1, (INT64_MAX // compressed_vocab) // 2) keeps tok * m below INT64_MAX (4.2).
    const int64_t bound = std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2);
    std::vector<int64_t> v = numpy_rng_integers(static_cast<uint64_t>(10007 * layer), bound, max_ngram);
    for (int64_t& x : v) x = x * 2 + 1;  // odd multipliers
    return v;
}

std::vector<int64_t> engram_hash_ids(const std::vector<int32_t>& tokens, const EngramTokenMap& map,
                                     const EngramLayout& layout, const ModelConfig& cfg) {
    const size_t s = tokens.size();
    const size_t n_layers = cfg.engram_layer_ids.size();
    const int64_t max_ngram = cfg.engram_max_ngram_size, heads = cfg.engram_n_heads;
    const int64_t cols = cfg.engram_hash_cols();
    DS4R_CHECK(layout.primes.size() == n_layers && layout.offsets.size() == n_layers,
               "Engram layout has %zu layers, config %zu", layout.primes.size(), n_layers);
    DS4R_CHECK(max_ngram >= 2 && heads >= 1, "bad Engram config (max_ngram %lld, heads %lld)",
               (long long)max_ngram, (long long)heads);
    for (size_t li = 0; li < n_layers; ++li) {
        DS4R_CHECK(layout.primes[li].size() == static_cast<size_t>(max_ngram - 1) &&
                       layout.offsets[li].size() == static_cast<size_t>(cols),
                   "Engram layout of layer index %zu does not match the config", li);
        for (const auto& g : layout.primes[li])
            DS4R_CHECK(g.size() == static_cast<size_t>(heads), "Engram layout head count mismatch");
    }
    const auto pad = static_cast<int64_t>(map.pad_compressed);

    // Compressed ids c_t = token_map[input_id_t].
    std::vector<int64_t> c(s);
    for (size_t t = 0; t < s; ++t) {
        int32_t id = tokens[t];
        if (id < 0 || static_cast<size_t>(id) >= map.map.size())
            throw InputError(strfmt("token id %d at position %zu is outside the tokenizer's %zu ids", id, t,
                                    map.map.size()));
        c[t] = map.map[static_cast<size_t>(id)];
    }

    std::vector<std::vector<int64_t>> mult(n_layers);
    for (size_t li = 0; li < n_layers; ++li)
        mult[li] = engram_multipliers(cfg.engram_layer_ids[li], cfg.engram_compressed_vocab_size, max_ngram);

    std::vector<int64_t> out(s * n_layers * static_cast<size_t>(cols));
    std::vector<int64_t> tok(static_cast<size_t>(max_ngram));
    for (size_t t = 0; t < s; ++t) {
        // Lookback k: the token k positions back, or the pad id before the sequence start.
        for (int64_t k = 0; k < max_ngram; ++k)
            tok[static_cast<size_t>(k)] =
                (static_cast<int64_t>(t) - k >= 0) ? c[t - static_cast<size_t>(k)] : pad;
        for (size_t li = 0; li < n_layers; ++li) {
            int64_t* row = &out[(t * n_layers + li) * static_cast<size_t>(cols)];
            // int64 products wrap like numpy / torch int64 (they cannot overflow with a consistent
            // config: tok < compressed vocab and m < INT64_MAX / compressed vocab).
            auto product = [&](int64_t k) {
                return static_cast<int64_t>(static_cast<uint64_t>(tok[static_cast<size_t>(k)]) *
                                            static_cast<uint64_t>(mult[li][static_cast<size_t>(k)]));
            };
            int64_t r = product(0);
            for (int64_t i = 1; i < max_ngram; ++i) {
                r ^= product(i);  // the hash of the (i+1)-gram ending at t
                for (int64_t h = 0; h < heads; ++h) {
                    const int64_t prime =
                        layout.primes[li][static_cast<size_t>(i - 1)][static_cast<size_t>(h)];
                    const int64_t col = (i - 1) * heads + h;
                    row[col] = floor_mod(r, prime) + layout.offsets[li][static_cast<size_t>(col)];
                }
            }
        }
    }
    return out;
}

}  // namespace ds4r
