// Scalar building blocks of the CPU reference backend (see cpu_ref.h).
#include "cpu_ref.h"

#include <algorithm>
#include <array>
#include <functional>

#include "ds4r/error.h"

namespace ds4r::cpuref {

namespace {

std::array<float, 256> make_e4m3_table() {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
}
std::array<float, 16> make_e2m1_table() {
    std::array<float, 16> t{};
    for (int c = 0; c < 16; ++c) t[static_cast<size_t>(c)] = e2m1_to_f32(static_cast<uint8_t>(c));
    return t;
}

}  // namespace

const float* e4m3_table() {
    static const std::array<float, 256> t = make_e4m3_table();
    return t.data();
}
const float* e2m1_table() {
    static const std::array<float, 16> t = make_e2m1_table();
    return t.data();
}

// ------------------------------------------------------------------ quantization

float block_amax_bf16(const uint16_t* x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(bf16_to_f32(x[i]));
        if (std::isnan(a)) return a;
        if (a > amax) amax = a;
    }
    return amax;
}

float fp8_quant_block(const uint16_t* x, int64_t n, uint8_t* q, uint8_t* scale_byte) {
    // docs/MODEL.md 5.1: amax floored at 1e-4, scale rounded UP to a power of two, clamp +-448, RNE.
    const float s = fp8_block_scale(block_amax_bf16(x, n));
    for (int64_t i = 0; i < n; ++i) q[i] = fp8_code(bf16_to_f32(x[i]), s);
    if (scale_byte) *scale_byte = e8m0_of_pow2(s);
    return s;
}

float fp4_block_scale(float amax, Fp4Scale kind, uint8_t* scale_byte) {
    if (kind == Fp4Scale::E8M0_32) {
        const float s = fp4_e8m0_block_scale(amax);
        if (scale_byte) *scale_byte = e8m0_of_pow2(s);
        return s;
    }
    const uint8_t code = fp4_e4m3_block_scale_code(amax);
    if (scale_byte) *scale_byte = code;
    return e4m3_to_f32(code);
}

float fp4_quant_block(const uint16_t* x, int64_t n, Fp4Scale kind, uint8_t* codes, uint8_t* scale_byte) {
    const float s = fp4_block_scale(block_amax_bf16(x, n), kind, scale_byte);
    for (int64_t i = 0; i < n; ++i) codes[i] = fp4_code(bf16_to_f32(x[i]), s);
    return s;
}

// ------------------------------------------------------------------ router sum

float topk_weight_sum(const float* w, int k) {
    if (k == 6) return ((w[0] + w[4]) + w[2]) + ((w[1] + w[5]) + w[3]);
    float s = 0.0f;
    for (int i = 0; i < k; ++i) s += w[i];
    return s;
}

// ------------------------------------------------------------------ top-k

void select_topk_cuda_rule(const float* values, int64_t n, int64_t k, std::vector<uint32_t>& scratch,
                           int64_t* out) {
    DS4R_CHECK(k >= 0 && k <= n, "select_topk_cuda_rule: k = %lld outside [0, %lld]", (long long)k,
               (long long)n);
    if (k == 0) return;
    scratch.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) scratch[static_cast<size_t>(i)] = topk_order_key(values[i]);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<uint32_t>());
    const uint32_t kth = scratch[static_cast<size_t>(k - 1)];
    int64_t taken = 0;
    for (int64_t i = 0; i < n; ++i)
        if (topk_order_key(values[i]) > kth) out[taken++] = i;
    for (int64_t i = 0; i < n && taken < k; ++i)
        if (topk_order_key(values[i]) == kth) out[taken++] = i;
}

std::vector<int64_t> select_topk_cuda_rule(const float* values, int64_t n, int64_t k) {
    std::vector<int64_t> out(static_cast<size_t>(k));
    std::vector<uint32_t> scratch;
    select_topk_cuda_rule(values, n, k, scratch, out.data());
    return out;
}

std::vector<int64_t> topk_sorted_desc_cuda_rule(const float* values, int64_t n, int64_t k) {
    std::vector<int64_t> out = select_topk_cuda_rule(values, n, k);
    std::sort(out.begin(), out.end(), [&](int64_t a, int64_t b) {
        const uint32_t ka = topk_order_key(values[a]), kb = topk_order_key(values[b]);
        return ka != kb ? ka > kb : a < b;
    });
    return out;
}

// ------------------------------------------------------------------ Sinkhorn

void hc_split_sinkhorn(const float* m, const float* scale, const float* base, int hc, int iters, float eps,
                       float* pre, float* post, float* comb) {
    for (int k = 0; k < hc; ++k) pre[k] = sigmoid_f32(m[k] * scale[0] + base[k]) + eps;
    for (int k = 0; k < hc; ++k) post[k] = 2.0f * sigmoid_f32(m[hc + k] * scale[1] + base[hc + k]);
    float* c = comb;
    for (int i = 0; i < hc * hc; ++i) c[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
    // softmax over each row (max-subtracted, true division), then + eps
    for (int j = 0; j < hc; ++j) {
        float* row = c + j * hc;
        float mx = row[0];
        for (int k = 1; k < hc; ++k) mx = std::max(mx, row[k]);
        float s = 0.0f;
        for (int k = 0; k < hc; ++k) {
            row[k] = std::exp(row[k] - mx);
            s += row[k];
        }
        for (int k = 0; k < hc; ++k) row[k] = row[k] / s + eps;
    }
    auto col_normalize = [&] {
        for (int k = 0; k < hc; ++k) {
            float s = 0.0f;
            for (int j = 0; j < hc; ++j) s += c[j * hc + k];
            const float d = s + eps;
            for (int j = 0; j < hc; ++j) c[j * hc + k] = c[j * hc + k] / d;
        }
    };
    auto row_normalize = [&] {
        for (int j = 0; j < hc; ++j) {
            float s = 0.0f;
            for (int k = 0; k < hc; ++k) s += c[j * hc + k];
            const float d = s + eps;
            for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / d;
        }
    };
    col_normalize();
    for (int it = 0; it < iters - 1; ++it) {
        row_normalize();
        col_normalize();
    }
}

// ------------------------------------------------------------------ RoPE tables

void rope_inv_freqs(double base, double factor, int64_t orig, double beta_fast, double beta_slow, int64_t rd,
                    float* f) {
    const int64_t half = rd / 2;
    for (int64_t i = 0; i < half; ++i) {
        // torch: base ** (arange(0, rd, 2, fp32) / rd), then 1.0 / that (a reciprocal).
        const float expo = static_cast<float>(2 * i) / static_cast<float>(rd);
        const float p = static_cast<float>(
            std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(expo)));
        f[i] = 1.0f / p;
    }
    if (orig <= 0) return;
    int64_t low = 0, high = 0;
    yarn_band(base, orig, beta_fast, beta_slow, rd, &low, &high);
    const float span = high - low > 0 ? static_cast<float>(high - low) : 1e-3f;
    for (int64_t i = 0; i < half; ++i) {
        float ramp = (static_cast<float>(i) - static_cast<float>(low)) / span;
        ramp = std::min(std::max(ramp, 0.0f), 1.0f);
        const float smooth = 1.0f - ramp;
        const float scaled = f[i] / static_cast<float>(factor);
        f[i] = scaled * (1.0f - smooth) + f[i] * smooth;
    }
}

}  // namespace ds4r::cpuref
