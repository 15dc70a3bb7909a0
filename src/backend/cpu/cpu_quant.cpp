// CPU activation quantization (docs/MODEL.md 5.1, 5.2): bit exact, one block at a time (cpu_ref.h).
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

void CpuBackend::act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s) {
    // x BF16 [M, K] -> q F8_E4M3 [M, K], s F8_E8M0 [M, K/32]
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::act_quant_fp8(x, q, s);
    const auto M = dims.M;
    const auto K = dims.K;
    const uint16_t* xp = x.ptr<uint16_t>();
    uint8_t* qp = q.ptr<uint8_t>();
    uint8_t* sp = s.ptr<uint8_t>();
    parallel_for(M, static_cast<double>(K), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < K / 32; ++b)
                cpuref::fp8_quant_block(xp + r * K + b * 32, 32, qp + r * K + b * 32, sp + r * (K / 32) + b);
    });
}

void CpuBackend::act_quant_fp8_inplace(const Tensor& x) {
    // x BF16 [M, K] <- bf16(e4m3(x / s) * s); the product is exact (docs/MODEL.md 5.1).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::act_quant_fp8_inplace(x);
    const auto M = dims.M;
    const auto K = dims.K;
    uint16_t* xp = x.ptr<uint16_t>();
    const float* lut = cpuref::e4m3_table();
    parallel_for(M, static_cast<double>(K), [&](int64_t r0, int64_t r1) {
        uint8_t q[32];
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < K / 32; ++b) {
                uint16_t* blk = xp + r * K + b * 32;
                const float s = cpuref::fp8_quant_block(blk, 32, q, nullptr);
                for (int i = 0; i < 32; ++i) blk[i] = f32_to_bf16(lut[q[i]] * s);
            }
    });
}

void CpuBackend::fp4_quant_inplace(const Tensor& x, Fp4Scale kind) {
    // x BF16 [M, K] <- bf16(e2m1(x / s) * s); exact product (docs/MODEL.md 5.2).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::fp4_quant_inplace(x, kind);
    const auto M = dims.M;
    const auto K = dims.K;
    const auto bs = dims.block;
    uint16_t* xp = x.ptr<uint16_t>();
    const float* lut = cpuref::e2m1_table();
    parallel_for(M, static_cast<double>(K), [&](int64_t r0, int64_t r1) {
        uint8_t codes[32];
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < K / bs; ++b) {
                uint16_t* blk = xp + r * K + b * bs;
                const float s = cpuref::fp4_quant_block(blk, bs, kind, codes, nullptr);
                for (int64_t i = 0; i < bs; ++i) blk[i] = f32_to_bf16(lut[codes[i]] * s);
            }
    });
}

}  // namespace ds4r
