// The CUDA backend: launch wrappers around kernels/*.cu, one compute stream, a stream-ordered memory
// pool, pinned host memory and a copy stream for the weight prefetcher. Op implementations are split
// by family: cuda_ops_linear.cpp (quantization, GEMMs, MoE), cuda_ops_attention.cpp (indexer, top-k,
// sparse attention, head statistics), cuda_ops_misc.cpp (norms, RoPE, mHC, compressor pooling, Engram).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_gemm_kernels.h"
#include "ds4r/backend.h"
#include "ds4r/error.h"

namespace ds4r {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line);

}  // namespace ds4r

// Every CUDA runtime call is checked; failures throw RuntimeError naming the call and location.
#define DS4R_CUDA_CHECK(expr)                                                                         \
    do {                                                                                              \
        cudaError_t ds4r_err_ = (expr);                                                               \
        if (ds4r_err_ != cudaSuccess) ::ds4r::throw_cuda_error(ds4r_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define DS4R_CUBLAS_CHECK(expr)                                              \
    do {                                                                     \
        cublasStatus_t ds4r_st_ = (expr);                                    \
        if (ds4r_st_ != CUBLAS_STATUS_SUCCESS)                               \
            ::ds4r::throw_cublas_error(ds4r_st_, #expr, __FILE__, __LINE__); \
    } while (0)
// After every kernel launch.
#define DS4R_CUDA_LAUNCH_CHECK() DS4R_CUDA_CHECK(cudaGetLastError())

namespace ds4r {

class CudaBackend : public Backend {
public:
    // Throws RuntimeError if the device cannot be used.
    CudaBackend(int device, size_t memory_budget_bytes, GpuKernels kernels = GpuKernels::Auto);
    ~CudaBackend() override;

    std::string name() const override;
    bool host_memory() const override { return false; }

    Tensor alloc(DType t, const Shape& shape) override;
    // alloc, or nothing where the budget or the pool has no room for it (transient copies that have a
    // fallback: fp8_gemm's fp16 weights)
    std::optional<Tensor> try_alloc(DType t, const Shape& shape);
    void upload(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) override;
    void download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) override;
    void copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset,
              size_t bytes) override;
    void fill(const Tensor& t, uint8_t byte) override;
    void synchronize() override;
    size_t free_memory() const override;
    std::shared_ptr<void> alloc_host(size_t bytes) override;
    std::unique_ptr<CopyQueue> make_copy_queue() override;
    void use_on_this_thread() override;  // cudaSetDevice (src/backend/cuda/cuda_thread.cpp)
    // Profiling with CUDA events on the compute stream (DS4R_PROFILE=1, ds4r/settings.h).
    void range_push(const char* name) override;
    void range_pop() override;
    std::vector<std::pair<std::string, double>> profile_totals() override;
    void profile_reset() override;

    // ---- ops (cuda_ops_linear.cpp) ----
    // Not Backend ops (see CpuBackend): for the tests.
    void act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s);
    void linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y);
    void window_indices(const Tensor& qpos, int64_t window, const Tensor& idx);
    void act_quant_fp8_inplace(const Tensor& x) override;
    void fp4_quant_inplace(const Tensor& x, Fp4Scale kind) override;
    void linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) override;
    void linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) override;
    void linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) override;
    void linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) override;
    void moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
             const Tensor& route_idx, const Tensor& route_w) override;
    // Prepared experts (cuda_ops_moe.cpp): with the Hopper widened kernels, the layer's fp4 expert
    // weights as e5m2 bytes (kern::launch_fp4_to_e5m2; GroupedFp4Gemm::w_e5m2) or as fp16 with the scales
    // folded in (kern::launch_fp4_to_f16_folded; GroupedFp4Gemm::w_f16, B by TMA), read by the grouped
    // GEMMs; 0 bytes (nothing prepared) on the other kernel families. The copy runs on a stream of its
    // own beside the layer's first attention work (prep_stream_ below).
    uint64_t prepared_experts_bytes(int64_t experts, int64_t dim, int64_t hidden,
                                    ExpertLayout layout) const override;
    void set_prepared_experts(ExpertLayout layout) override;
    ExpertLayout prepared_experts() const override { return prepare_; }
    void prepare_experts(const MoeWeights& w) override;
    void release_experts() override;
    // fp16 weights (cuda_ops_linear.cpp): with the Hopper widened kernels, the block-scaled fp8 GEMMs of
    // at least fp16_weight_rows() rows widen their weights to fp16 first (a transient buffer of 2 bytes
    // per weight, skipped where the budget lacks room) and run on kern::launch_gemm_fp8_sm90_f16w: the
    // same bits, no converter warps in the GEMM.
    void set_fp16_weights(bool on) override { fp16_weights_ = on; }
    // Tests: the least rows of a GEMM that widens its weights (0: every GEMM).
    void set_fp16_weight_rows(int64_t rows) { fp16_weight_rows_ = rows; }
    int64_t fp16_weight_rows() const { return fp16_weight_rows_; }
    // y BF16 [M, N] (pitch ldc) = the block-scaled fp8 GEMM of activation codes q [M, K] (gemm().act_order)
    // with scales sa [M, K / 32] and weights w [N, K] with scales sw [ceil(N / 32), K / 32] (device
    // pointers): gemm().fp8, or on fp16 weights as above.
    void fp8_gemm(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                  int64_t ldc, int64_t M, int64_t N, int64_t K);
    // The copy of w's routed experts made by prepare_experts; null when none was made from w.
    struct PreparedExperts {
        const uint8_t* source = nullptr;         // experts[0].w1.w of the layer it was made from
        size_t experts = 0;                      // E
        ExpertLayout layout = ExpertLayout::None;
        // I8: expert 0's w1, w3 [I, D] and w2 [D, I] as e5m2 bytes (fp16: 2 bytes per value), then
        // expert 1's, ...: each projection's experts at one stride
        Tensor buffer;
        std::vector<const uint8_t*> w1, w3, w2;  // [E] per-expert pointers into buffer
    };
    const PreparedExperts* prepared_for(const MoeWeights& w) const;
    // The compute stream waits for the copy prepare_experts runs on its own stream (once per copy; the
    // time it waits is the profile's moe/prepare_experts).
    void wait_prepared_experts();
    // ---- ops (cuda_ops_misc.cpp) ----
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
    void rope_table(double base, double factor, int64_t yarn_orig, double beta_fast, double beta_slow,
                    int64_t rd, const Tensor& table) override;
    void rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                      const Tensor& table, bool inverse) override;
    void hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base, float norm_eps,
                  float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                  const Tensor& comb) override;
    void hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) override;
    void hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                 const Tensor& out) override;
    void compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) override;
    void engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                       float eps) override;
    void mul_scalar_bf16(const Tensor& x, float factor) override;
    // The block-scaled GEMMs' A operand: x BF16 [M, K] (K % 32 == 0) -> q F8_E4M3 [M, K] activation
    // codes in the kernel family's code order (gemm().act_order; `order` overrides it, e.g. tests of
    // another family's kernels), s F8_E8M0 [M, K / 32] scales (NaN / inf blocks marked 0xFF).
    struct GemmActs {
        Tensor q, s;
    };
    GemmActs quantize_gemm_acts(const Tensor& x, int64_t M, int64_t K);
    GemmActs quantize_gemm_acts(const Tensor& x, int64_t M, int64_t K, kern::Fp8CodeOrder order);
    // rope_table's inverse frequencies F32 [rd / 2] on the GPU, after validating the call against
    // table F32 [n_pos, rd/2, 2] (also used by the CUDA test kit's libdevice table).
    Tensor rope_inv_freqs(double base, double factor, int64_t yarn_orig, double beta_fast, double beta_slow,
                          int64_t rd, const Tensor& table);
    // ---- ops (cuda_ops_attention.cpp) ----
    void index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos, int ratio,
                      const Tensor& score) override;
    void candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                          int64_t topk_blocks, const Tensor& mask) override;
    void apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) override;
    void index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                    const Tensor& idx) override;
    void attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) override;
    void sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                     const Tensor& idx, float scale, const Tensor& o) override;
    void head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                    const HeadStatsOut& out) override;
    // The head's logits GEMM: x bf16 [R, D] . head bf16 [V, D]^T -> logits f32 [R, V] (device pointers).
    void head_logits(const uint16_t* x, const uint16_t* head, float* logits, int64_t R, int64_t V, int64_t D);

    // ---- for the ops and benchmarks ----
    cudaStream_t stream() const { return stream_; }
    int device() const { return device_; }
    const cudaDeviceProp& props() const { return props_; }
    cublasHandle_t cublas();  // created on first use (benchmarks only)
    size_t bytes_in_use() const { return in_use_.load(); }
    size_t high_water() const { return high_water_.load(); }
    void reset_high_water() { high_water_.store(in_use_.load()); }
    size_t memory_budget() const { return budget_; }
    const GemmKernels& gemm() const { return gemm_; }  // the GEMM kernel family (--kernels)

