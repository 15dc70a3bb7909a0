// Test hooks for the tensor-core GEMMs (see cuda_gemm_check.h).
#include "cuda_gemm_check.h"

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_linear_checks.h"
#include "gemm.cuh"
#include "gemm_oracle.cuh"
#include "quant.cuh"

namespace ds4r {

using namespace cuda_linear;

namespace {

// x BF16 [M, K] -> canonical e4m3 codes q [M, K] with NaN-marker scales s [M, K / 32] (the GEMM's
// scale bytes, Fp8CodeOrder::Canonical: the layout the reference kernels read).
struct QuantX {
    Tensor q, s;
    int64_t M = 0;
};
QuantX quant_canonical(CudaBackend& be, const char* op, const Tensor& x, int64_t K) {
    check_dtype(op, "x", x, DType::BF16);
    DS4R_CHECK(K % 32 == 0, "cuda %s: K = %lld is not a multiple of 32", op, (long long)K);
    QuantX r;
    r.M = rows_of(op, "x", x, K);
    r.q = be.alloc(DType::F8_E4M3, {r.M, K});
    r.s = be.alloc(DType::F8_E8M0, {r.M, K / 32});
    if (r.M > 0)
        DS4R_CUDA_CHECK(kern::launch_act_quant_fp8(x.ptr<uint16_t>(), r.q.ptr<uint8_t>(), r.s.ptr<uint8_t>(),
                                                   r.M, K, kern::Fp8ScaleBytes::GemmNanMarker,
                                                   kern::Fp8CodeOrder::Canonical, be.stream()));
    return r;
}

Tensor upload_i32(CudaBackend& be, const std::vector<int32_t>& v) {
    Tensor t = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
    if (!v.empty()) be.upload(t, 0, v.data(), v.size() * sizeof(int32_t));
    return t;
}

}  // namespace

void linear_fp8_oracle(CudaBackend& be, const Tensor& x, const Fp8Linear& w, const Tensor& y) {
    const char* op = "linear_fp8_oracle";
    check_fp8_weight(op, "w", w);
    check_dtype(op, "y", y, DType::BF16);
    const int64_t N = w.w.dim(0), K = w.w.dim(1);
    const QuantX qx = quant_canonical(be, op, x, K);
    check_numel(op, "y", y, qx.M * N);
    if (qx.M == 0 || N == 0) return;
    DS4R_CUDA_CHECK(kern::launch_gemm_fp8_oracle(qx.q.ptr<uint8_t>(), qx.s.ptr<uint8_t>(), w.w.ptr<uint8_t>(),
                                                 w.s.ptr<uint8_t>(), y.ptr<uint16_t>(), N, qx.M, N, K,
                                                 be.stream()));
}

void linear_fp4_oracle(CudaBackend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y) {
    const char* op = "linear_fp4_oracle";
    const int64_t K = check_fp4_weight(op, "w", w);
    check_dtype(op, "y", y, DType::BF16);
    const int64_t N = w.w.dim(0);
    const QuantX qx = quant_canonical(be, op, x, K);
    check_numel(op, "y", y, qx.M * N);
    if (qx.M == 0 || N == 0) return;
    DS4R_CUDA_CHECK(kern::launch_gemm_fp4_oracle(qx.q.ptr<uint8_t>(), qx.s.ptr<uint8_t>(), w.w.ptr<uint8_t>(),
                                                 w.s.ptr<uint8_t>(), y.ptr<uint16_t>(), N, qx.M, N, K,
                                                 be.stream()));
}

void linear_bf16_oracle(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& y) {
    const char* op = "linear_bf16_oracle";
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "w", w, DType::BF16);
    DS4R_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda %s: y must be BF16 or F32, got %s", op,
               dtype_name(y.dtype));
    DS4R_CHECK(w.ndim() == 2, "cuda %s: w must be 2-d, got %s", op, shape_str(w.shape).c_str());
    check_data(op, "w", w);
    const int64_t N = w.dim(0), K = w.dim(1);
    DS4R_CHECK(K % 8 == 0, "cuda %s: K = %lld: the tensor-core path needs K %% 8 == 0", op, (long long)K);
    const int64_t M = rows_of(op, "x", x, K);
    check_numel(op, "y", y, M * N);
    if (M == 0 || N == 0) return;
    DS4R_CUDA_CHECK(kern::launch_gemm_bf16_oracle(x.ptr<uint16_t>(), K, 0, w.ptr<uint16_t>(), K, 0, y.data,
                                                  y.dtype == DType::F32, N, 0, M, N, K, 1, be.stream()));
}

