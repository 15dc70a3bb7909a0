// CudaBackend ops: activation quantization and the linears (docs/MODEL.md 4.0, 5.1-5.3, 3.6, 4.6 f).
// Contracts: backend/op_checks.h, plus the kernels' own limits here; kernels in kernels/quant.cu, gemm.cu,
// gemm_simt.cu. The MoE op is in cuda_ops_moe.cpp.
//
// Numerics (the CPU backend is the oracle):
// - act_quant_fp8 / act_quant_fp8_inplace / fp4_quant_inplace: bit exact.
// - linear_fp8 / linear_fp4: act quant (bit exact; the codes in the GEMM's fragment order), then
//   the block-scaled tensor-core GEMM of docs/MODEL.md 5.3 (portable mma.sync or Hopper wgmma kernels,
//   cuda_gemm_kernels.h): per 32-wide K block a fresh fp32 MMA partial
//   P, acc = acc + (P * sa) * sw in K order (computed as one fma where that is the same number,
//   kernels/gemm_tile.cuh), bf16 at the end. The CPU rounds the exact block sum once, the MMA rounds
//   its two k16 halves: rarely an ulp of fp32 in P, so outputs match to 1 bf16 ulp, almost all
//   bitwise. tests/cuda/cuda_gemm_paths_test.cpp holds the GPU kernels to their reference kernels
//   bit for bit.
// - linear_bf16 / linear_wo_a / linear_f32: fp32 accumulation (tensor cores for bf16 x bf16, whose
//   products are exact in fp32; FFMA otherwise). No TF32.
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_linear_checks.h"
#include "gemm.cuh"
#include "quant.cuh"

namespace ds4r {

using namespace cuda_linear;

// ---------------------------------------------------------------------------- quantization

void CudaBackend::act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s) {
    // x BF16 [M, K] -> q F8_E4M3 [M, K], s F8_E8M0 [M, K/32] (docs/MODEL.md 5.1)
    const char* op = "act_quant_fp8";
    const auto [M, K, block] = opcheck::act_quant_fp8(x, q, s);
    check_disjoint(op, "x", x, "q", q);
    check_disjoint(op, "x", x, "s", s);
    check_disjoint(op, "q", q, "s", s);
    DS4R_CUDA_CHECK(kern::launch_act_quant_fp8(x.ptr<uint16_t>(), q.ptr<uint8_t>(), s.ptr<uint8_t>(), M, K,
                                               kern::Fp8ScaleBytes::Reference, kern::Fp8CodeOrder::Canonical,
                                               stream()));
}

void CudaBackend::act_quant_fp8_inplace(const Tensor& x) {
    // x BF16 [M, K] <- bf16(e4m3(x / s) * s) (docs/MODEL.md 5.1, window KV)
    const auto [M, K, block] = opcheck::act_quant_fp8_inplace(x);
    DS4R_CUDA_CHECK(kern::launch_act_quant_fp8_inplace(x.ptr<uint16_t>(), M, K, stream()));
}

void CudaBackend::fp4_quant_inplace(const Tensor& x, Fp4Scale kind) {
    // x BF16 [M, K] <- bf16(e2m1(x / s) * s), blocks of 32 (e8m0) or 16 (e4m3) (docs/MODEL.md 5.2)
    const auto [M, K, block] = opcheck::fp4_quant_inplace(x, kind);
    const bool e4m3_16 = kind == Fp4Scale::E4M3_16;
    DS4R_CUDA_CHECK(kern::launch_fp4_quant_inplace(x.ptr<uint16_t>(), M, K, e4m3_16, stream()));
}

// ---------------------------------------------------------------------------- block-scaled linears

void CudaBackend::linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) {
    // x BF16 [M, K] -> act quant -> . W F8_E4M3 [N, K]^T (e8m0 32x32 scales) -> y BF16 [M, N]
    const char* op = "linear_fp8";
    const auto [M, N, K] = opcheck::linear_fp8(x, w, y);
    check_aligned16(op, "w.w", w.w);
    if (M == 0 || N == 0) return;
    const GemmActs a = quantize_gemm_acts(x, M, K);
    fp8_gemm(a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.w.ptr<uint8_t>(), w.s.ptr<uint8_t>(),
             y.ptr<uint16_t>(), N, M, N, K);
}

void CudaBackend::fp8_gemm(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                           uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K) {
    if (M == 0 || N == 0) return;
    if (fp16_weights_ && gemm_.fp8_f16w && M >= fp16_weight_rows_ && (N * K) % 16 == 0) {
        // fp16 bits (the tensor types have no fp16); no room: the fp8 weights give the same bits
        if (const std::optional<Tensor> w16 = try_alloc(DType::BF16, {N, K})) {
            DS4R_CUDA_CHECK(kern::launch_e4m3_to_f16(w, N * K, w16->ptr<uint16_t>(), stream()));
            DS4R_CUDA_CHECK(gemm_.fp8_f16w(q, sa, w16->ptr<uint16_t>(), sw, y, ldc, M, N, K, stream()));
            return;
        }
    }
    DS4R_CUDA_CHECK(gemm_.fp8(q, sa, w, sw, y, ldc, M, N, K, stream()));
}