private:
    std::optional<Tensor> allocate(DType t, const Shape& shape, std::string* why);

    int device_;
    cudaDeviceProp props_{};
    cudaStream_t stream_ = nullptr;
    cudaMemPool_t pool_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    size_t budget_;
    GemmKernels gemm_;
    // The kernels that read prepared (e5m2) experts: the Hopper ones with widened partials.
    bool reads_prepared_experts() const { return gemm_.hopper && !gemm_.fp8_partials; }
    ExpertLayout prepare_ = ExpertLayout::None;
    bool fp16_weights_ = true;
    // The GEMMs of fewer rows keep the fp8 weights: the widening (3 bytes of traffic per weight) costs
    // more than it saves there.
    int64_t fp16_weight_rows_ = 1024;
    PreparedExperts prepared_;
    // prepare_experts copies on prep_stream_, after prep_start_ (recorded on stream_: the layer's weights
    // are in place, the buffer allocated), so that the copy overlaps the first chunk's attention; stream_
    // waits for prep_done_ before the first grouped GEMM that reads the copy, and before it frees it.
    cudaStream_t prep_stream_ = nullptr;
    cudaEvent_t prep_start_ = nullptr, prep_done_ = nullptr;
    bool prep_pending_ = false;
    std::atomic<size_t> in_use_{0}, high_water_{0};
    struct Range {
        const char* name;
        cudaEvent_t start, stop;
    };
    std::vector<Range> open_ranges_, closed_ranges_;
    std::vector<std::pair<std::string, double>> profile_;  // name -> seconds (folded from closed_ranges_)
};

// "cuda:0 (NVIDIA H200, sm_90, 139.8 GiB)"; nullptr + *why when no usable device (see ds4r/backend.h).
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why, double gpu_memory_gb,
                                           GpuKernels kernels);

}  // namespace ds4r
