// CPU linears (docs/MODEL.md 4.0, 5.3, 4.6 f).
//
// fp8 / fp4 weights: the activation is quantized per 32 along K (5.1); then for every output
//   C[m, n] = sum over K blocks kb, IN K ORDER, of (fp32(P[m, n, kb]) * sa[m, kb]) * sw[.., kb]
// added to an fp32 accumulator, rounded to bf16 once. P is the block's dot product of the
// dequantized (unscaled) fp8 / fp4 values; every product is exact and the 32-term sum is exact in
// double, so P is computed exactly and rounded once to fp32: our model of the kernel's fp32 MMA
// accumulator, whose internal order inside one block is the only thing not reproduced.
// bf16 / fp32 weights (cuBLAS GEMMs in the reference): fp64 accumulation, rounded once to fp32
// (and then to bf16 for bf16 outputs). No TF32.
#include <algorithm>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

namespace {

constexpr int64_t kColChunk = 64;  // output columns per parallel work item

inline float to_f32(float v) {
    return v;
}
inline float to_f32(uint16_t bf16) {
    return bf16_to_f32(bf16);
}

// Activations quantized per 32 along K: unscaled e4m3 values (as double) and the per-block
// power-of-two scales.
struct QuantizedRows {
    std::vector<double> v;  // [M, K]
    std::vector<float> s;   // [M, K / 32]
};

QuantizedRows quantize_rows(const CpuBackend& be, const uint16_t* x, int64_t M, int64_t K) {
    QuantizedRows a;
    const int64_t KB = K / 32;
    a.v.resize(static_cast<size_t>(M * K));
    a.s.resize(static_cast<size_t>(M * KB));
    const float* lut = cpuref::e4m3_table();
    be.parallel_for(M, static_cast<double>(K), [&](int64_t r0, int64_t r1) {
        uint8_t q[32];
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < KB; ++b) {
                a.s[static_cast<size_t>(r * KB + b)] =
                    cpuref::fp8_quant_block(x + r * K + b * 32, 32, q, nullptr);
                double* dst = a.v.data() + r * K + b * 32;
                for (int i = 0; i < 32; ++i) dst[i] = lut[q[i]];
            }
    });
    return a;
}

// Code -> value tables in double (e4m3: 256 entries; e2m1: 16) and e8m0 -> scale (256).
struct Luts {
    double e4m3[256];
    double e2m1[16];
    float e8m0[256];
    Luts() {
        for (int c = 0; c < 256; ++c) e4m3[c] = cpuref::e4m3_table()[c];
        for (int c = 0; c < 16; ++c) e2m1[c] = cpuref::e2m1_table()[c];
        for (int c = 0; c < 256; ++c) e8m0[c] = e8m0_to_f32(static_cast<uint8_t>(c));
    }
};
const Luts& luts() {
    static const Luts l;
    return l;
}

// The exact dot product of one 32-element K block. Every e4m3 value is an integer multiple of
// 2^-9 below 2^9 and every e2m1 value a multiple of 2^-1, so each product and every partial sum is
// a multiple of 2^-18 below 2^23: all exactly representable in double. The summation order is
// therefore irrelevant (four independent accumulators give the same bits as one chain).
inline double block_dot_fp8(const double* a, const uint8_t* w, const double* lut) {
    double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0;
    for (int k = 0; k < 32; k += 4) {
        p0 += a[k] * lut[w[k]];
        p1 += a[k + 1] * lut[w[k + 1]];
        p2 += a[k + 2] * lut[w[k + 2]];
        p3 += a[k + 3] * lut[w[k + 3]];
    }
    return (p0 + p1) + (p2 + p3);
}
// Same for 16 packed bytes of e2m1 codes (even k in the low nibble, docs/MODEL.md 3.2).
inline double block_dot_fp4(const double* a, const uint8_t* w, const double* lut) {
    double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0;
    for (int b = 0; b < 16; b += 2) {
        p0 += a[2 * b] * lut[w[b] & 15u];
        p1 += a[2 * b + 1] * lut[w[b] >> 4];
        p2 += a[2 * b + 2] * lut[w[b + 1] & 15u];
        p3 += a[2 * b + 3] * lut[w[b + 1] >> 4];
    }
    return (p0 + p1) + (p2 + p3);
}