void CudaBackend::linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y) {
    // x BF16 [M, K] -> act quant -> . W packed e2m1 [N, K/2]^T (e8m0 per row per 32) -> y BF16 [M, N]
    const char* op = "linear_fp4";
    const auto [M, N, K] = opcheck::linear_fp4(x, w, y);
    check_aligned16(op, "w.w", w.w);
    if (M == 0 || N == 0) return;
    // the activation codes in the GEMM's operand order (NaN blocks marked in the scale bytes)
    const GemmActs a = quantize_gemm_acts(x, M, K);
    DS4R_CUDA_CHECK(gemm_.fp4(a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.w.ptr<uint8_t>(), w.s.ptr<uint8_t>(),
                              y.ptr<uint16_t>(), N, M, N, K, stream()));
}

// ---------------------------------------------------------------------------- dense linears

namespace {

// y [M, N] (pitch ldc, groups as in kern::launch_gemm_bf16) = x . w^T with fp32 accumulation: tensor
// cores when both operands are bf16 and the layout allows 16-byte copies, else the FFMA kernel.
void dense_gemm(CudaBackend& be, const void* x, bool x_f32, int64_t lda, int64_t x_goff, const void* w,
                bool w_f32, int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc, int64_t y_goff,
                int64_t M, int64_t N, int64_t K, int64_t groups) {
    if (M == 0 || N == 0 || groups == 0) return;
    if (!x_f32 && !w_f32 && kern::gemm_bf16_supported(x, lda, x_goff, w, ldw, w_goff, K)) {
        DS4R_CUDA_CHECK(be.gemm().bf16(static_cast<const uint16_t*>(x), lda, x_goff,
                                       static_cast<const uint16_t*>(w), ldw, w_goff, y, y_f32, ldc, y_goff, M,
                                       N, K, groups, be.stream()));
    } else {
        DS4R_CUDA_CHECK(kern::launch_gemm_simt(x, x_f32, lda, x_goff, w, w_f32, ldw, w_goff, y, y_f32, ldc,
                                               y_goff, M, N, K, groups, be.stream()));
    }
}

}  // namespace

void CudaBackend::linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) {
    // x BF16 [M, K] . W BF16 [N, K]^T -> y BF16 [M, N]: fp32 accumulation, one bf16 rounding
    const char* op = "linear_bf16";
    const auto [M, N, K] = opcheck::linear_bf16(x, w, y);
    check_disjoint(op, "x", x, "y", y);
    check_disjoint(op, "w", w, "y", y);
    dense_gemm(*this, x.data, false, K, 0, w.data, false, K, 0, y.data, false, N, 0, M, N, K, 1);
}

void CudaBackend::linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) {
    // f32(x BF16|F32 [M, K]) . f32(W BF16|F32 [N, K])^T -> y F32 [M, N]; no TF32
    const char* op = "linear_f32";
    const auto [M, N, K] = opcheck::linear_f32(x, w, y);
    check_disjoint(op, "x", x, "y", y);
    check_disjoint(op, "w", w, "y", y);
    dense_gemm(*this, x.data, x.dtype == DType::F32, K, 0, w.data, w.dtype == DType::F32, K, 0, y.data, true,
               N, 0, M, N, K, 1);
}

void CudaBackend::linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) {
    // o BF16 [M, G*Kg], W fp8 [G*R, Kg] -> y BF16 [M, G*R], y[:, g*R + r] = o[:, g*Kg ..] . bf16(W)[g*R + r]
    // (docs/MODEL.md 4.6 f; convert.py dequantizes wo_a to bf16 exactly, 3.6)
    const char* op = "linear_wo_a";
    const auto [M, G, R, Kg] = opcheck::linear_wo_a(o, w, groups, y);
    check_disjoint(op, "o", o, "y", y);
    if (M == 0 || R == 0) return;
    Tensor wd = alloc(DType::BF16, {G * R, Kg});
    DS4R_CUDA_CHECK(kern::launch_dequant_fp8_bf16(w.w.ptr<uint8_t>(), w.s.ptr<uint8_t>(), G * R, Kg,
                                                  wd.ptr<uint16_t>(), stream()));
    // group g: x columns g*Kg.. (pitch G*Kg), weight rows g*R.., output columns g*R.. (pitch G*R)
    dense_gemm(*this, o.data, false, G * Kg, Kg, wd.data, false, Kg, R * Kg, y.data, false, G * R, R, M, R,
               Kg, G);
}

CudaBackend::GemmActs CudaBackend::quantize_gemm_acts(const Tensor& x, int64_t M, int64_t K) {
    return quantize_gemm_acts(x, M, K, gemm_.act_order);
}

CudaBackend::GemmActs CudaBackend::quantize_gemm_acts(const Tensor& x, int64_t M, int64_t K,
                                                      kern::Fp8CodeOrder order) {
    GemmActs a{alloc(DType::F8_E4M3, {M, K}), alloc(DType::F8_E8M0, {M, K / 32})};
    if (M > 0)
        DS4R_CUDA_CHECK(kern::launch_act_quant_fp8(x.ptr<uint16_t>(), a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(),
                                                   M, K, kern::Fp8ScaleBytes::GemmNanMarker, order, stream()));
    return a;
}

}  // namespace ds4r
