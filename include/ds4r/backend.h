// The Backend interface: the ops the V4.1 forward (src/model/) and the output head call, and nothing
// else (ops that only tests use are members of the implementations, not of this interface).
// Two implementations: backend/cpu (the executable specification: plain loops, fp32/fp64 where
// the reference is fp32) and backend/cuda (the product). Every op's contract cites docs/MODEL.md; shapes
// in comments use M = rows (tokens) of the chunk, m = rows of one sequence's part of a chunk,
// s = the sequence length, T = its compressed length s / ratio.
//
// Batch invariance (docs/DESIGN.md section 4) is part of every contract: the value of an output row may
// depend only on the inputs of that row (and, for per-sequence ops, on that sequence), never on M,
// on the other rows, or on how the caller split the work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/expert_layout.h"
#include "ds4r/tensor.h"

namespace ds4r {

// fp4 activation quantization variants (docs/MODEL.md 5.2).
enum class Fp4Scale : uint8_t {
    E8M0_32,  // power-of-two scales per 32 (indexer q and k)
    E4M3_16,  // e4m3 scales per 16 (compressed KV latent)
};

struct Fp8Linear {
    Tensor w;  // F8_E4M3 [N, K]
    Tensor s;  // F8_E8M0 [ceil(N/32), ceil(K/32)]
};
struct Fp4Linear {
    Tensor w;  // I8 [N, K/2]: two e2m1 codes per byte, even k in the low nibble
    Tensor s;  // F8_E8M0 [N, K/32]
};
struct ExpertWeights {
    Fp4Linear w1, w2, w3;  // w1, w3: [I, D]; w2: [D, I]
};
struct MoeWeights {
    Tensor gate_w;                       // BF16 [E, D]
    Tensor gate_bias;                    // F32 [E]: selection bias only
    Fp8Linear sw1, sw2, sw3;             // shared expert: [I, D], [D, I], [I, D]
    std::vector<ExpertWeights> experts;  // E routed experts, by id
};
struct MoeParams {
    int topk = 6;               // experts per token
    float route_scale = 1.5f;   // routed_scaling_factor
    float swiglu_limit = 10.f;  // clamp of the SwiGLU (docs/MODEL.md 4.7)
    float gate_temp = 1.f;
};

// Per-row results of the output head (the vocabulary is never materialized for a whole chunk
// outside the backend). Log-probabilities are logit - lse, formed by the caller in double.
struct HeadStatsOut {
    Tensor lse;           // F64 [M]: log(sum_v exp(logit_v)), logits fp32, sum in fp64
    Tensor entropy;       // F64 [M]: -sum p log p in nats
    Tensor target_logit;  // F32 [M]: logit of targets[r] (0 where targets[r] < 0)
    Tensor rank;          // I32 [M]: 1 + #{v : logit_v > logit_target} (0 where no target)
    Tensor topk_ids;      // I32 [M, k]: largest logits, ties broken by lower token id
    Tensor topk_logit;    // F32 [M, k]
};

// An ordered copy channel between host and backend memory (a copy stream on CUDA), for the weight
// prefetcher and the chunk state ring of the pass runner: copies run asynchronously to compute, in
// the order issued; fences order them against the host and compute. The default (CPU) copies
// synchronously.
class CopyQueue {
public:
    virtual ~CopyQueue() = default;
    // Copies `bytes` from host memory (pinned: from Backend::alloc_host) into dst at dst_offset.
    // The source must stay untouched until a fence recorded after this call has completed.
    virtual void copy(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) = 0;
    // Copies `bytes` of src at src_offset into host memory dst (pinned: from Backend::alloc_host);
    // dst holds them once a fence recorded after this call has completed (host_wait).
    virtual void download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) = 0;
    // Copies issued after this call start after the backend's compute work issued before it.
    virtual void wait_compute() = 0;
    // False when every copy has completed by the time its call returns (the default queue).
    virtual bool asynchronous() const { return true; }
    // Marks the point after every copy issued so far; returns its id.
    virtual uint64_t fence() = 0;
    // Blocks the calling host thread until the fence has completed.
    virtual void host_wait(uint64_t fence) = 0;
    // Makes the backend's compute work issued after this call wait for the fence (no host block).
    virtual void compute_wait(uint64_t fence) = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"
    // True when tensor data pointers are host memory the caller may read directly.
    virtual bool host_memory() const = 0;