// Parallel loop over (row, chunk of output columns) work items.
template <class F>
void for_rows_and_col_chunks(const CpuBackend& be, int64_t M, int64_t N, int64_t K, F&& body) {
    const int64_t chunks = (N + kColChunk - 1) / kColChunk;
    be.parallel_for(M * chunks, static_cast<double>(kColChunk * std::max<int64_t>(K, 1)),
                    [&](int64_t i0, int64_t i1) {
                        for (int64_t i = i0; i < i1; ++i) {
                            const int64_t m = i / chunks, c = i % chunks;
                            body(m, c * kColChunk, std::min(N, (c + 1) * kColChunk));
                        }
                    });
}

// y[m, n] = fp32(sum_k x[m, k] * w[n, k]) accumulated in double; out(m, n, value).
template <class XT, class WT, class Out>
void dense_gemm(const CpuBackend& be, const XT* x, const WT* w, int64_t M, int64_t N, int64_t K, Out&& out) {
    for_rows_and_col_chunks(be, M, N, K, [&](int64_t m, int64_t n0, int64_t n1) {
        std::vector<double> xr(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k) xr[static_cast<size_t>(k)] = to_f32(x[m * K + k]);
        for (int64_t n = n0; n < n1; ++n) {
            const WT* wr = w + n * K;
            double s = 0.0;
            for (int64_t k = 0; k < K; ++k)
                s += xr[static_cast<size_t>(k)] * static_cast<double>(to_f32(wr[k]));
            out(m, n, static_cast<float>(s));
        }
    });
}

}  // namespace

void CpuBackend::fp8_linear_rows(const uint16_t* x, int64_t M, const Fp8Linear& w, uint16_t* y) const {
    // The row kernels also serve the MoE's shared expert, whose weights reach them unchecked.
    opcheck::fp8_weight("linear_fp8", "w", w);
    const int64_t N = w.w.dim(0), K = w.w.dim(1), KB = K / 32;
    DS4R_CHECK(K % 32 == 0, "linear_fp8: K = %lld is not a multiple of 32", (long long)K);
    const QuantizedRows a = quantize_rows(*this, x, M, K);
    const Luts& L = luts();
    const uint8_t* W = w.w.ptr<uint8_t>();
    const uint8_t* S = w.s.ptr<uint8_t>();
    for_rows_and_col_chunks(*this, M, N, K, [&](int64_t m, int64_t n0, int64_t n1) {
        const double* am = a.v.data() + m * K;
        const float* sm = a.s.data() + m * KB;
        for (int64_t n = n0; n < n1; ++n) {
            const uint8_t* wn = W + n * K;
            const uint8_t* swn = S + (n / 32) * KB;  // one weight scale per 32x32 tile
            float acc = 0.0f;
            for (int64_t kb = 0; kb < KB; ++kb) {
                const double p = block_dot_fp8(am + kb * 32, wn + kb * 32, L.e4m3);
                acc += (static_cast<float>(p) * sm[kb]) * L.e8m0[swn[kb]];
            }
            y[m * N + n] = f32_to_bf16(acc);
        }
    });
}

void CpuBackend::fp4_linear_rows(const uint16_t* x, int64_t M, const Fp4Linear& w, uint16_t* y) const {
    const int64_t N = w.w.dim(0), K = opcheck::fp4_weight("linear_fp4", "w", w), KB = K / 32;
    const QuantizedRows a = quantize_rows(*this, x, M, K);
    const Luts& L = luts();
    const uint8_t* W = w.w.ptr<uint8_t>();
    const uint8_t* S = w.s.ptr<uint8_t>();
    for_rows_and_col_chunks(*this, M, N, K, [&](int64_t m, int64_t n0, int64_t n1) {
        const double* am = a.v.data() + m * K;
        const float* sm = a.s.data() + m * KB;
        for (int64_t n = n0; n < n1; ++n) {
            const uint8_t* wn = W + n * (K / 2);
            float acc = 0.0f;
            for (int64_t kb = 0; kb < KB; ++kb) {
                const double p = block_dot_fp4(am + kb * 32, wn + kb * 16, L.e2m1);
                acc += (static_cast<float>(p) * sm[kb]) * L.e8m0[S[n * KB + kb]];
            }
            y[m * N + n] = f32_to_bf16(acc);
        }
    });
}

