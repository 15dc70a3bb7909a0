// Random weights for make-tiny: streams, statistics per tensor kind, exact fp8/fp4 quantization.
#include "checkpoint/make_tiny_weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include "ds4r/error.h"
#include "ds4r/numeric.h"

namespace ds4r::tiny {

static_assert(std::endian::native == std::endian::little, "make-tiny writes little-endian tensor bytes");

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
    uint64_t st = seed;
    for (auto& s : s_) s = splitmix64(st);
}

uint64_t band_seed(uint64_t seed, const std::string& name, int64_t band) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the tensor name
    for (unsigned char c : name) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    uint64_t st = seed;
    uint64_t a = splitmix64(st);
    st = h ^ a;
    uint64_t b = splitmix64(st);
    st = b ^ (static_cast<uint64_t>(band) * 0xD1B54A32D192ED03ull);
    return splitmix64(st);
}

namespace {

// exp(-y) for y >= 0 with basic arithmetic only: halve y below 1/16, Taylor series, square back.
double exp_neg(double y) {
    int k = 0;
    while (y > 0.0625) {
        y *= 0.5;
        ++k;
    }
    double term = 1.0, sum = 1.0;
    for (int n = 1; n <= 16; ++n) {
        term *= -y / n;
        sum += term;
    }
    while (k-- > 0) sum *= sum;
    return sum;
}

constexpr double kInvSqrt2Pi = 0.398942280401432677939946059934;

// Phi(x) - 1/2 for x >= 0: phi(x) * (x + x^3/3 + x^5/(3*5) + ...) (all terms positive).
double phi_minus_half(double x) {
    const double x2 = x * x;
    double term = x, sum = x;
    for (int n = 1; n < 1000; ++n) {
        term *= x2 / (2 * n + 1);
        sum += term;
        if (term < sum * 1e-18) break;
    }
    return kInvSqrt2Pi * exp_neg(0.5 * x2) * sum;
}

std::vector<float> build_quantiles() {
    std::vector<float> q(32768);
    double x = 0.0;
    for (int j = 0; j < 32768; ++j) {
        const double p = (j + 0.5) / 65536.0;
        // Newton from the previous (smaller) quantile: Phi is concave for x > 0, so the iterates
        // increase monotonically to the root.
        for (int it = 0; it < 100; ++it) {
            double f = phi_minus_half(x) - p;
            double dx = f / (kInvSqrt2Pi * exp_neg(0.5 * x * x));
            x -= dx;
            if (dx > -1e-15 && dx < 1e-15) break;
        }
        q[static_cast<size_t>(j)] = static_cast<float>(x);
    }
    return q;
}

bool ends_with(const std::string& s, const char* suf) {
    size_t n = std::strlen(suf);
    return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// 2^(127 - e) as fp32: the reciprocal of the e8m0 scale with byte e (exact).
float inv_scale(uint8_t e) {
    return std::ldexp(1.0f, 127 - static_cast<int>(e));
}

}  // namespace

const std::vector<float>& normal_quantiles() {
    static const std::vector<float> q = build_quantiles();
    return q;
}

uint8_t e8m0_ceil_scale(float amax, float qmax) {
    // Amax floors of the reference quantizers (docs/MODEL.md 5.1: 1e-4 for fp8; 5.2: 6 * 2^-126 for fp4).
    const float floor_v = qmax == 6.0f ? 6.0f * std::numeric_limits<float>::min() : 1e-4f;
    amax = std::max(amax, floor_v);
    const float q = amax * (1.0f / qmax);  // fp32(1/qmax), as the kernels multiply
    const uint32_t bits = f32_bits(q);
    uint32_t e = (bits >> 23) & 0xffu;  // biased exponent; q is normal after the floor
    if (bits & 0x7fffffu) ++e;          // round the power of two up (exact powers stay)
    return static_cast<uint8_t>(std::min<uint32_t>(e, 254u));
}

WeightInit weight_init_for(const TensorSpec& w, const ModelConfig& cfg) {
    const std::string& n = w.name;
    auto normal = [](float mean, float sd) { return WeightInit{WeightInit::Normal, mean, sd}; };
    auto fan_in_std = [&]() {
        int64_t fan_in = w.shape.size() == 2 ? w.shape[1] : 1;
        if (w.dtype == DType::I8) fan_in *= 2;  // two fp4 codes per byte
        return 1.0f / std::sqrt(static_cast<float>(fan_in));
    };
    if (n == "embed.weight") return normal(0.0f, 0.5f);
    if (n == "head.weight") return normal(0.0f, 1.0f / std::sqrt(static_cast<float>(cfg.dim)));
    if (ends_with(n, "norm.weight") || ends_with(n, "engram.q_weight") || ends_with(n, "engram.k_weight"))
        return normal(1.0f, 0.1f);
    if (ends_with(n, "hc_attn_fn") || ends_with(n, "hc_ffn_fn")) return normal(0.0f, fan_in_std());
    if (ends_with(n, "hc_attn_base") || ends_with(n, "hc_ffn_base")) return normal(0.0f, 0.5f);
    if (ends_with(n, "hc_attn_scale") || ends_with(n, "hc_ffn_scale"))
        return WeightInit{WeightInit::Uniform, 0.5f, 1.0f};
    if (ends_with(n, "attn.attn_sink")) return normal(0.0f, 1.0f);
    if (ends_with(n, "ffn.gate.bias") || ends_with(n, "ffn.gate.bias_vl")) return normal(0.0f, 0.1f);
    if (ends_with(n, "engram.embed.weight")) return normal(0.0f, 1.0f);
    if (ends_with(n, ".weight") && w.shape.size() == 2) return normal(0.0f, fan_in_std());
    // The vision / MTP shards' stand-ins of the release grouping (make_tiny.cpp): never read by a prefill.
    if (ends_with(n, ".make_tiny_placeholder")) return normal(0.0f, 1.0f);
    DS4R_THROW(RuntimeError, "make-tiny: no initialization rule for tensor '%s' (%s %s)", n.c_str(),
               dtype_name(w.dtype), shape_str(w.shape).c_str());
}

TensorRecipe make_recipe(const TensorSpec& weight, const TensorSpec* scale, const ModelConfig& cfg) {
    TensorRecipe r;
    r.weight = weight;
    DS4R_CHECK(weight.shape.size() == 1 || weight.shape.size() == 2, "make-tiny: tensor '%s' has rank %zu",
               weight.name.c_str(), weight.shape.size());
    if (weight.shape.size() == 2) {
        r.rows = weight.shape[0];
        r.cols = weight.shape[1];
    } else {
        r.rows = 1;
        r.cols = weight.shape[0];
    }
    switch (weight.dtype) {
        case DType::BF16:
            r.enc = Encoding::BF16;
            break;
        case DType::F32:
            r.enc = Encoding::F32;
            break;
        case DType::F8_E4M3:
            r.enc = weight.use == TensorUse::EngramTable ? Encoding::FP8Row : Encoding::FP8Block;
            break;
        case DType::I8:
            r.enc = Encoding::FP4Row;
            r.cols *= 2;
            break;
        default:
            DS4R_THROW(RuntimeError, "make-tiny: no encoding for tensor '%s' of dtype %s",
                       weight.name.c_str(), dtype_name(weight.dtype));
    }
    const bool quantized =
        r.enc == Encoding::FP8Block || r.enc == Encoding::FP4Row || r.enc == Encoding::FP8Row;
    DS4R_CHECK(quantized == (scale != nullptr), "make-tiny: tensor '%s' %s a .scale companion",
               weight.name.c_str(), quantized ? "needs" : "must not have");
    if (quantized) {
        DS4R_CHECK(weight.shape.size() == 2 && r.cols % 32 == 0,
                   "make-tiny: quantized tensor '%s' %s needs 32 | in", weight.name.c_str(),
                   shape_str(weight.shape).c_str());
        Shape want =
            r.enc == Encoding::FP8Block ? Shape{(r.rows + 31) / 32, r.cols / 32} : Shape{r.rows, r.cols / 32};
        DS4R_CHECK(scale->dtype == DType::F8_E8M0 && scale->shape == want,
                   "make-tiny: scale '%s' is %s %s, expected F8_E8M0 %s", scale->name.c_str(),
                   dtype_name(scale->dtype), shape_str(scale->shape).c_str(), shape_str(want).c_str());
        r.has_scale = true;
        r.scale = *scale;
    }
    r.init = weight_init_for(weight, cfg);
    return r;
}

int64_t TensorRecipe::band_rows(int64_t b) const {
    return std::min(kBandRows, rows - b * kBandRows);
}

uint64_t TensorRecipe::weight_row_bytes() const {
    switch (enc) {
        case Encoding::BF16:
            return static_cast<uint64_t>(cols) * 2;
        case Encoding::F32:
            return static_cast<uint64_t>(cols) * 4;
        case Encoding::FP4Row:
            return static_cast<uint64_t>(cols) / 2;
        default:
            return static_cast<uint64_t>(cols);
    }
}

uint64_t TensorRecipe::weight_band_offset(int64_t b) const {
    return static_cast<uint64_t>(b * kBandRows) * weight_row_bytes();
}

uint64_t TensorRecipe::scale_band_offset(int64_t b) const {
    if (!has_scale) return 0;
    if (enc == Encoding::FP8Block) return static_cast<uint64_t>(b) * static_cast<uint64_t>(cols / 32);
    return static_cast<uint64_t>(b * kBandRows) * static_cast<uint64_t>(cols / 32);
}

uint64_t TensorRecipe::scale_band_bytes(int64_t b) const {
    if (!has_scale) return 0;
    if (enc == Encoding::FP8Block) return static_cast<uint64_t>(cols / 32);
    return static_cast<uint64_t>(band_rows(b)) * static_cast<uint64_t>(cols / 32);
}

namespace {

// Draws n 16-bit samples: four per 64-bit output of the band's stream, low half first.
void draw_raw(const TensorRecipe& r, uint64_t seed, int64_t band, size_t n, std::vector<uint16_t>& raw) {
    if (raw.size() < n + 4) raw.resize(n + 4);
    Rng rng(band_seed(seed, r.weight.name, band));
    for (size_t i = 0; i < n; i += 4) {
        const uint64_t v = rng.next();
        raw[i] = static_cast<uint16_t>(v);
        raw[i + 1] = static_cast<uint16_t>(v >> 16);
        raw[i + 2] = static_cast<uint16_t>(v >> 32);
        raw[i + 3] = static_cast<uint16_t>(v >> 48);
    }
}

// The value of one draw: mean + sd * (+-quantile) for Normal; low + span * (u + 1/2) / 2^16 for Uniform.
inline float draw_value(const WeightInit& init, const float* q, uint16_t u) {
    if (init.dist == WeightInit::Normal) {
        const float z = q[u & 0x7fffu];
        return init.a + init.b * ((u & 0x8000u) ? -z : z);
    }
    return init.a + (init.b - init.a) * ((static_cast<float>(u) + 0.5f) * (1.0f / 65536.0f));
}

// Code of every 16-bit draw for N(0, sd) values quantized with scale byte e: table[u] is exactly
// f32_to_e2m1 / f32_to_e4m3 of draw_value(u) * 2^(127 - e). Cached per thread.
const uint8_t* code_table(float sd, uint8_t e, bool fp4) {
    thread_local std::map<std::tuple<uint32_t, uint8_t, bool>, std::vector<uint8_t>> cache;
    auto key = std::make_tuple(f32_bits(sd), e, fp4);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second.data();
    if (cache.size() > 256) cache.clear();  // bounded: a handful of (sd, e) pairs per tensor kind
    const WeightInit init{WeightInit::Normal, 0.0f, sd};
    const float* q = normal_quantiles().data();
    const float inv = inv_scale(e);
    std::vector<uint8_t> t(65536);
    for (uint32_t u = 0; u < 65536; ++u) {
        const float v = draw_value(init, q, static_cast<uint16_t>(u)) * inv;
        t[u] = fp4 ? f32_to_e2m1(v) : f32_to_e4m3(v);
    }
    return cache.emplace(key, std::move(t)).first->second.data();
}

// amax of N(0, sd) draws = sd * quantile[largest index] (multiplying by sd > 0 is monotone).
inline uint16_t max_index(const uint16_t* u, size_t n, size_t stride, size_t count) {
    uint16_t m = 0;
    for (size_t r = 0; r < count; ++r)
        for (size_t j = 0; j < n; ++j) m = std::max<uint16_t>(m, u[r * stride + j] & 0x7fffu);
    return m;
}

}  // namespace

void generate_band(const TensorRecipe& r, uint64_t seed, int64_t band, uint8_t* wout, uint8_t* sout,
                   BandScratch& scratch, bool allow_fast) {
    const int64_t nr = r.band_rows(band), C = r.cols;
    const size_t n = static_cast<size_t>(nr * C);
    draw_raw(r, seed, band, n, scratch.raw);
    const uint16_t* u = scratch.raw.data();
    const float* q = normal_quantiles().data();
    const bool quantized =
        r.enc == Encoding::FP8Block || r.enc == Encoding::FP4Row || r.enc == Encoding::FP8Row;
    const bool fast =
        allow_fast && quantized && r.init.dist == WeightInit::Normal && r.init.a == 0.0f && r.init.b > 0.0f;
    const float sd = r.init.b;
    // Code tables of this band by scale byte (looked up once per scale value, not per block).
    const uint8_t* tables[256] = {};
    auto table = [&](uint8_t e, bool fp4) {
        if (!tables[e]) tables[e] = code_table(sd, e, fp4);
        return tables[e];
    };
    float* x = nullptr;
    if (!fast) {
        if (scratch.x.size() < n) scratch.x.resize(n);
        x = scratch.x.data();
        for (size_t i = 0; i < n; ++i) x[i] = draw_value(r.init, q, u[i]);
    }
    switch (r.enc) {
        case Encoding::BF16:
            for (size_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_bf16(x[i]);
                std::memcpy(wout + 2 * i, &h, 2);
            }
            break;
        case Encoding::F32:
            std::memcpy(wout, x, n * 4);
            break;
        case Encoding::FP8Block:
            // One e8m0 scale per 32x32 block: amax over the band's rows x 32 columns (docs/MODEL.md 3.4).
            for (int64_t cb = 0; cb < C / 32; ++cb) {
                float amax = 0.0f;
                if (fast) {
                    amax =
                        sd * q[max_index(u + cb * 32, 32, static_cast<size_t>(C), static_cast<size_t>(nr))];
                } else {
                    for (int64_t i = 0; i < nr; ++i)
                        for (int64_t j = cb * 32; j < cb * 32 + 32; ++j)
                            amax = std::max(amax, std::fabs(x[i * C + j]));
                }
                const uint8_t e = e8m0_ceil_scale(amax, 448.0f);
                sout[cb] = e;
                if (fast) {
                    const uint8_t* t = table(e, false);
                    for (int64_t i = 0; i < nr; ++i)
                        for (int64_t j = cb * 32; j < cb * 32 + 32; ++j) wout[i * C + j] = t[u[i * C + j]];
                } else {
                    const float inv = inv_scale(e);
                    for (int64_t i = 0; i < nr; ++i)
                        for (int64_t j = cb * 32; j < cb * 32 + 32; ++j)
                            wout[i * C + j] = f32_to_e4m3(x[i * C + j] * inv);
                }
            }
            break;
        case Encoding::FP8Row:
        case Encoding::FP4Row: {
            // One e8m0 scale per row per 32 along K (docs/MODEL.md 3.4: experts; 4.8: Engram rows).
            const bool fp4 = r.enc == Encoding::FP4Row;
            const float qmax = fp4 ? 6.0f : 448.0f;
            const int64_t nb = C / 32;
            for (int64_t i = 0; i < nr; ++i) {
                for (int64_t cb = 0; cb < nb; ++cb) {
                    const size_t at = static_cast<size_t>(i * C + cb * 32);
                    float amax = 0.0f;
                    if (fast) {
                        amax = sd * q[max_index(u + at, 32, 0, 1)];
                    } else {
                        for (int j = 0; j < 32; ++j)
                            amax = std::max(amax, std::fabs(x[at + static_cast<size_t>(j)]));
                    }
                    const uint8_t e = e8m0_ceil_scale(amax, qmax);
                    sout[i * nb + cb] = e;
                    if (fp4) {
                        // Two e2m1 codes per byte, the even element in the low nibble (docs/MODEL.md 3.2).
                        uint8_t* o = wout + i * (C / 2) + cb * 16;
                        if (fast) {
                            const uint8_t* t = table(e, true);
                            for (int j = 0; j < 16; ++j)
                                o[j] = static_cast<uint8_t>(t[u[at + 2 * j]] | (t[u[at + 2 * j + 1]] << 4));
                        } else {
                            const float inv = inv_scale(e);
                            for (int j = 0; j < 16; ++j)
                                o[j] = static_cast<uint8_t>(f32_to_e2m1(x[at + 2 * j] * inv) |
                                                            (f32_to_e2m1(x[at + 2 * j + 1] * inv) << 4));
                        }
                    } else {
                        uint8_t* o = wout + at;
                        if (fast) {
                            const uint8_t* t = table(e, false);
                            for (int j = 0; j < 32; ++j) o[j] = t[u[at + static_cast<size_t>(j)]];
                        } else {
                            const float inv = inv_scale(e);
                            for (int j = 0; j < 32; ++j)
                                o[j] = f32_to_e4m3(x[at + static_cast<size_t>(j)] * inv);
                        }
                    }
                }
            }
            break;
        }
    }
}

// ---- WorkerPool ----

WorkerPool::WorkerPool(int threads) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { loop(i); });
}

WorkerPool::~WorkerPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void WorkerPool::work(int id) {
    for (;;) {
        const int64_t i = next_.fetch_add(1);
        if (i >= n_) return;
        try {
            (*fn_)(i, id);
        } catch (...) {
            std::lock_guard<std::mutex> lk(mu_);
            if (!error_) error_ = std::current_exception();
            next_.store(n_);
        }
    }
}

void WorkerPool::loop(int id) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        work(id);
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (--active_ == 0) done_cv_.notify_all();
        }
    }
}

void WorkerPool::run(int64_t n, const std::function<void(int64_t, int)>& fn) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {
        for (int64_t i = 0; i < n; ++i) fn(i, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        fn_ = &fn;
        n_ = n;
        next_.store(0);
        error_ = nullptr;
        active_ = static_cast<int>(workers_.size());
        ++generation_;
    }
    cv_.notify_all();
    work(0);
    std::exception_ptr err;
    {
        std::unique_lock<std::mutex> lk(mu_);
        done_cv_.wait(lk, [&] { return active_ == 0; });
        fn_ = nullptr;
        err = error_;
        error_ = nullptr;
    }
    if (err) std::rethrow_exception(err);
}

}  // namespace ds4r::tiny