    // ---------------------------------------------------------------- memory
    virtual Tensor alloc(DType t, const Shape& shape) = 0;  // uninitialized
    // Host -> backend / backend -> host / backend -> backend copies of `bytes` bytes.
    virtual void upload(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) = 0;
    virtual void download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) = 0;
    virtual void copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset,
                      size_t bytes) = 0;
    virtual void fill(const Tensor& t, uint8_t byte) = 0;  // memset
    virtual void synchronize() = 0;
    // Bytes of memory still free for activations (for chunk sizing); CPU: a large number.
    virtual size_t free_memory() const = 0;
    // Host memory for state that moves to / from this backend (pinned for CUDA). 64-byte aligned.
    virtual std::shared_ptr<void> alloc_host(size_t bytes);
    // A new asynchronous copy channel (see CopyQueue). Default: synchronous memcpy (host memory).
    virtual std::unique_ptr<CopyQueue> make_copy_queue();
    // Makes the calling host thread ready to issue this backend's work: call it on a thread before it
    // uses a backend that another thread created (score --devices workers). CUDA: selects the
    // backend's device (the current device is per host thread). Default: nothing.
    virtual void use_on_this_thread() {}

    // Profiling (opt-in with DS4R_PROFILE=1, see ds4r/settings.h; used by `ds4replay bench`): the backend
    // time of named, non-nested regions of the forward, summed per name. No effect on results; no-ops by
    // default.
    virtual void range_push(const char* name);
    virtual void range_pop();
    // Seconds per region name since the last reset (synchronizes the backend).
    virtual std::vector<std::pair<std::string, double>> profile_totals();
    virtual void profile_reset();

    // ---------------------------------------------------------------- quantization (docs/MODEL.md 5.1, 5.2)
    // x BF16 [M, K] in place: x <- bf16(e4m3(x / s) * s), s the per-32 scale of act_quant (amax floor
    // 1e-4, ue8m0 scale rounded up, clamp +-448, RNE saturating). Bit exact (window KV).
    virtual void act_quant_fp8_inplace(const Tensor& x) = 0;
    // x BF16 [M, K] in place: fp4 e2m1 round trip with the given scale kind. Bit exact.
    virtual void fp4_quant_inplace(const Tensor& x, Fp4Scale kind) = 0;

    // ---------------------------------------------------------------- linears (docs/MODEL.md 4.0, 5.3)
    // y BF16 [M, N] = act_quant(x BF16 [M, K]) @ W^T with per-32 K-block partial sums in fp32,
    // scaled and added in K order, rounded to bf16 once.
    virtual void linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) = 0;
    // y BF16 [M, N] = x BF16 [M, K] @ W BF16 [N, K]^T, fp32 accumulation, one bf16 rounding.
    virtual void linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
    // y F32 [M, N] = f32(x) @ f32(W)^T; x BF16 or F32 [M, K], W BF16 or F32 [N, K]. No TF32.
    virtual void linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
    // The grouped low-rank output wo_a (docs/MODEL.md 4.6 f): o BF16 [M, G * Kg] (group g = columns
    // g*Kg..), W = fp8 [G * R, Kg] dequantized exactly to bf16 -> y BF16 [M, G * R] with
    // y[:, g*R + r] = sum_d o[:, g*Kg + d] * W[g*R + r, d] (fp32 accumulation, bf16 out).
    virtual void linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t groups, const Tensor& y) = 0;

    // ---------------------------------------------------------------- norms, RoPE
    // y = bf16(w * (x * rsqrt(mean(x^2) + eps))) per row; x, y BF16 [M, N] (may alias); w BF16 [N].
    virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
    // RoPE table F32 [n_pos, rd/2, 2] (cos, sin) per docs/MODEL.md 4.0 / 8.3; yarn_orig == 0: plain.
    virtual void rope_table(double base, double factor, int64_t yarn_orig, double beta_fast, double beta_slow,
                            int64_t rd, const Tensor& table) = 0;
    // In place on x BF16 [M, heads * width]: rotates the last `rd` of each head's `width` dims,
    // interleaved pairs, at position pos[r] (I32 [M]); inverse = conjugate (de-rotation).
    virtual void rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                              const Tensor& table, bool inverse) = 0;

    // ---------------------------------------------------------------- mHC (docs/MODEL.md 4.5, 5.5)
    // X BF16 [M, hc, D]; fn F32 [mix, hc * D]; scale F32 [3]; base F32 [mix]
    // -> pre F32 [M, hc], post F32 [M, hc], comb F32 [M, hc, hc] (comb[j][k]: row j, column k).
    virtual void hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base,
                          float norm_eps, float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                          const Tensor& comb) = 0;
    // y BF16 [M, D] = bf16(((m0*X0 + m1*X1) + m2*X2) + m3*X3) in fp32; X BF16 [M, hc, D], m F32 [M, hc].
    virtual void hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) = 0;
    // out BF16 [M, hc, D]: out_k = bf16(post_k * x + S_k), S_k = ((c0k*R0 + c1k*R1) + c2k*R2) + c3k*R3.
    // x BF16 [M, D]; R BF16 [M, hc, D] (may alias out); post F32 [M, hc]; comb F32 [M, hc, hc].
    virtual void hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                         const Tensor& out) = 0;

    // ---------------------------------------------------------------- compressor (docs/MODEL.md 4.6.1)
    // Ratio-2 gated pooling of one sequence: kv, sc F32 [2n (+1), hd] -> out BF16 [n, hd],
    // out_j = bf16(sum_i kv[2j+i] * softmax_i(sc[2j], sc[2j+1])) per channel. No norm here.
    virtual void compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) = 0;

    // ---------------------------------------------------------------- indexer (docs/MODEL.md 4.6.2)
    // One sequence's query rows: q BF16 [m, nh, ihd] (fp4-QDQ'd, roped); k BF16 [T, ihd];
    // w BF16 [m, nh] (already * 1/64); qpos I32 [m] -> score BF16 [m, T]:
    // S = bf16(q_h . k_j); score = bf16(sum_h fp32(bf16(relu(S) * w_h))) summed sequentially in
    // fp32; score[t, j] = -inf for j >= (qpos[t] + 1) / ratio.
    virtual void index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos,
                              int ratio, const Tensor& score) = 0;
    // Candidate blocks (candidate source layer): score BF16 [m, T], qpos I32 [m]
    // -> mask I32 [m, ceil(ceil(T / block) / 32)] of 32-bit words (the dtype set has no U32): bit
    // b % 32 of word b / 32 set when block b is kept.
    virtual void candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                                  int64_t topk_blocks, const Tensor& mask) = 0;
    // score[t, j] = -inf where the block bit of j is not set in mask[t] (reindex layers).
    virtual void apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) = 0;
    // Top-K_c of score BF16 [m, T] (CUDA torch.topk tie rule: values > the K-th, then ties by
    // ascending index), sorted by position, mapped to j + offset if j < n_t else -1
    // -> idx I32 [m, K]. n_t = (qpos + 1) / ratio.
    virtual void index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                            const Tensor& idx) = 0;

    // ---------------------------------------------------------------- attention (docs/MODEL.md 4.6, 5.4)
    // The full attention index rows of one sequence: idx I32 [m, W + Kc] = [window columns ; topk].
    // Window column c of row r: max(p - window + 1, 0) + c, or -1 where that exceeds p = qpos[r]
    // (W = min(s, window)); topk I32 [m, Kc], already offset by +s (may have Kc = 0).
    virtual void attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) = 0;
    // x BF16 in place: x <- bf16(fp32(x) * factor) (indexer weights * 1/64, docs/MODEL.md 4.6.2 step 3).
    virtual void mul_scalar_bf16(const Tensor& x, float factor) = 0;
    // One sequence: q BF16 [m, H, hd]; win_kv BF16 [s, hd]; cmp_kv BF16 [T, hd] (T may be 0);
    // sink F32 [H]; idx I32 [m, n_idx]: j < s -> win_kv[j], j >= s -> cmp_kv[j - s], -1 empty
    // -> o BF16 [m, H, hd]. 64-slot tiles, running max seeded -1e30, bf16 probabilities before PV.
    virtual void sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                             const Tensor& idx, float scale, const Tensor& o) = 0;

    // ---------------------------------------------------------------- MoE (docs/MODEL.md 4.7)
    // x BF16 [M, D] (ffn-normed) -> y BF16 [M, D]: router, routed experts (weight applied before
    // w2, contributions summed in fp32 in expert-id order) + shared expert.
    // Optional outputs (may be empty tensors): route_idx I32 [M, k] and route_w F32 [M, k] in the
    // gate's top-k order (descending biased score).
    virtual void moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
                     const Tensor& route_idx, const Tensor& route_w) = 0;
    // Prepared experts (optional, off unless set_prepared_experts(layout); never changes a result): a copy
    // of a layer's routed expert weights in a layout the backend's kernels read faster, made once per
    // layer (prepare_experts, before its chunks) and dropped after (release_experts); the moe calls in
    // between read it. CudaBackend with the Hopper widened kernels: the fp4 weights as e5m2 bytes (one
    // per value, 2 bytes per packed byte: no per-tile fp4 decoding), or as fp16 with their scales folded
    // in (4 bytes per packed byte: the GEMM's B tiles straight from memory, docs/PERFORMANCE.md). The pass
    // planner (plan_prepared_experts, ds4r/replay.h) picks the widest layout the memory allows.
    // prepared_experts_bytes: what one layer's copy takes in `layout` for `experts` experts with w1, w3
    // [hidden, dim] and w2 [dim, hidden]; 0 where the backend lacks that layout (the default: every one).
    virtual uint64_t prepared_experts_bytes(int64_t experts, int64_t dim, int64_t hidden,
                                            ExpertLayout layout) const;
    virtual void set_prepared_experts(ExpertLayout layout);
    virtual ExpertLayout prepared_experts() const { return ExpertLayout::None; }
    virtual void prepare_experts(const MoeWeights& w);
    virtual void release_experts() {}
    // fp16 weights (on by default where the backend has them; never changes a result): CudaBackend with
    // the Hopper widened kernels widens the fp8 weights of its larger block-scaled GEMMs to fp16 first
    // (a transient copy), so that the GEMM needs no converter warps (docs/PERFORMANCE.md). Off: the
    // GEMMs read the fp8 codes. The default backend has nothing to turn on or off.
    virtual void set_fp16_weights(bool on) { (void)on; }

    // ---------------------------------------------------------------- Engram (docs/MODEL.md 4.8)
    // X BF16 [M, hc, D] updated in place: kv BF16 [M, (hc + 1) * D] = wkv(e) (keys of copy k at
    // columns k*D.., value = the last D); qw, kw BF16 [hc, D].
    virtual void engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                               float eps) = 0;

    // ---------------------------------------------------------------- head (docs/MODEL.md 4.9)
    // x BF16 [M, D] (after the final norm); head BF16 [V, D] used as fp32; targets I32 [M]
    // (-1 = none) -> per-row statistics over the full vocabulary (see HeadStatsOut).
    virtual void head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                            const HeadStatsOut& out) = 0;
};

