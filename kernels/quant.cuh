// Launch wrappers of the activation-quantization kernels (docs/MODEL.md 5.1, 5.2), bit exact with the CPU
// backend (src/backend/cpu/cpu_ref.h; scalar steps shared in include/ds4r/numeric.h). Plain declarations:
// included by g++-compiled backend code.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// How act_quant_fp8 writes the scale byte of a block whose amax is NaN or +inf.
enum class Fp8ScaleBytes : int {
    // Bit exact with the CPU's act_quant (docs/MODEL.md 5.1 bit trick): a NaN amax gives byte 0x00, +inf
    // gives 0xFF. Used by the act_quant_fp8 op.
    Reference = 0,
    // GEMM operand: such a block gets 0xFF (NaN), so the block-scaled GEMM turns the row's output
    // into NaN exactly where the reference (whose e4m3 NaN code 0x7f makes the block sum NaN) does.
    // (The GEMMs' widening may map the NaN code to a finite value, kernels/gemm_tile.cuh.)
    GemmNanMarker = 1,
};

// Where act_quant_fp8 puts each code inside its row. The codes themselves never change.
enum class Fp8CodeOrder : int {
    // q[r, k] is the code of x[r, k] (the act_quant op, docs/MODEL.md 5.1).
    Canonical = 0,
    // The block-scaled GEMMs' A operand (kernels/gemm_tile.cuh): inside each 16-element half of a
    // 32-block, byte p holds element k = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)[p],
    // so that the 4 bytes at offset 4t are lane t's mma.sync fragment codes (k = 2t, 2t+1, 2t+8,
    // 2t+9) and one ldmatrix serves both k16 halves. Only with GemmNanMarker.
    GemmFragment = 1,
};

// x BF16 [rows, K] -> q F8_E4M3 [rows, K] (in `order`), s F8_E8M0 [rows, K / 32]; K % 32 == 0.
cudaError_t launch_act_quant_fp8(const uint16_t* x, uint8_t* q, uint8_t* s, int64_t rows, int64_t K,
                                 Fp8ScaleBytes scale_bytes, Fp8CodeOrder order, cudaStream_t stream);
// x BF16 [rows, K] in place: x <- bf16(e4m3(x / s) * s) per block of 32; K % 32 == 0.
cudaError_t launch_act_quant_fp8_inplace(uint16_t* x, int64_t rows, int64_t K, cudaStream_t stream);
// x BF16 [rows, K] in place: fp4 e2m1 round trip per block; block16_e4m3 = false: blocks of 32 with
// power-of-two (e8m0) scales; true: blocks of 16 with e4m3 scales. K % block == 0.
cudaError_t launch_fp4_quant_inplace(uint16_t* x, int64_t rows, int64_t K, bool block16_e4m3,
                                     cudaStream_t stream);

// Exact dequantization of fp8 weights to bf16 (convert.py's wo_a, docs/MODEL.md 3.6): w e4m3 [rows, cols]
// with e8m0 scales s [ceil(rows / 32), ceil(cols / 32)] -> out bf16 [rows, cols] = bf16(fp32(w) * 2^(e-127)).
cudaError_t launch_dequant_fp8_bf16(const uint8_t* w, const uint8_t* s, int64_t rows, int64_t cols,
                                    uint16_t* out, cudaStream_t stream);

// Packed e2m1 codes (two per byte, even element in the low nibble, docs/MODEL.md 3.2) -> e5m2 bytes, one
// per value, exactly (e2m1 0.5 .. 6 and signed zeros are e5m2 values): w [bytes] -> out [2 * bytes].
// The Hopper kernels' prepared routed experts (GroupedFp4Gemm::w_e5m2). 16-byte aligned, bytes % 16 == 0.
cudaError_t launch_fp4_to_e5m2(const uint8_t* w, int64_t bytes, uint8_t* out, cudaStream_t stream);

// Packed e2m1 weights with their e8m0 column scales -> fp16 with each scale taken into its K block's values
// where it folds (gemm_tile.cuh sw_foldable: e2m1 * 2^(byte - 127), a normal fp16; else the e2m1 value),
// exactly as the Hopper converters widen them: w [rows, cols / 2] packed, s [rows, cols / 32] (cols % 32 ==
// 0: 16 packed bytes are one K block, and chunk i's scale is s[i]), bytes = rows * cols / 2 -> out fp16
// [rows, cols]. The Hopper kernels' prepared fp16 experts (GroupedFp4Gemm::w_f16). w and out 16-byte
// aligned, bytes % 16 == 0.
cudaError_t launch_fp4_to_f16_folded(const uint8_t* w, const uint8_t* s, int64_t bytes, uint16_t* out,
                                     cudaStream_t stream);

// e4m3 weight codes -> fp16 bits, exactly as the GEMMs' converters widen them (gemm_tile.cuh
// e4m3x8_to_f16x8: every e4m3 value is an fp16 normal; the NaN code 0x7f becomes 480): w [n] -> out [n].
// The Hopper kernels' fp16 weights (launch_gemm_fp8_sm90_f16w). 16-byte aligned, n % 16 == 0.
cudaError_t launch_e4m3_to_f16(const uint8_t* w, int64_t n, uint16_t* out, cudaStream_t stream);

}  // namespace ds4r::kern
