// GEMM micro-benchmarks of the CUDA backend (see include/ds4r/kernel_bench.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_hc_check.h"
#include "ds4r/kernel_bench.h"
#include "ds4r/numeric.h"
#include "gemm.cuh"
#include "gemm_sm90.cuh"
#include "hc.cuh"
#include "head.cuh"
#include "quant.cuh"

namespace ds4r {

namespace {

// Fast deterministic host bytes (xorshift64*): operand values do not matter for timing.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 0x2545F4914F6CDD1Dull;
    }
};

Tensor random_bf16(CudaBackend& be, int64_t rows, int64_t cols, float scale, uint64_t seed) {
    Rng r(seed);
    std::vector<uint16_t> h(static_cast<size_t>(rows * cols));
    for (auto& v : h) v = f32_to_bf16((static_cast<float>(r.next() >> 40) / 16777216.0f - 0.5f) * scale);
    Tensor t = be.alloc(DType::BF16, {rows, cols});
    be.upload(t, 0, h.data(), h.size() * 2);
    return t;
}

// Bytes with a mask (e4m3 codes: no 0x7f / 0xff NaN; scales: a narrow exponent range).
Tensor random_bytes(CudaBackend& be, DType t, const Shape& shape, uint64_t seed,
                    const std::function<uint8_t(uint64_t)>& map) {
    Rng r(seed);
    std::vector<uint8_t> h(static_cast<size_t>(shape_numel(shape)));
    for (auto& v : h) v = map(r.next());
    Tensor x = be.alloc(t, shape);
    be.upload(x, 0, h.data(), h.size());
    return x;
}
uint8_t e4m3_code(uint64_t v) {
    uint8_t b = static_cast<uint8_t>(v >> 32);
    return (b & 0x7f) == 0x7f ? static_cast<uint8_t>(b & 0xfe) : b;
}
uint8_t fp4_byte(uint64_t v) {  // two e2m1 codes
    return static_cast<uint8_t>(v >> 24);
}
uint8_t scale_byte(uint64_t v) {
    return static_cast<uint8_t>(127 - 8 + static_cast<int>((v >> 40) % 4));
}

// Times `iters` calls of fn after two warm-ups; TFLOP/s of a 2*M*N*K GEMM.
double time_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters,
                   const std::function<void()>& fn) {
    DS4R_CHECK(iters > 0 && M > 0 && N > 0 && K > 0, "bench: bad arguments M=%lld N=%lld K=%lld iters=%d",
               (long long)M, (long long)N, (long long)K, iters);
    fn();
    fn();
    cudaEvent_t a, b;
    DS4R_CUDA_CHECK(cudaEventCreate(&a));
    DS4R_CUDA_CHECK(cudaEventCreate(&b));
    DS4R_CUDA_CHECK(cudaEventRecord(a, be.stream()));
    for (int i = 0; i < iters; ++i) fn();
    DS4R_CUDA_CHECK(cudaEventRecord(b, be.stream()));
    DS4R_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DS4R_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    const double flops =
        2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * iters;
    return flops / (static_cast<double>(ms) * 1e-3) / 1e12;
}

double bench_linear_fp8_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 1);
    Fp8Linear w{random_bytes(be, DType::F8_E4M3, {N, K}, 2, e4m3_code),
                random_bytes(be, DType::F8_E8M0, {(N + 31) / 32, (K + 31) / 32}, 3, scale_byte)};
    Tensor y = be.alloc(DType::BF16, {M, N});
    return time_tflops(be, M, N, K, iters, [&] { be.linear_fp8(x, w, y); });
}

double bench_linear_fp4_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 4);
    Fp4Linear w{random_bytes(be, DType::I8, {N, K / 2}, 5, fp4_byte),
                random_bytes(be, DType::F8_E8M0, {N, K / 32}, 6, scale_byte)};
    Tensor y = be.alloc(DType::BF16, {M, N});
    return time_tflops(be, M, N, K, iters, [&] { be.linear_fp4(x, w, y); });
}

