// Harness for the CUDA-vs-CPU op tests: the same inputs on both backends, outputs compared with the
// tolerance each op's contract states (bit-exact where docs/MODEL.md says exact). Tests skip with a clear
// message when ds4replay was built without CUDA or no GPU is present (CI).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/backend.h"

namespace ds4r::test {

// compute-sanitizer runs (DS4R_SANITIZER_RUN=1, scripts/gpu_suite.sh) use smaller shapes.
inline bool sanitizer_run() {
    const char* e = std::getenv("DS4R_SANITIZER_RUN");
    return e && std::string(e) == "1";
}

// The GEMM kernels of the CUDA test backend: DS4R_TEST_KERNELS=auto|portable|hopper (default auto:
// the Hopper wgmma kernels on an H100 / H200), so scripts/gpu_suite.sh runs every CUDA test on both
// families there.
inline GpuKernels test_kernels() {
    const char* e = std::getenv("DS4R_TEST_KERNELS");
    return e && *e ? parse_gpu_kernels(e) : GpuKernels::Auto;
}

// The two backends, created once per process. cuda() is nullptr when unavailable (see why()).
Backend& cpu();
Backend* cuda();
const std::string& cuda_why();

// Ops of both implementations that are not Backend ops (the forward never calls them; tests do):
// dispatched to CpuBackend / CudaBackend by the backend's type.
void act_quant_fp8(Backend& be, const Tensor& x, const Tensor& q, const Tensor& s);
void linear_fp4(Backend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y);
void window_indices(Backend& be, const Tensor& qpos, int64_t window, const Tensor& idx);

// Skip message: "no GPU found: CUDA tests skipped (why)". CTest reports these tests as skipped
// (tests/CMakeLists.txt) and scripts/test.sh prints the reason under its summary.
const std::string& cuda_skip_message();
#define DS4R_REQUIRE_CUDA()                                                           \
    do {                                                                              \
        if (!::ds4r::test::cuda()) GTEST_SKIP() << ::ds4r::test::cuda_skip_message(); \
    } while (0)

// The same tensor on the CPU and on the GPU.
struct Pair {
    Tensor c, g;
};
Pair make_pair(DType t, const Shape& shape, const void* host_bytes);
// A tensor on both sides whose GPU copy is filled with a poison byte (0xFF..: NaN for floats) so an
// unwritten output element is caught.
Pair make_output(DType t, const Shape& shape);
// Random inputs (deterministic from seed). bf16 values ~ N(0, scale^2) rounded to bf16.
Pair random_bf16(const Shape& shape, float scale, uint64_t seed);
Pair random_f32(const Shape& shape, float scale, uint64_t seed);
Pair random_bytes(DType t, const Shape& shape, uint64_t seed);  // any byte pattern (fp8 weights, ...)
// Valid fp8 e4m3 weights [N, K] with e8m0 block scales [N/32, K/32] (no NaN codes).
Fp8Linear random_fp8_linear(Backend& be, int64_t n, int64_t k, uint64_t seed,
                            std::vector<uint8_t>* w_host = nullptr, std::vector<uint8_t>* s_host = nullptr);
std::pair<Fp8Linear, Fp8Linear> random_fp8_linear_pair(int64_t n, int64_t k, uint64_t seed);
std::pair<Fp4Linear, Fp4Linear> random_fp4_linear_pair(int64_t n, int64_t k, uint64_t seed);

std::vector<uint8_t> to_host(Backend& be, const Tensor& t);

// Comparisons. `what` names the op/case in failure messages; the first mismatches are printed.
void expect_bitwise_equal(const Pair& p, const std::string& what);
// bf16 outputs: every element within max_ulps bf16 ulps, and at least min_equal of them bitwise equal.
void expect_bf16_close(const Pair& p, double max_ulps, double min_equal, const std::string& what);
// The same, with ulps taken of max(|cpu|, |cuda|, magnitude_floor): for results formed by cancellation
// (a*c - b*s, h + g*v) whose operands are ~magnitude_floor, where fused vs separate rounding of the
// operands legitimately moves a tiny result by many of its own ulps.
void expect_bf16_close(const Pair& p, double max_ulps, double min_equal, const std::string& what,
                       double magnitude_floor);
// fp32 / fp64 outputs: |a - b| <= abs_tol + rel_tol * |b|.
void expect_f32_close(const Pair& p, double rel_tol, double abs_tol, const std::string& what);
void expect_f64_close(const Pair& p, double rel_tol, double abs_tol, const std::string& what);

}  // namespace ds4r::test