// RAII profiling region: ProfileRange r(be, "attn.sparse");
class ProfileRange {
public:
    ProfileRange(Backend& be, const char* name) : be_(be) { be_.range_push(name); }
    ~ProfileRange() { be_.range_pop(); }
    ProfileRange(const ProfileRange&) = delete;
    ProfileRange& operator=(const ProfileRange&) = delete;

private:
    Backend& be_;
};

// Sequential profiling regions of one sweep: ph("name") closes the previous region and opens the next;
// the last one closes with ph (or at ph.close()).
class ProfilePhase {
public:
    explicit ProfilePhase(Backend& be) : be_(be) {}
    ~ProfilePhase() { close(); }
    ProfilePhase(const ProfilePhase&) = delete;
    ProfilePhase& operator=(const ProfilePhase&) = delete;
    void operator()(const char* name) {
        close();
        be_.range_push(name);
        open_ = true;
    }
    void close() {
        if (open_) be_.range_pop();
        open_ = false;
    }

private:
    Backend& be_;
    bool open_ = false;
};

std::unique_ptr<Backend> make_cpu_backend();

// The CUDA backend's GEMM kernels (`--kernels`): Auto = the Hopper wgmma kernels on compute
// capability 9.0 GPUs (H100, H200), the portable mma.sync kernels elsewhere; Portable = the portable
// kernels everywhere; Hopper = the wgmma kernels or an error; HopperFp8Partials = the wgmma kernels
// with the block-scaled partials on fp8 wgmma (faster, not bit-identical: docs/PERFORMANCE.md). The CPU
// backend ignores it.
enum class GpuKernels : uint8_t { Auto = 0, Portable = 1, Hopper = 2, HopperFp8Partials = 3 };
// "auto" | "portable" | "hopper" | "hopper-fp8"; InputError naming the flag otherwise.
GpuKernels parse_gpu_kernels(const std::string& s);

// CUDA backend, or nullptr with *why set when CUDA is not compiled in / no usable GPU is present.
// gpu_memory_gb: the device memory budget in GB (--gpu-memory-gb); <= 0: the default, 22 GB
// whatever the GPU (the product targets a 24 GB card, docs/DESIGN.md 5).
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why, double gpu_memory_gb = 0,
                                           GpuKernels kernels = GpuKernels::Auto);

// The CUDA devices this process sees (0 when CUDA is not compiled in or no GPU is usable): what
// score --devices all means.
int cuda_device_count();

// --backend: "cpu"; "cuda" (throws RuntimeError without a usable GPU, the message says why); "auto":
// CUDA when a usable GPU is present, else the CPU backend (logged). gpu_memory_gb: as above.
// kernels: as make_cuda_backend (a Hopper choice on another GPU throws RuntimeError).
std::unique_ptr<Backend> select_backend(const std::string& kind, int device, double gpu_memory_gb = 0,
                                        GpuKernels kernels = GpuKernels::Auto);

}  // namespace ds4r