double bench_linear_bf16_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 7);
    Tensor w = random_bf16(be, N, K, 0.1f, 8);
    Tensor y = be.alloc(DType::BF16, {M, N});
    return time_tflops(be, M, N, K, iters, [&] { be.linear_bf16(x, w, y); });
}

// Quantized activations [M, K] as the block-scaled GEMMs take them.
CudaBackend::GemmActs quant_acts(CudaBackend& be, int64_t M, int64_t K, uint64_t seed) {
    DS4R_CHECK(K % 32 == 0, "bench: K = %lld is not a multiple of 32", (long long)K);
    return be.quantize_gemm_acts(random_bf16(be, M, K, 4.0f, seed), M, K);
}

// The Hopper block-scaled partials the backend's kernel family runs (--kernels hopper-fp8: fp8 wgmma).
kern::Sm90Partials hopper_partials(const CudaBackend& be) {
    return be.gemm().fp8_partials ? kern::Sm90Partials::Fp8Wgmma : kern::Sm90Partials::Fp16Widened;
}

Tensor upload_i32(CudaBackend& be, const std::vector<int32_t>& v) {
    Tensor t = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
    be.upload(t, 0, v.data(), v.size() * sizeof(int32_t));
    return t;
}

double bench_grouped_fp4_tflops(CudaBackend& be, int experts, int64_t rows_per_expert, int64_t N, int64_t K,
                                int n_proj, int iters, int tile_rows, bool routed, ExpertLayout layout) {
    DS4R_CHECK(experts > 0 && rows_per_expert > 0 && (n_proj == 1 || n_proj == 2) && K % 32 == 0 &&
                   experts * rows_per_expert < (int64_t{1} << 30),
               "bench: bad grouped GEMM arguments (%d experts x %lld rows, N=%lld K=%lld, %d projections)",
               experts, (long long)rows_per_expert, (long long)N, (long long)K, n_proj);
    // rows of each expert: rows_per_expert, or (routed) drawn around it
    std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(rows_per_expert));
    if (routed) {
        std::mt19937 rng(23);
        std::poisson_distribution<int32_t> draw(static_cast<double>(rows_per_expert));
        for (auto& n : counts) n = draw(rng);
    }
    int64_t P = 0, max_rows = 1;
    for (int32_t n : counts) {
        P += n;
        max_rows = std::max<int64_t>(max_rows, n);
    }
    DS4R_CHECK(P > 0 && P < (int64_t{1} << 30), "bench: %lld grouped rows", (long long)P);
    const CudaBackend::GemmActs a = quant_acts(be, P, K, 17);
    // the routing plan (expert e owns the pair positions after expert e - 1's), 128-row tiles; activation
    // rows gathered through an (identity) row list as for w1 / w3 (two projections), or in pair order as
    // w2 reads them (one)
    std::vector<int32_t> tile_expert, tile_start, tile_begin, expert_begin, expert_end,
        rows(static_cast<size_t>(P));
    int32_t pos = 0;
    for (int e = 0; e < experts; ++e) {
        tile_begin.push_back(static_cast<int32_t>(tile_expert.size()));
        expert_begin.push_back(pos);
        for (int32_t r = 0; r < counts[static_cast<size_t>(e)]; r += 128) {
            tile_expert.push_back(e);
            tile_start.push_back(pos + r);
        }
        pos += counts[static_cast<size_t>(e)];
        expert_end.push_back(pos);
    }
    tile_begin.push_back(static_cast<int32_t>(tile_expert.size()));
    for (int64_t p = 0; p < P; ++p) rows[static_cast<size_t>(p)] = static_cast<int32_t>(p);
    const Tensor d_te = upload_i32(be, tile_expert), d_ts = upload_i32(be, tile_start);
    const Tensor d_tb = upload_i32(be, tile_begin), d_ee = upload_i32(be, expert_end),
                 d_rows = upload_i32(be, rows);
    // every expert its own weight buffers (realistic memory traffic), filled by device copies of one
    // random set (generating GBs of random bytes on the host would dominate the benchmark's time)
    const Tensor w_src = random_bytes(be, DType::I8, {N, K / 2}, 18, fp4_byte);
    const Tensor s_src = random_bytes(be, DType::F8_E8M0, {N, K / 32}, 19, scale_byte);
    std::vector<Tensor> wts, scs, ys;
    std::vector<const uint8_t*> wp[2], sp[2];
    for (int z = 0; z < n_proj; ++z) {
        // fp16 (the prepared experts' widest layout): each projection's experts in one buffer [E][N][K], as
        // prepare_experts lays them at one stride; -1 where it does not fit the budget
        std::optional<Tensor> f16;
        if (layout == ExpertLayout::F16 && !(f16 = be.try_alloc(DType::I8, {experts * N * K * 2}))) return -1;
        for (int e = 0; e < experts; ++e) {
            scs.push_back(be.alloc(DType::F8_E8M0, {N, K / 32}));
            be.copy(scs.back(), 0, s_src, 0, s_src.nbytes());
            if (f16) {
                uint8_t* dst = f16->ptr<uint8_t>() + static_cast<int64_t>(e) * N * K * 2;
                DS4R_CUDA_CHECK(
                    kern::launch_fp4_to_f16_folded(w_src.ptr<uint8_t>(), scs.back().ptr<uint8_t>(), N * K / 2,
                                                   reinterpret_cast<uint16_t*>(dst), be.stream()));
                wp[z].push_back(dst);
                sp[z].push_back(scs.back().ptr<uint8_t>());
                continue;
            }
            if (layout == ExpertLayout::E5m2) {  // the prepared experts' layout: e5m2 bytes [N, K]
                wts.push_back(be.alloc(DType::I8, {N, K}));
                DS4R_CUDA_CHECK(kern::launch_fp4_to_e5m2(w_src.ptr<uint8_t>(), N * K / 2,
                                                         wts.back().ptr<uint8_t>(), be.stream()));
            } else {
                wts.push_back(be.alloc(DType::I8, {N, K / 2}));
                be.copy(wts.back(), 0, w_src, 0, w_src.nbytes());
            }
            wp[z].push_back(wts.back().ptr<uint8_t>());
            sp[z].push_back(scs.back().ptr<uint8_t>());
        }
        if (f16) wts.push_back(std::move(*f16));
        ys.push_back(be.alloc(DType::BF16, {P, N}));
    }
    kern::GroupedFp4Gemm g{};
    g.q = a.q.ptr<uint8_t>();
    g.sa = a.s.ptr<uint8_t>();
    g.a_rows = n_proj == 2 ? d_rows.ptr<int32_t>() : nullptr;
    g.tile_expert = d_te.ptr<int32_t>();
    g.tile_start = d_ts.ptr<int32_t>();
    g.tile_begin = d_tb.ptr<int32_t>();
    g.expert_end = d_ee.ptr<int32_t>();
    g.max_tiles = static_cast<int64_t>(tile_expert.size());
    g.max_rows_per_expert = max_rows;
    g.pairs = P;
    g.n_experts = experts;
    g.n_proj = n_proj;
    g.N = N;
    g.K = K;
    g.w_e5m2 = layout == ExpertLayout::E5m2;
    g.w_f16 = layout == ExpertLayout::F16;
    for (int z = 0; z < n_proj; ++z) {
        g.w[z] = wp[z].data();
        g.s[z] = sp[z].data();
        g.y[z] = ys[static_cast<size_t>(z)].ptr<uint16_t>();
    }
    // the MoE's split of the plan by tile height (used by the Hopper kernels' Auto and Mixed)
    std::vector<Tensor> split;
    if (be.gemm().hopper) {
        const Tensor d_counts = upload_i32(be, counts), d_begin = upload_i32(be, expert_begin);
        split = attach_grouped_tile_split(be, d_counts.ptr<int32_t>(), d_begin.ptr<int32_t>(), experts,
                                          g.max_tiles, g, be.stream());
    }
    // one launch as the MoE makes it: with fp16 experts the gathered rows are first copied into pair order
    // (gather_pair_rows, timed with the GEMM)
    auto as_moe = [&](auto&& launch) {
        kern::GroupedFp4Gemm h = g;
        const std::vector<Tensor> pair_rows = gather_pair_rows(be, h, be.stream());
        DS4R_CUDA_CHECK(launch(h));
    };
    if (tile_rows != 0) {
        // the Hopper kernels with a forced tile shape (their partials as the backend's family)
        const auto partials = hopper_partials(be);
        const auto rows = tile_rows == 64  ? kern::Sm90GroupedRows::Rows64
                          : tile_rows == 1 ? kern::Sm90GroupedRows::Mixed
                          : tile_rows == 2 ? kern::Sm90GroupedRows::Rows128Narrow
                                           : kern::Sm90GroupedRows::Rows128;
        return time_tflops(be, P, N * n_proj, K, iters, [&] {
            as_moe([&](const kern::GroupedFp4Gemm& h) {
                return kern::launch_grouped_gemm_fp4_sm90_tiles(partials, rows, h, be.stream());
            });
        });
    }
    return time_tflops(be, P, N * n_proj, K, iters, [&] {
        as_moe([&](const kern::GroupedFp4Gemm& h) { return be.gemm().grouped_fp4(h, be.stream()); });
    });
}

