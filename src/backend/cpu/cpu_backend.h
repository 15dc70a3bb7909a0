// The CPU backend: every op of include/ds4r/backend.h as plain loops, the executable specification
// that CI runs and that the CUDA backend is tested against op by op. fp32 where DeepSeek's reference
// is fp32, fp64 accumulation rounded once where the reference's reduction order is a GPU library's
// (GEMMs, dot products, long sums). Numerics follow docs/MODEL.md sections 4, 5 and 8; each op cites them.
//
// Threading: ops split independent OUTPUT rows/elements over up to `threads` std::threads; no
// reduction is ever split, so results are bit-identical for any thread count and any batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ds4r/backend.h"

namespace ds4r {

class CpuBackend : public Backend {
public:
    // threads <= 0: std::thread::hardware_concurrency().
    explicit CpuBackend(int threads = 0);
    int threads() const { return threads_; }

    std::string name() const override { return "cpu"; }
    bool host_memory() const override { return true; }

    // memory (cpu_backend.cpp): 64-byte aligned host allocations; copies are memcpy.
    Tensor alloc(DType t, const Shape& shape) override;
    void upload(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) override;
    void download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) override;
    void copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset,
              size_t bytes) override;
    void fill(const Tensor& t, uint8_t byte) override;
    void synchronize() override {}
    size_t free_memory() const override;

    // quantization (cpu_quant.cpp); act_quant_fp8 (x BF16 [M, K] -> q F8_E4M3 [M, K], s F8_E8M0
    // [M, K/32], docs/MODEL.md 5.1) is not a Backend op: the linears quantize inside; tests call it.
    void act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s);
    void act_quant_fp8_inplace(const Tensor& x) override;
    void fp4_quant_inplace(const Tensor& x, Fp4Scale kind) override;

    // linears (cpu_linear.cpp)
    void linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) override;
    // fp4 weights (the routed experts' path as a standalone op, for tests): as linear_fp8.
    void linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y);
    void linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) override;
    void linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) override;
    void linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) override;

    // norms, RoPE (cpu_norm_rope.cpp)
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
    void rope_table(double base, double factor, int64_t yarn_orig, double beta_fast, double beta_slow,
                    int64_t rd, const Tensor& table) override;
    void rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                      const Tensor& table, bool inverse) override;

    // mHC (cpu_hc.cpp)
    void hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base, float norm_eps,
                  float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                  const Tensor& comb) override;
    void hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) override;
    void hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                 const Tensor& out) override;

    // compressor pooling, attention indices, sparse attention (cpu_attention.cpp)
    void compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) override;
    void attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) override;
    // The window columns alone: idx I32 [m, W] (attn_indices without top-k; for tests).
    void window_indices(const Tensor& qpos, int64_t window, const Tensor& idx);
    void sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                     const Tensor& idx, float scale, const Tensor& o) override;

    // indexer (cpu_indexer.cpp)
    void mul_scalar_bf16(const Tensor& x, float factor) override;
    void index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos, int ratio,
                      const Tensor& score) override;
    void candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                          int64_t topk_blocks, const Tensor& mask) override;
    void apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) override;
    void index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                    const Tensor& idx) override;

    // MoE (cpu_moe.cpp), Engram (cpu_engram.cpp), head (cpu_head.cpp)
    void moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
             const Tensor& route_idx, const Tensor& route_w) override;
    void engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                       float eps) override;
    void head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                    const HeadStatsOut& out) override;

    // ---- row kernels shared by the ops above (cpu_linear.cpp); raw host pointers, M rows.
    // y bf16 [M, N] = fp8 linear of x bf16 [M, K] (docs/MODEL.md 5.3).
    void fp8_linear_rows(const uint16_t* x, int64_t M, const Fp8Linear& w, uint16_t* y) const;
    // y bf16 [M, N] = fp4 linear of x bf16 [M, K] (docs/MODEL.md 5.3).
    void fp4_linear_rows(const uint16_t* x, int64_t M, const Fp4Linear& w, uint16_t* y) const;

    // Runs fn(begin, end) over contiguous chunks of [0, n) on up to threads() threads; `cost` is
    // the rough work per item (multiply-adds) used to decide whether threading pays. Exceptions
    // thrown by fn are rethrown here. Only for work whose items write disjoint outputs.
    void parallel_for(int64_t n, double cost, const std::function<void(int64_t, int64_t)>& fn) const;

private:
    int threads_;
};

// A CPU backend with an explicit thread count (tests check thread-count invariance with it).
std::unique_ptr<CpuBackend> make_cpu_backend_threads(int threads);

}  // namespace ds4r