void linear_wo_a_oracle(CudaBackend& be, const Tensor& o, const Fp8Linear& w, int64_t groups,
                        const Tensor& y) {
    const char* op = "linear_wo_a_oracle";
    check_fp8_weight(op, "w", w);
    check_dtype(op, "o", o, DType::BF16);
    check_dtype(op, "y", y, DType::BF16);
    DS4R_CHECK(groups > 0 && w.w.dim(0) % groups == 0,
               "cuda %s: %lld groups do not divide the %lld weight rows", op, (long long)groups,
               (long long)w.w.dim(0));
    const int64_t G = groups, R = w.w.dim(0) / groups, Kg = w.w.dim(1);
    DS4R_CHECK(Kg % 8 == 0, "cuda %s: Kg = %lld: the tensor-core path needs Kg %% 8 == 0", op, (long long)Kg);
    const int64_t M = rows_of(op, "o", o, G * Kg);
    check_numel(op, "y", y, M * G * R);
    if (M == 0 || R == 0) return;
    Tensor wd = be.alloc(DType::BF16, {G * R, Kg});
    DS4R_CUDA_CHECK(kern::launch_dequant_fp8_bf16(w.w.ptr<uint8_t>(), w.s.ptr<uint8_t>(), G * R, Kg,
                                                  wd.ptr<uint16_t>(), be.stream()));
    DS4R_CUDA_CHECK(kern::launch_gemm_bf16_oracle(o.ptr<uint16_t>(), G * Kg, Kg, wd.ptr<uint16_t>(), Kg,
                                                  R * Kg, y.data, false, G * R, R, M, R, Kg, G, be.stream()));
}

void linear_fp4_grouped(CudaBackend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y,
                        bool reverse_rows) {
    const char* op = "linear_fp4_grouped";
    const int64_t K = check_fp4_weight(op, "w", w);
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "y", y, DType::BF16);
    check_aligned16(op, "w.w", w.w);
    const int64_t N = w.w.dim(0);
    const int64_t M = rows_of(op, "x", x, K);
    check_numel(op, "y", y, M * N);
    DS4R_CHECK(M < (int64_t{1} << 30), "cuda %s: %lld rows", op, (long long)M);
    if (M == 0 || N == 0) return;
    const CudaBackend::GemmActs acts = be.quantize_gemm_acts(x, M, K);
    const Tensor& q = acts.q;
    const Tensor& s = acts.s;
    // one expert owning pair positions [0, M): 128-row tiles, as the MoE routing plan lists them
    const int64_t tiles = (M + 127) / 128;
    std::vector<int32_t> tile_expert(static_cast<size_t>(tiles), 0), tile_start(static_cast<size_t>(tiles));
    for (int64_t t = 0; t < tiles; ++t) tile_start[static_cast<size_t>(t)] = static_cast<int32_t>(t * 128);
    const Tensor d_tile_expert = upload_i32(be, tile_expert), d_tile_start = upload_i32(be, tile_start);
    const Tensor d_tile_begin = upload_i32(be, {0, static_cast<int32_t>(tiles)});
    const Tensor d_expert_end = upload_i32(be, {static_cast<int32_t>(M)});
    Tensor d_rows;
    if (reverse_rows) {
        std::vector<int32_t> rows(static_cast<size_t>(M));
        for (int64_t r = 0; r < M; ++r) rows[static_cast<size_t>(r)] = static_cast<int32_t>(M - 1 - r);
        d_rows = upload_i32(be, rows);
    }
    const uint8_t* wp = w.w.ptr<uint8_t>();
    const uint8_t* sp = w.s.ptr<uint8_t>();
    kern::GroupedFp4Gemm g{};
    g.q = q.ptr<uint8_t>();
    g.sa = s.ptr<uint8_t>();
    g.a_rows = reverse_rows ? d_rows.ptr<int32_t>() : nullptr;
    g.tile_expert = d_tile_expert.ptr<int32_t>();
    g.tile_start = d_tile_start.ptr<int32_t>();
    g.tile_begin = d_tile_begin.ptr<int32_t>();
    g.expert_end = d_expert_end.ptr<int32_t>();
    g.max_tiles = tiles;
    g.max_rows_per_expert = M;
    g.n_experts = 1;
    g.n_proj = 1;
    g.N = N;
    g.K = K;
    g.w[0] = &wp;
    g.s[0] = &sp;
    g.y[0] = y.ptr<uint16_t>();
    // the backend's kernel family (the codes above are in its order); tables freed stream-ordered
    DS4R_CUDA_CHECK(be.gemm().grouped_fp4(g, be.stream()));
}

}  // namespace ds4r