double bench_head_logits_tflops(CudaBackend& be, int64_t M, int64_t V, int64_t D, int iters) {
    Tensor x = random_bf16(be, M, D, 4.0f, 21);
    Tensor w = random_bf16(be, V, D, 0.05f, 22);
    Tensor y = be.alloc(DType::F32, {M, V});
    return time_tflops(be, M, V, D, iters, [&] {
        be.head_logits(x.ptr<uint16_t>(), w.ptr<uint16_t>(), y.ptr<float>(), M, V, D);
    });
}

double bench_head_stats_tflops(CudaBackend& be, int64_t M, int64_t V, int64_t D, int k, int iters,
                               size_t head_offset) {
    DS4R_CHECK(head_offset % 16 == 0 && head_offset < 256, "bench: head offset %zu", head_offset);
    Tensor x = random_bf16(be, M, D, 4.0f, 27);
    // head bf16 [V, D] at head_offset bytes past the allocation's (256-byte aligned) start
    const Tensor w_alloc = random_bf16(be, V + 1, D, 0.05f, 28);
    Tensor w = w_alloc.rows(0, V);
    w.data = static_cast<uint8_t*>(w_alloc.data) + head_offset;
    std::vector<int32_t> t(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V);
    const Tensor targets = upload_i32(be, t);
    const HeadStatsOut out{be.alloc(DType::F64, {M}),    be.alloc(DType::F64, {M}),
                           be.alloc(DType::F32, {M}),    be.alloc(DType::I32, {M}),
                           be.alloc(DType::I32, {M, k}), be.alloc(DType::F32, {M, k})};
    return time_tflops(be, M, V, D, iters, [&] { be.head_stats(x, w, targets, k, out); });
}

