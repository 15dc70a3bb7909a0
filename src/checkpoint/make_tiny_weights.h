// Random weights for make-tiny: deterministic streams, per-tensor-kind statistics and the exact
// quantization DeepSeek's weights use (docs/MODEL.md 3.2 / 3.4 / 5.1 / 5.2). Every tensor is generated
// in bands of 32 rows; band b of tensor T draws from its own stream seeded by (seed, T's name, b), so
// the bytes do not depend on the thread count, on the order tensors are written in, or on which
// other tensors exist (a truncated --layers N model repeats the first N layers of a longer one).
// Only correctly rounded IEEE operations (+ - * / sqrt), exact power-of-two scalings and integer
// arithmetic are used (no exp/log from libm), so the bytes are the same on every IEEE machine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ds4r/binding.h"
#include "ds4r/config.h"

namespace ds4r::tiny {

// xoshiro256++, state filled by splitmix64.
class Rng {
public:
    explicit Rng(uint64_t seed);
    uint64_t next() {
        const uint64_t r = rotl(s_[0] + s_[3], 23) + s_[0];
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

uint64_t splitmix64(uint64_t& state);
// Seed of band `band` of tensor `name` for the user seed `seed`.
uint64_t band_seed(uint64_t seed, const std::string& name, int64_t band);

// The 32768 positive standard-normal quantiles Phi^-1(0.5 + (j + 0.5) / 65536), j = 0..32767,
// computed with basic arithmetic only. A 16-bit draw (sign bit + 15-bit index) gives one normal
// sample, clipped at about +-4.33 sigma.
const std::vector<float>& normal_quantiles();

// How the values of a tensor are drawn.
struct WeightInit {
    enum Dist { Normal, Uniform } dist = Normal;
    float a = 0.0f;  // Normal: mean;  Uniform: low
    float b = 1.0f;  // Normal: std;   Uniform: high
};

// How a tensor is stored.
enum class Encoding {
    BF16,      // bf16 bit patterns
    F32,       // fp32
    FP8Block,  // e4m3 weight [out, in] + e8m0 scale [ceil(out/32), ceil(in/32)] (32x32 blocks)
    FP4Row,    // I8 [out, in/2], two e2m1 codes, even element low nibble + e8m0 [out, in/32]
    FP8Row,    // Engram table: e4m3 [rows, hd] + e8m0 [rows, hd/32] (one scale per 32 of a row)
};

// One stored tensor and its `.scale` companion, as a generation job.
struct TensorRecipe {
    TensorSpec weight;  // the value tensor
    bool has_scale = false;
    TensorSpec scale;  // its `.scale` tensor when has_scale
    Encoding enc = Encoding::F32;
    WeightInit init;
    int64_t rows = 1;  // logical rows (dim 0; 1 for a 1-D tensor)
    int64_t cols = 1;  // logical columns = input features (FP4Row: 2 x stored columns)
    static constexpr int64_t kBandRows = 32;

    int64_t bands() const { return (rows + kBandRows - 1) / kBandRows; }
    int64_t band_rows(int64_t b) const;            // rows in band b (the last may be short)
    uint64_t weight_row_bytes() const;             // stored bytes of one row
    uint64_t weight_band_offset(int64_t b) const;  // byte offset of band b in the weight
    uint64_t scale_band_offset(int64_t b) const;   // byte offset of band b's scales
    uint64_t scale_band_bytes(int64_t b) const;
};

// The statistics a tensor kind gets (mimicking the golden tiny-a generator): fp8 / fp4 / bf16 linear
// weights N(0, 1/sqrt(fan_in)); norm weights and Engram q/k weights 1 + 0.1 N; embed N(0, 0.5);
// hc_*_fn N(0, 1/sqrt(hc_dim)), hc_*_base N(0, 0.5), hc_*_scale U(0.5, 1); attn_sink N(0, 1);
// gate.bias(_vl) N(0, 0.1); Engram table rows N(0, 1). Throws RuntimeError for a name it has no
// rule for (so a new binding entry is not silently given made-up statistics).
WeightInit weight_init_for(const TensorSpec& weight, const ModelConfig& cfg);

// Builds the recipe of a value tensor; `scale` is its `.scale` spec, or null.
TensorRecipe make_recipe(const TensorSpec& weight, const TensorSpec* scale, const ModelConfig& cfg);

// Per-thread buffers of generate_band (resized as needed).
struct BandScratch {
    std::vector<uint16_t> raw;  // [band rows * cols] 16-bit draws (sign bit + quantile index)
    std::vector<float> x;       // [band rows * cols] values (float encodings and the reference path)
};

// Generates band b: the band's weight bytes into `wout` (band_rows(b) * weight_row_bytes() bytes)
// and its scale bytes into `sout` (scale_band_bytes(b), ignored without a scale).
// Quantized tensors drawn from N(0, sd) take a fast path that quantizes in the draw domain through
// per-(sd, scale) code tables; it gives the same bytes as quantizing the values
// (allow_fast = false, which tests compare against).
void generate_band(const TensorRecipe& r, uint64_t seed, int64_t band, uint8_t* wout, uint8_t* sout,
                   BandScratch& scratch, bool allow_fast = true);

// e8m0 exponent byte of 2^ceil(log2(amax / qmax)) for qmax = 448 (e4m3) or 6 (e2m1), with the
// reference's amax floors (docs/MODEL.md 5.1 / 5.2): the power of two such that amax / s <= qmax.
uint8_t e8m0_ceil_scale(float amax, float qmax);

// A fixed pool of worker threads; run(n, fn) calls fn(i, worker) for i in [0, n) and returns when
// all are done. The calling thread works too (worker id 0). Exceptions are rethrown in run().
class WorkerPool {
public:
    explicit WorkerPool(int threads);  // threads <= 0: hardware concurrency
    ~WorkerPool();
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;
    int size() const { return static_cast<int>(workers_.size()) + 1; }
    void run(int64_t n, const std::function<void(int64_t, int)>& fn);

private:
    void loop(int id);
    void work(int id);
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    const std::function<void(int64_t, int)>* fn_ = nullptr;
    int64_t n_ = 0;
    std::atomic<int64_t> next_{0};
    int active_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace ds4r::tiny