void CpuBackend::linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) {
    // x BF16 [M, K], W F8_E4M3 [N, K] (+ e8m0 scales per 32x32) -> y BF16 [M, N]
    const opcheck::LinearDims d = opcheck::linear_fp8(x, w, y);
    fp8_linear_rows(x.ptr<uint16_t>(), d.M, w, y.ptr<uint16_t>());
}

void CpuBackend::linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y) {
    // x BF16 [M, K], W packed e2m1 [N, K/2] (+ e8m0 scales [N, K/32]) -> y BF16 [M, N]
    const opcheck::LinearDims d = opcheck::linear_fp4(x, w, y);
    fp4_linear_rows(x.ptr<uint16_t>(), d.M, w, y.ptr<uint16_t>());
}

void CpuBackend::linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) {
    // x BF16 [M, K] @ W BF16 [N, K]^T -> y BF16 [M, N]: fp64 accumulation -> fp32 -> bf16
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::linear_bf16(x, w, y);
    const auto M = dims.M;
    const auto N = dims.N;
    const auto K = dims.K;
    uint16_t* yp = y.ptr<uint16_t>();
    dense_gemm(*this, x.ptr<uint16_t>(), w.ptr<uint16_t>(), M, N, K,
               [&](int64_t m, int64_t n, float v) { yp[m * N + n] = f32_to_bf16(v); });
}

void CpuBackend::linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) {
    // f32(x BF16|F32 [M, K]) @ f32(W BF16|F32 [N, K])^T -> y F32 [M, N]: fp64 accumulation -> fp32
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::linear_f32(x, w, y);
    const auto M = dims.M;
    const auto N = dims.N;
    const auto K = dims.K;
    float* yp = y.ptr<float>();
    auto out = [&](int64_t m, int64_t n, float v) { yp[m * N + n] = v; };
    if (x.dtype == DType::BF16 && w.dtype == DType::BF16)
        dense_gemm(*this, x.ptr<uint16_t>(), w.ptr<uint16_t>(), M, N, K, out);
    else if (x.dtype == DType::BF16)
        dense_gemm(*this, x.ptr<uint16_t>(), w.ptr<float>(), M, N, K, out);
    else if (w.dtype == DType::BF16)
        dense_gemm(*this, x.ptr<float>(), w.ptr<uint16_t>(), M, N, K, out);
    else
        dense_gemm(*this, x.ptr<float>(), w.ptr<float>(), M, N, K, out);
}

void CpuBackend::linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) {
    // o BF16 [M, G * Kg], W fp8 [G * R, Kg] -> y BF16 [M, G * R],
    // y[:, g*R + r] = sum_d o[:, g*Kg + d] * bf16(W[g*R + r, d]) (docs/MODEL.md 4.6 f, 3.6).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::linear_wo_a(o, w, groups, y);
    const auto M = dims.M;
    const auto G = dims.G;
    const auto R = dims.R;
    const auto Kg = dims.Kg;
    // convert.py dequantizes wo_a once: fp32(e4m3) * 2^(e - 127) per 32x32 tile, cast to bf16 (exact).
    const int64_t KBs = (Kg + 31) / 32;
    std::vector<float> wd(static_cast<size_t>(G * R * Kg));
    const uint8_t* W = w.w.ptr<uint8_t>();
    const uint8_t* S = w.s.ptr<uint8_t>();
    const float* lut = cpuref::e4m3_table();
    for (int64_t row = 0; row < G * R; ++row)
        for (int64_t d = 0; d < Kg; ++d)
            wd[static_cast<size_t>(row * Kg + d)] =
                round_bf16(lut[W[row * Kg + d]] * e8m0_to_f32(S[(row / 32) * KBs + d / 32]));
    const uint16_t* op_ = o.ptr<uint16_t>();
    uint16_t* yp = y.ptr<uint16_t>();
    for_rows_and_col_chunks(*this, M, G * R, Kg, [&](int64_t m, int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t g = c / R;
            const uint16_t* om = op_ + m * G * Kg + g * Kg;
            const float* wr = wd.data() + c * Kg;
            double s = 0.0;
            for (int64_t d = 0; d < Kg; ++d)
                s += static_cast<double>(bf16_to_f32(om[d])) * static_cast<double>(wr[d]);
            yp[m * G * R + c] = f32_to_bf16(static_cast<float>(s));
        }
    });
}

}  // namespace ds4r