double bench_hopper_gemm_tflops(CudaBackend& be, int kind, int64_t M, int64_t N, int64_t K, bool tma,
                                int iters) {
    const auto loads = kind == 5 ? kern::Sm90Loads::TmaWideK
                       : tma     ? kern::Sm90Loads::Tma
                                 : kern::Sm90Loads::CpAsync;
    Tensor x = random_bf16(be, M, K, 4.0f, 23);
    if (kind == 2 || kind == 3) {
        Tensor w = random_bf16(be, N, K, 0.05f, 24);
        const bool f32_out = kind == 3;
        Tensor y = be.alloc(f32_out ? DType::F32 : DType::BF16, {M, N});
        return time_tflops(be, M, N, K, iters, [&] {
            DS4R_CUDA_CHECK(kern::launch_gemm_bf16_sm90_loads(loads, x.ptr<uint16_t>(), K, 0,
                                                              w.ptr<uint16_t>(), K, 0, y.data, f32_out, N, 0,
                                                              M, N, K, 1, be.stream()));
        });
    }
    const bool fp4 = kind == 1;
    const auto partials = hopper_partials(be);
    const bool f16w = kind == 4 || kind == 5;
    if (f16w && partials != kern::Sm90Partials::Fp16Widened) return -1;  // fp16 weights: widened only
    const CudaBackend::GemmActs a = be.quantize_gemm_acts(x, M, K, kern::sm90_act_order(partials));
    Tensor w = fp4 ? random_bytes(be, DType::I8, {N, K / 2}, 25, fp4_byte)
                   : random_bytes(be, DType::F8_E4M3, {N, K}, 25, e4m3_code);
    Tensor s = random_bytes(be, DType::F8_E8M0, {fp4 ? N : (N + 31) / 32, K / 32}, 26, scale_byte);
    Tensor y = be.alloc(DType::BF16, {M, N});
    if (f16w) {
        // the weights widened once, outside the timing (the GEMM alone)
        Tensor w16 = be.alloc(DType::BF16, {N, K});
        DS4R_CUDA_CHECK(kern::launch_e4m3_to_f16(w.ptr<uint8_t>(), N * K, w16.ptr<uint16_t>(), be.stream()));
        return time_tflops(be, M, N, K, iters, [&] {
            DS4R_CUDA_CHECK(kern::launch_gemm_fp8_sm90_f16w(
                a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w16.ptr<uint16_t>(), s.ptr<uint8_t>(),
                y.ptr<uint16_t>(), N, M, N, K, be.stream(), loads));
        });
    }
    auto fn = fp4 ? kern::launch_gemm_fp4_sm90_partials : kern::launch_gemm_fp8_sm90_partials;
    return time_tflops(be, M, N, K, iters, [&] {
        DS4R_CUDA_CHECK(fn(partials, a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.ptr<uint8_t>(),
                           s.ptr<uint8_t>(), y.ptr<uint16_t>(), N, M, N, K, be.stream(), loads));
    });
}

