// GEMM micro-benchmarks (see cuda_bench.h).
#include "backend/cuda/cuda_bench.h"

#include <cstring>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "ds4r/numeric.h"

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
uint8_t scale_byte(uint64_t v) { return static_cast<uint8_t>(127 - 8 + static_cast<int>((v >> 40) % 4)); }

// Times `iters` calls of fn after two warm-ups; TFLOP/s of a 2*M*N*K GEMM.
double time_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters, const std::function<void()>& fn) {
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
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * iters;
    return flops / (static_cast<double>(ms) * 1e-3) / 1e12;
}

}  // namespace

double bench_linear_fp8_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 1);
    Fp8Linear w{random_bytes(be, DType::F8_E4M3, {N, K}, 2, e4m3_code),
                random_bytes(be, DType::F8_E8M0, {(N + 31) / 32, (K + 31) / 32}, 3, scale_byte)};
    Tensor y = be.alloc(DType::BF16, {M, N});
    return time_tflops(be, M, N, K, iters, [&] { be.linear_fp8(x, w, y); });
}

double bench_linear_fp4_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters) {
    Tensor x = random_bf16(be, M, K, 4.0f, 4);
    Fp4Linear w{random_bytes(be, DType::I8, {N, K / 2}, 5, [](uint64_t v) { return static_cast<uint8_t>(v >> 24); }),
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
            DS4R_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                                           static_cast<int>(K), &alpha, w.data, CUDA_R_16BF, static_cast<int>(K),
                                           x.data, CUDA_R_16BF, static_cast<int>(K), &beta, y.data, CUDA_R_16BF,
                                           static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
    } catch (...) {
        cublasSetMathMode(h, saved);
        throw;
    }
    DS4R_CUBLAS_CHECK(cublasSetMathMode(h, saved));
    return r;
}

}  // namespace ds4r
