// Launch wrappers of the attention kernels (docs/MODEL.md 4.6 b-d, 5.4, 6.4): window / full index rows
// and the sparse attention of one sequence. Raw device pointers; every output row depends only on
// its own query row and index row (batch invariant, deterministic).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// idx I32 [m, n] with n = W + Kc: idx[r, c] = max(p - window + 1, 0) + c, or -1 if that exceeds
// p = qpos[r] (I32 [m]), for c < W; idx[r, W + c] = topk[r, c] (I32 [m, Kc], Kc may be 0, topk may
// then be null). window_indices is the Kc = 0 case.
cudaError_t launch_attn_indices(const int32_t* qpos, int64_t m, int64_t window, int64_t W,
                                const int32_t* topk, int64_t kc, int32_t* idx, cudaStream_t stream);

// Head dims sparse_attn is instantiated for.
bool sparse_attn_supported_dim(int64_t hd);
// The sparse attention's CTA shape (attention.cu): 16 heads per CTA in <= 99 KB of shared memory (every
// GPU; the portable kernel set), or 64 heads per CTA with the next K tile's gather in flight (up to 223 KB:
// compute capability 8.0 / 9.0; the Hopper kernel set). The same operations per output: the same bits.
enum class SparseAttnCta { Heads16, Heads64 };
int64_t sparse_attn_heads_per_cta(SparseAttnCta cta);
// Dynamic shared memory one sparse_attn CTA uses for head dim hd (Heads16: <= 99 KB for hd <= 512).
size_t sparse_attn_smem_bytes(int64_t hd, SparseAttnCta cta = SparseAttnCta::Heads16);

// o BF16 [m, H, hd] from q BF16 [m, H, hd], win_kv BF16 [s, hd], cmp_kv BF16 [T, hd] (T may be 0,
// pointer then unused), sink F32 [H], idx I32 [m, n_idx] (j < s: win_kv[j]; s <= j < s + T:
// cmp_kv[j - s]; anything else, -1 included, is an empty slot) with the reference kernel's
// algorithm (docs/MODEL.md 5.4): 64-slot tiles, S = (q . K) * scale with fp32 accumulation, running max
// seeded -1e30, p = exp(S - M_new), bf16(p) into the PV product, unscaled sink logit added to the
// denominator last, o = bf16(acc / sum). q, win_kv, cmp_kv, o 16-byte aligned. Returns the error of
// the shared-memory attribute call or of the launch.
cudaError_t launch_sparse_attn(const uint16_t* q, const uint16_t* win_kv, const uint16_t* cmp_kv,
                               const float* sink, const int32_t* idx, uint16_t* o, int64_t m, int64_t H,
                               int64_t hd, int64_t s, int64_t T, int64_t n_idx, float scale,
                               cudaStream_t stream, SparseAttnCta cta = SparseAttnCta::Heads16);

}  // namespace ds4r::kern