double bench_mma_sync_peak_tflops(CudaBackend& be) {
    const int blocks = 2 * std::max(1, be.props().multiProcessorCount);
    Tensor out = be.alloc(DType::F32, {static_cast<int64_t>(blocks) * kern::mma_peak_threads_per_block()});
    DS4R_CUDA_CHECK(kern::launch_mma_peak(blocks, 1000, out.ptr<float>(), be.stream()));  // warm-up
    cudaEvent_t a, b;
    DS4R_CUDA_CHECK(cudaEventCreate(&a));
    DS4R_CUDA_CHECK(cudaEventCreate(&b));
    // 100k iterations: ~1.4e13 FLOP on an H200 (~25 ms), ~8.6e12 on an RTX 3090 (~0.12 s)
    const int iters = 100000;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        DS4R_CUDA_CHECK(cudaEventRecord(a, be.stream()));
        DS4R_CUDA_CHECK(kern::launch_mma_peak(blocks, iters, out.ptr<float>(), be.stream()));
        DS4R_CUDA_CHECK(cudaEventRecord(b, be.stream()));
        DS4R_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        DS4R_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        if (ms > 0)
            best = std::max(best, kern::mma_peak_flops_per_launch(blocks, iters) / (ms * 1e-3) / 1e12);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

double bench_cublas_bf16_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 9);
    Tensor w = random_bf16(be, N, K, 0.1f, 10);
    Tensor y = be.alloc(DType::BF16, {M, N});
    cublasHandle_t h = be.cublas();
    cublasMath_t saved;
    DS4R_CUBLAS_CHECK(cublasGetMathMode(h, &saved));
    DS4R_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    const float alpha = 1.0f, beta = 0.0f;
    double r = 0;
    try {
        // row-major y [M, N] = x [M, K] . W [N, K]^T  <=>  column-major y^T [N, M] = W^T . x^T
        r = time_tflops(be, M, N, K, iters, [&] {
            DS4R_CUBLAS_CHECK(cublasGemmEx(
                h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                &alpha, w.data, CUDA_R_16BF, static_cast<int>(K), x.data, CUDA_R_16BF, static_cast<int>(K),
                &beta, y.data, CUDA_R_16BF, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
    } catch (...) {
        cublasSetMathMode(h, saved);
        throw;
    }
    DS4R_CUBLAS_CHECK(cublasSetMathMode(h, saved));
    return r;
}

kern::HcMixAccum hc_variant(int variant) {
    DS4R_CHECK(variant >= 0 && variant < kHcMixVariants, "bench: hc mix variant %d out of range", variant);
    constexpr kern::HcMixAccum kByIndex[kHcMixVariants] = {
        kern::HcMixAccum::Fp32, kern::HcMixAccum::Fp64, kern::HcMixAccum::Compensated,
        kern::HcMixAccum::CompensatedG2, kern::HcMixAccum::Fp64Mma};
    return kByIndex[variant];
}

double bench_hc_mixes_ms(CudaBackend& be, int variant, int64_t M, int64_t D, int iters) {
    DS4R_CHECK(iters > 0 && M > 0 && D > 0, "bench: bad hc arguments M=%lld D=%lld iters=%d", (long long)M,
               (long long)D, iters);
    const kern::HcMixAccum accum = hc_variant(variant);
    constexpr int64_t hc = kern::kHcMult, mix = kern::kHcMix;
    const Tensor X = random_bf16(be, M, hc * D, 2.0f, 41);
    // fn rms ~ 1/sqrt(K) as in the checkpoints; bf16 values are exact fp32 values.
    const Tensor fnb = random_bf16(be, mix, hc * D, 2.0f / std::sqrt(static_cast<float>(hc * D)), 42);
    std::vector<uint16_t> fb(static_cast<size_t>(mix * hc * D));
    be.download(fb.data(), fnb, 0, fb.size() * 2);
    std::vector<float> ff(fb.size());
    for (size_t i = 0; i < fb.size(); ++i) ff[i] = bf16_to_f32(fb[i]);
    const Tensor fn = be.alloc(DType::F32, {mix, hc * D});
    be.upload(fn, 0, ff.data(), ff.size() * 4);
    const float scale_h[3] = {0.7f, 0.9f, 0.6f};
    std::vector<float> base_h(static_cast<size_t>(mix), 0.1f);
    const Tensor scale = be.alloc(DType::F32, {3}), base = be.alloc(DType::F32, {mix});
    be.upload(scale, 0, scale_h, sizeof scale_h);
    be.upload(base, 0, base_h.data(), base_h.size() * 4);
    const Tensor pre = be.alloc(DType::F32, {M, hc}), post = be.alloc(DType::F32, {M, hc}),
                 comb = be.alloc(DType::F32, {M, hc, hc});
    const float inv_n = 1.0f / static_cast<float>(hc * D);
    auto fn_call = [&] {
        DS4R_CUDA_CHECK(kern::launch_hc_mixes(
            X.ptr<uint16_t>(), fn.ptr<float>(), scale.ptr<float>(), base.ptr<float>(), M, D, inv_n, 1e-6f,
            1e-6f, 20, pre.ptr<float>(), post.ptr<float>(), comb.ptr<float>(), be.stream(), accum));
    };
    // time_tflops reports 2 * M * N * K * iters / elapsed: with M = N = K = 1 that is 2 * iters / s.
    const double per_s = time_tflops(be, 1, 1, 1, iters, fn_call) * 1e12;
    return 2.0 / per_s * 1e3;
}

double bench_sparse_attn_tflops(CudaBackend& be, int64_t M, int64_t H, int64_t hd, int64_t s, int64_t T,
                                int64_t window, int64_t topk, int heads_per_cta, int iters) {
    DS4R_CHECK(M > 0 && M <= s && H > 0 && hd > 0 && T > 0 && window > 0 && topk > 0 && topk <= T,
               "bench: bad sparse_attn arguments M=%lld H=%lld hd=%lld s=%lld T=%lld window=%lld topk=%lld",
               (long long)M, (long long)H, (long long)hd, (long long)s, (long long)T, (long long)window,
               (long long)topk);
    const kern::SparseAttnCta cta =
        heads_per_cta == 64 ? kern::SparseAttnCta::Heads64 : kern::SparseAttnCta::Heads16;
    if (kern::sparse_attn_heads_per_cta(cta) != heads_per_cta || !kern::sparse_attn_supported_dim(hd) ||
        kern::sparse_attn_smem_bytes(hd, cta) > be.props().sharedMemPerBlockOptin)
        return -1;
    const Tensor q = random_bf16(be, M * H, hd, 2.0f, 51), win = random_bf16(be, s, hd, 2.0f, 52),
                 cmp = random_bf16(be, T, hd, 2.0f, 53);
    const int64_t n_idx = window + topk;
    std::vector<float> sink_h(static_cast<size_t>(H), 0.5f);
    std::vector<int32_t> idx_h(static_cast<size_t>(M * n_idx));
    Rng r(54);
    std::vector<int32_t> pool(static_cast<size_t>(T));
    for (int64_t i = 0; i < M; ++i) {
        const int64_t p = s - M + i;  // the query's position: its window ends at itself
        for (int64_t c = 0; c < window; ++c) {
            const int64_t j = p - window + 1 + c;
            idx_h[static_cast<size_t>(i * n_idx + c)] = j < 0 ? -1 : static_cast<int32_t>(j);
        }
        // topk distinct compressed rows (a partial Fisher-Yates draw), ascending, as the indexer's
        for (int64_t j = 0; j < T; ++j) pool[static_cast<size_t>(j)] = static_cast<int32_t>(j);
        for (int64_t c = 0; c < topk; ++c)
            std::swap(
                pool[static_cast<size_t>(c)],
                pool[static_cast<size_t>(c + static_cast<int64_t>(r.next() % static_cast<uint64_t>(T - c)))]);
        std::sort(pool.begin(), pool.begin() + topk);
        for (int64_t c = 0; c < topk; ++c)
            idx_h[static_cast<size_t>(i * n_idx + window + c)] =
                pool[static_cast<size_t>(c)] + static_cast<int32_t>(s);
    }
    const Tensor sink = be.alloc(DType::F32, {H}), idx = be.alloc(DType::I32, {M, n_idx}),
                 o = be.alloc(DType::BF16, {M * H, hd});
    be.upload(sink, 0, sink_h.data(), sink_h.size() * 4);
    be.upload(idx, 0, idx_h.data(), idx_h.size() * 4);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    // time_tflops counts 2 * M * N * K per call: QK and PV are 2 * (2 M H n_idx hd)
    return time_tflops(be, 2 * M * H, n_idx, hd, iters, [&] {
        DS4R_CUDA_CHECK(kern::launch_sparse_attn(q.ptr<uint16_t>(), win.ptr<uint16_t>(), cmp.ptr<uint16_t>(),
                                                 sink.ptr<float>(), idx.ptr<int32_t>(), o.ptr<uint16_t>(), M,
                                                 H, hd, s, T, n_idx, scale, be.stream(), cta));
    });
}

class CudaKernelBench : public KernelBench {
public:
    explicit CudaKernelBench(CudaBackend& be) : be_(be) {}
    double linear_fp8_tflops(int64_t M, int64_t N, int64_t K, int iters) override {
        return bench_linear_fp8_tflops(be_, M, N, K, iters);
    }
    double linear_fp4_tflops(int64_t M, int64_t N, int64_t K, int iters) override {
        return bench_linear_fp4_tflops(be_, M, N, K, iters);
    }
    double linear_bf16_tflops(int64_t M, int64_t N, int64_t K, int iters) override {
        return bench_linear_bf16_tflops(be_, M, N, K, iters);
    }
    double cublas_bf16_tflops(int64_t M, int64_t N, int64_t K, int iters) override {
        return bench_cublas_bf16_tflops(be_, M, N, K, iters);
    }
    double grouped_fp4_tflops(int experts, int64_t rows_per_expert, int64_t N, int64_t K, int n_proj,
                              int iters, int tile_rows, bool routed, ExpertLayout layout) override {
        const bool prepared = layout != ExpertLayout::None;
        if ((tile_rows != 0 || prepared) && !be_.gemm().hopper) return -1;
        if (prepared && be_.gemm().fp8_partials) return -1;  // widened partials only
        return bench_grouped_fp4_tflops(be_, experts, rows_per_expert, N, K, n_proj, iters, tile_rows, routed,
                                        layout);
    }
    double head_logits_tflops(int64_t M, int64_t V, int64_t D, int iters) override {
        return bench_head_logits_tflops(be_, M, V, D, iters);
    }
    int64_t head_launch_rows() const override { return kern::kHeadChunkRows; }
    double head_stats_tflops(int64_t M, int64_t V, int64_t D, int k, int iters, size_t head_offset) override {
        return bench_head_stats_tflops(be_, M, V, D, k, iters, head_offset);
    }
    std::string gemm_family() const override { return be_.gemm().name(); }
    double hopper_gemm_tflops(int kind, int64_t M, int64_t N, int64_t K, bool tma, int iters) override {
        if (!be_.gemm().hopper) return -1;
        return bench_hopper_gemm_tflops(be_, kind, M, N, K, tma, iters);
    }
    double mma_sync_peak_tflops() override { return bench_mma_sync_peak_tflops(be_); }
    double hc_mixes_ms(int variant, int64_t M, int64_t D, int iters) override {
        return bench_hc_mixes_ms(be_, variant, M, D, iters);
    }
    int hc_mix_default_variant() const override { return ds4r::hc_mix_default_variant(be_); }
    double sparse_attn_tflops(int64_t M, int64_t H, int64_t hd, int64_t s, int64_t T, int64_t window,
                              int64_t topk, int heads_per_cta, int iters) override {
        return bench_sparse_attn_tflops(be_, M, H, hd, s, T, window, topk, heads_per_cta, iters);
    }
    int sparse_attn_heads_per_cta() const override {
        return static_cast<int>(kern::sparse_attn_heads_per_cta(be_.gemm().attn_cta));
    }
    void reset_memory_high_water() override { be_.reset_high_water(); }
    size_t memory_high_water() const override { return be_.high_water(); }

private:
    CudaBackend& be_;
};

}  // namespace

int hc_mix_default_variant(const CudaBackend& be) {
    for (int v = 0; v < kHcMixVariants; ++v)
        if (hc_variant(v) == be.gemm().hc_mix) return v;
    return -1;
}

std::vector<float> hc_mix_dots(CudaBackend& be, int variant, const Tensor& X, const Tensor& fn) {
    DS4R_CHECK(X.dtype == DType::BF16 && X.shape.size() == 3 && X.dim(1) == kern::kHcMult &&
                   fn.dtype == DType::F32 && fn.shape == Shape({kern::kHcMix, kern::kHcMult * X.dim(2)}),
               "hc_mix_dots: X %s, fn %s: expected BF16 [M, %d, D], F32 [%d, %d * D]",
               shape_str(X.shape).c_str(), shape_str(fn.shape).c_str(), kern::kHcMult, kern::kHcMix,
               kern::kHcMult);
    const int64_t M = X.dim(0), D = X.dim(2);
    std::vector<float> out(static_cast<size_t>(M * (kern::kHcMix + 1)));
    if (M == 0) return out;
    const Tensor dots = be.alloc(DType::F32, {M, kern::kHcMix + 1});
    DS4R_CUDA_CHECK(kern::launch_hc_mix_dots(X.ptr<uint16_t>(), fn.ptr<float>(), M, D, dots.ptr<float>(),
                                             be.stream(), hc_variant(variant)));
    be.download(out.data(), dots, 0, out.size() * 4);
    return out;
}

std::unique_ptr<KernelBench> make_kernel_bench(Backend& be) {
    auto* cb = dynamic_cast<CudaBackend*>(&be);
    if (!cb) return nullptr;
    return std::make_unique<CudaKernelBench>(*cb);
}

}  // namespace ds4r
