// CudaBackend::moe (docs/MODEL.md 4.7): router, routed fp4 experts as grouped GEMMs over a device-built
// tile schedule (one launch per projection group, no per-expert launches, no host sync), the shared
// fp8 expert, and an atomic-free combine in expert-id order.
//
// Per chunk of up to kMoeChunkRows token rows:
//   1. act_quant(x) once (shared by w1/w3 of every expert and by the shared expert's w1/w3)
//   2. logits = x . gate^T (fp32, tensor cores: bf16 products are exact in fp32) -> router top-k
//   3. routing plan: pairs (row, slot) counting-sorted by expert, rows ascending inside an expert
//   4. h1, h3 = grouped fp4 GEMMs (gathered activation rows); a = SwiGLU * weight -> bf16 -> act quant
//   5. out_e = grouped fp4 GEMM (w2) per pair
//   6. shared expert: fp8 GEMMs, SwiGLU (no weight), fp8 GEMM
//   7. y[r] = bf16(sum of the row's out_e in ascending expert id (fp32, from 0) + shared[r])
// Every step is row-independent with fixed reduction orders: batch invariant, deterministic.
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_linear_checks.h"
#include "gemm.cuh"
#include "gemm_sm90.cuh"
#include "moe.cuh"
#include "quant.cuh"

namespace ds4r {

using namespace cuda_linear;

namespace {

constexpr int64_t kMoeChunkRows = 16384;  // bounds the temporaries (~1.8 GB at D = 5120, I = 2304, k = 6)
constexpr int kMaxTopk = 32;              // router / combine kernels

struct MoeShapes {
    int64_t E, D, I, Is;  // experts, model dim, expert hidden, shared hidden
    int k;
};

// Host tables of the routed experts' device pointers (kernel parameters of the grouped GEMMs); layout: the
// weight pointers are the prepared experts' copies (GroupedFp4Gemm::w_e5m2 / w_f16), else packed fp4.
struct ExpertPointers {
    std::vector<const uint8_t*> w1, s1, w3, s3, w2, s2;
    ExpertLayout layout = ExpertLayout::None;
};

void run_chunk(CudaBackend& be, const Tensor& x, const MoeWeights& w, const MoeParams& p, const MoeShapes& sh,
               const ExpertPointers& ep, const Tensor& y, const Tensor& out_idx, const Tensor& out_w) {
    // x BF16 [Mc, D] -> y BF16 [Mc, D]; out_idx I32 [Mc, k], out_w F32 [Mc, k] (temporaries or outputs)
    const cudaStream_t st = be.stream();
    const int64_t Mc = x.dim(0), E = sh.E, D = sh.D, I = sh.I, Is = sh.Is;
    const int k = sh.k;
    const int64_t P = Mc * k;

    // 1. activation quant of x (GEMM scale bytes: NaN blocks stay NaN through the block-scaled GEMMs)
    // (DS4R_PROFILE: sub-regions "moe/..." of the layer's "moe" region, one per step)
    ProfilePhase ph(be);
    ph("moe/act_quant");
    const CudaBackend::GemmActs ax = be.quantize_gemm_acts(x, Mc, D);
    const Tensor& qx = ax.q;
    const Tensor& sx = ax.s;

    // 2. router
    ph("moe/router");
    {
        Tensor logits = be.alloc(DType::F32, {Mc, E});
        if (kern::gemm_bf16_supported(x.data, D, 0, w.gate_w.data, D, 0, D))
            DS4R_CUDA_CHECK(be.gemm().bf16(x.ptr<uint16_t>(), D, 0, w.gate_w.ptr<uint16_t>(), D, 0,
                                           logits.data, true, E, 0, Mc, E, D, 1, st));
        else
            DS4R_CUDA_CHECK(kern::launch_gemm_simt(x.data, false, D, 0, w.gate_w.data, false, D, 0,
                                                   logits.data, true, E, 0, Mc, E, D, 1, st));
        DS4R_CUDA_CHECK(kern::launch_moe_router(logits.ptr<float>(), w.gate_bias.ptr<float>(), Mc,
                                                static_cast<int>(E), k, 1.0f / p.gate_temp, p.route_scale,
                                                out_idx.ptr<int32_t>(), out_w.ptr<float>(), st));
    }

    // 3. routing plan. Tiles: sum_e ceil(n_e / 128) <= (P + 127 * #non-empty experts) / 128, and
    // <= E * ceil(Mc / 128) (an expert holds each row at most once).
    ph("moe/routing_plan");
    const int64_t used = std::min<int64_t>(E, P);
    const int64_t max_tiles =
        std::max<int64_t>(1, std::min<int64_t>(E * ((Mc + 127) / 128), (P + 127 * used) / 128));
    Tensor counts = be.alloc(DType::I32, {E});
    Tensor e_begin = be.alloc(DType::I32, {E});
    Tensor e_end = be.alloc(DType::I32, {E});
    Tensor tile_begin = be.alloc(DType::I32, {E + 1});
    Tensor tile_expert = be.alloc(DType::I32, {max_tiles});
    Tensor tile_start = be.alloc(DType::I32, {max_tiles});
    Tensor pair_row = be.alloc(DType::I32, {P});
    Tensor pair_w = be.alloc(DType::F32, {P});
    Tensor slot_pos = be.alloc(DType::I32, {P});
    DS4R_CUDA_CHECK(kern::launch_moe_routing(
        out_idx.ptr<int32_t>(), out_w.ptr<float>(), Mc, k, static_cast<int>(E), counts.ptr<int32_t>(),
        e_begin.ptr<int32_t>(), e_end.ptr<int32_t>(), tile_begin.ptr<int32_t>(), tile_expert.ptr<int32_t>(),
        tile_start.ptr<int32_t>(), max_tiles, pair_row.ptr<int32_t>(), pair_w.ptr<float>(),
        slot_pos.ptr<int32_t>(), st));

    kern::GroupedFp4Gemm g{};
    g.tile_expert = tile_expert.ptr<int32_t>();
    g.tile_start = tile_start.ptr<int32_t>();
    g.tile_begin = tile_begin.ptr<int32_t>();
    g.expert_end = e_end.ptr<int32_t>();
    g.max_tiles = max_tiles;
    g.max_rows_per_expert = Mc;
    g.pairs = P;
    g.n_experts = static_cast<int>(E);
    // Hopper: each expert's short last tile (1 .. 64 pairs) on a 64-row tile (Sm90GroupedRows::Mixed)
    // where the kernels' Auto takes the split (not for the prepared fp16 experts)
    const std::vector<Tensor> split =
        be.gemm().hopper && kern::sm90_grouped_auto_mixed(ep.layout == ExpertLayout::F16)
            ? attach_grouped_tile_split(be, counts.ptr<int32_t>(), e_begin.ptr<int32_t>(), E, max_tiles, g,
                                        st)
            : std::vector<Tensor>{};

    // 4. w1, w3 of every expert in one launch, then SwiGLU * routing weight -> bf16 -> act quant
    Tensor q2 = be.alloc(DType::F8_E4M3, {P, I});
    Tensor s2 = be.alloc(DType::F8_E8M0, {P, I / 32});
    {
        Tensor h1 = be.alloc(DType::BF16, {P, I});
        Tensor h3 = be.alloc(DType::BF16, {P, I});
        g.q = qx.ptr<uint8_t>();
        g.sa = sx.ptr<uint8_t>();
        g.a_rows = pair_row.ptr<int32_t>();
        g.n_proj = 2;
        g.N = I;
        g.K = D;
        g.w_e5m2 = ep.layout == ExpertLayout::E5m2;
        g.w_f16 = ep.layout == ExpertLayout::F16;
        g.w[0] = ep.w1.data();
        g.s[0] = ep.s1.data();
        g.w[1] = ep.w3.data();
        g.s[1] = ep.s3.data();
        g.y[0] = h1.ptr<uint16_t>();
        g.y[1] = h3.ptr<uint16_t>();
        ph("moe/experts_w1_w3");
        const std::vector<Tensor> rows_in_pair_order = gather_pair_rows(be, g, st);  // fp16 experts: A by TMA
        DS4R_CUDA_CHECK(be.gemm().grouped_fp4(g, st));
        ph("moe/swiglu_quant");
        DS4R_CUDA_CHECK(kern::launch_swiglu_quant(h1.ptr<uint16_t>(), h3.ptr<uint16_t>(), pair_w.ptr<float>(),
                                                  p.swiglu_limit, P, I, q2.ptr<uint8_t>(), s2.ptr<uint8_t>(),
                                                  be.gemm().act_order, st));
    }

    // 5. w2 per pair (activation rows = pair positions)
    Tensor out_e = be.alloc(DType::BF16, {P, D});
    g.q = q2.ptr<uint8_t>();
    g.sa = s2.ptr<uint8_t>();
    g.a_rows = nullptr;
    g.n_proj = 1;
    g.N = D;
    g.K = I;
    g.w[0] = ep.w2.data();
    g.s[0] = ep.s2.data();
    g.w[1] = nullptr;
    g.s[1] = nullptr;
    g.y[0] = out_e.ptr<uint16_t>();
    g.y[1] = nullptr;
    ph("moe/experts_w2");
    DS4R_CUDA_CHECK(be.gemm().grouped_fp4(g, st));
    q2 = Tensor();
    s2 = Tensor();

    // 6. shared expert (fp8, no routing weight)
    ph("moe/shared_expert");
    Tensor shared = be.alloc(DType::BF16, {Mc, D});
    {
        Tensor q2s = be.alloc(DType::F8_E4M3, {Mc, Is});
        Tensor s2s = be.alloc(DType::F8_E8M0, {Mc, Is / 32});
        {
            Tensor gs = be.alloc(DType::BF16, {Mc, Is});
            Tensor us = be.alloc(DType::BF16, {Mc, Is});
            be.fp8_gemm(qx.ptr<uint8_t>(), sx.ptr<uint8_t>(), w.sw1.w.ptr<uint8_t>(), w.sw1.s.ptr<uint8_t>(),
                        gs.ptr<uint16_t>(), Is, Mc, Is, D);
            be.fp8_gemm(qx.ptr<uint8_t>(), sx.ptr<uint8_t>(), w.sw3.w.ptr<uint8_t>(), w.sw3.s.ptr<uint8_t>(),
                        us.ptr<uint16_t>(), Is, Mc, Is, D);
            DS4R_CUDA_CHECK(kern::launch_swiglu_quant(gs.ptr<uint16_t>(), us.ptr<uint16_t>(), nullptr,
                                                      p.swiglu_limit, Mc, Is, q2s.ptr<uint8_t>(),
                                                      s2s.ptr<uint8_t>(), be.gemm().act_order, st));
        }
        be.fp8_gemm(q2s.ptr<uint8_t>(), s2s.ptr<uint8_t>(), w.sw2.w.ptr<uint8_t>(), w.sw2.s.ptr<uint8_t>(),
                    shared.ptr<uint16_t>(), D, Mc, D, Is);
    }

    // 7. combine
    ph("moe/combine");
    DS4R_CUDA_CHECK(kern::launch_moe_combine(out_e.ptr<uint16_t>(), out_idx.ptr<int32_t>(),
                                             slot_pos.ptr<int32_t>(), k, shared.ptr<uint16_t>(), Mc, D,
                                             y.ptr<uint16_t>(), st));
}

}  // namespace

void CudaBackend::moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
                      const Tensor& route_idx, const Tensor& route_w) {
    // x BF16 [M, D] (ffn-normed) -> y BF16 [M, D]; route_idx I32 [M, k] / route_w F32 [M, k] optional
    const char* op = "moe";
    const auto [M, E, D] = opcheck::moe(x, w, p, y, route_idx, route_w);
    MoeShapes sh{};
    sh.E = E;
    sh.D = D;
    sh.k = p.topk;
    DS4R_CHECK(sh.k <= kMaxTopk, "cuda moe: topk = %d exceeds the router kernel's limit %d", sh.k, kMaxTopk);
    DS4R_CHECK(D % 32 == 0, "cuda moe: D = %lld is not a multiple of 32", (long long)D);
    // In place (y == x) is fine: each chunk reads its x rows before writing its y rows.
    check_same_or_disjoint(op, "x", x, "y", y);

    check_fp8_weight(op, "shared w1", w.sw1);
    check_fp8_weight(op, "shared w3", w.sw3);
    check_fp8_weight(op, "shared w2", w.sw2);
    sh.Is = w.sw1.w.dim(0);
    DS4R_CHECK(w.sw1.w.dim(1) == D && w.sw3.w.shape == w.sw1.w.shape && w.sw2.w.shape == Shape({D, sh.Is}),
               "cuda moe: shared expert must be w1, w3 [I, %lld], w2 [%lld, I]; got %s, %s, %s", (long long)D,
               (long long)D, shape_str(w.sw1.w.shape).c_str(), shape_str(w.sw3.w.shape).c_str(),
               shape_str(w.sw2.w.shape).c_str());
    DS4R_CHECK(sh.Is % 32 == 0, "cuda moe: shared hidden size %lld is not a multiple of 32",
               (long long)sh.Is);
    check_aligned16(op, "shared w1", w.sw1.w);
    check_aligned16(op, "shared w3", w.sw3.w);
    check_aligned16(op, "shared w2", w.sw2.w);

    ExpertPointers ep;
    sh.I = E > 0 ? w.experts[0].w1.w.dim(0) : 0;
    for (int64_t e = 0; e < E; ++e) {
        const ExpertWeights& ew = w.experts[static_cast<size_t>(e)];
        const int64_t K1 = check_fp4_weight(op, "expert w1", ew.w1);
        const int64_t K3 = check_fp4_weight(op, "expert w3", ew.w3);
        const int64_t K2 = check_fp4_weight(op, "expert w2", ew.w2);
        DS4R_CHECK(
            K1 == D && K3 == D && ew.w1.w.dim(0) == sh.I && ew.w3.w.dim(0) == sh.I && ew.w2.w.dim(0) == D &&
                K2 == sh.I,
            "cuda moe: expert %lld must have w1, w3 packed [%lld, %lld] and w2 [%lld, %lld] (every expert "
            "the same I); got %s, %s, %s",
            (long long)e, (long long)sh.I, (long long)(D / 2), (long long)D, (long long)(sh.I / 2),
            shape_str(ew.w1.w.shape).c_str(), shape_str(ew.w3.w.shape).c_str(),
            shape_str(ew.w2.w.shape).c_str());
        check_aligned16(op, "expert w1", ew.w1.w);
        check_aligned16(op, "expert w3", ew.w3.w);
        check_aligned16(op, "expert w2", ew.w2.w);
        ep.w1.push_back(ew.w1.w.ptr<uint8_t>());
        ep.s1.push_back(ew.w1.s.ptr<uint8_t>());
        ep.w3.push_back(ew.w3.w.ptr<uint8_t>());
        ep.s3.push_back(ew.w3.s.ptr<uint8_t>());
        ep.w2.push_back(ew.w2.w.ptr<uint8_t>());
        ep.s2.push_back(ew.w2.s.ptr<uint8_t>());
    }
    DS4R_CHECK(sh.I > 0 && sh.I % 32 == 0,
               "cuda moe: expert hidden size %lld is not a positive multiple of 32", (long long)sh.I);
    if (const PreparedExperts* pe = prepared_for(w)) {
        wait_prepared_experts();
        ep.w1 = pe->w1;
        ep.w3 = pe->w3;
        ep.w2 = pe->w2;
        ep.layout = pe->layout;
    }

    const bool want_idx = opcheck::given(route_idx), want_w = opcheck::given(route_w);
    if (M == 0) return;

    const Tensor x2 = x.reshape({M, D});
    const Tensor y2 = y.reshape({M, D});
    for (int64_t r0 = 0; r0 < M; r0 += kMoeChunkRows) {
        const int64_t r1 = std::min(M, r0 + kMoeChunkRows);
        const Tensor idx = want_idx ? route_idx.rows(r0, r1) : alloc(DType::I32, {r1 - r0, sh.k});
        const Tensor rw = want_w ? route_w.rows(r0, r1) : alloc(DType::F32, {r1 - r0, sh.k});
        run_chunk(*this, x2.rows(r0, r1), w, p, sh, ep, y2.rows(r0, r1), idx, rw);
    }
}

uint64_t CudaBackend::prepared_experts_bytes(int64_t experts, int64_t dim, int64_t hidden,
                                             ExpertLayout layout) const {
    if (!reads_prepared_experts() || layout == ExpertLayout::None || experts <= 0 || dim <= 0 || hidden <= 0)
        return 0;
    // the fp16 layout's kernel reads B by TMA only
    if (layout == ExpertLayout::F16 && !kern::sm90_tensor_maps_usable()) return 0;
    const uint64_t per_value = layout == ExpertLayout::F16 ? 2 : 1;
    return per_value * static_cast<uint64_t>(experts) * 3 * static_cast<uint64_t>(dim) *
           static_cast<uint64_t>(hidden);
}

void CudaBackend::set_prepared_experts(ExpertLayout layout) {
    DS4R_CHECK(layout == ExpertLayout::None || reads_prepared_experts(),
               "cuda: prepared experts (%s) need the Hopper kernels with widened partials (kernels: %s)",
               expert_layout_name(layout), gemm_.name());
    DS4R_CHECK(layout != ExpertLayout::F16 || kern::sm90_tensor_maps_usable(),
               "cuda: prepared fp16 experts need the driver's tensor-map encoder (cuTensorMapEncodeTiled)");
    if (layout != prepare_) release_experts();
    prepare_ = layout;
}

void CudaBackend::prepare_experts(const MoeWeights& w) {
    // one buffer, w1 | w3 | w2 of expert 0, then expert 1, ...: each fp4 tensor [rows, cols / 2] becomes
    // e5m2 [rows, cols] (2 bytes per packed byte, same order) or fp16 [rows, cols] with the scales folded
    // in (4 bytes per packed byte); every expert's tensors the shapes of expert 0's, so that each
    // projection's experts lie at one stride (the fp16 kernels' tensor maps)
    release_experts();
    if (prepare_ == ExpertLayout::None || w.experts.empty()) return;
    const char* op = "prepare_experts";
    const bool f16 = prepare_ == ExpertLayout::F16;
    const uint64_t widen = f16 ? 4 : 2;  // bytes per packed byte
    uint64_t total = 0;
    const ExpertWeights& e0 = w.experts[0];
    for (size_t e = 0; e < w.experts.size(); ++e) {
        const ExpertWeights& ew = w.experts[e];
        for (const Fp4Linear* l : {&ew.w1, &ew.w3, &ew.w2}) {
            check_fp4_weight(op, "expert weight", *l);
            check_aligned16(op, "expert weight", l->w);
            DS4R_CHECK(l->w.nbytes() % 16 == 0,
                       "cuda prepare_experts: expert weight of %zu bytes (not a multiple of 16)",
                       l->w.nbytes());
            total += widen * l->w.nbytes();
        }
        DS4R_CHECK(ew.w1.w.shape == e0.w1.w.shape && ew.w3.w.shape == e0.w3.w.shape &&
                       ew.w2.w.shape == e0.w2.w.shape,
                   "cuda prepare_experts: expert %zu has w1 %s, w3 %s, w2 %s; expert 0 has %s, %s, %s", e,
                   shape_str(ew.w1.w.shape).c_str(), shape_str(ew.w3.w.shape).c_str(),
                   shape_str(ew.w2.w.shape).c_str(), shape_str(e0.w1.w.shape).c_str(),
                   shape_str(e0.w3.w.shape).c_str(), shape_str(e0.w2.w.shape).c_str());
    }
    PreparedExperts pe;
    pe.buffer = alloc(DType::I8, {static_cast<int64_t>(total)});
    uint8_t* dst = pe.buffer.ptr<uint8_t>();
    // on prep_stream_, after everything stream_ has queued (the layer's weights, the allocation): the copy
    // runs beside the first chunk's attention (wait_prepared_experts joins it)
    DS4R_CUDA_CHECK(cudaEventRecord(prep_start_, stream_));
    DS4R_CUDA_CHECK(cudaStreamWaitEvent(prep_stream_, prep_start_, 0));
    prep_pending_ = true;  // from here on release_experts joins the copy before freeing its buffer
    for (const ExpertWeights& ew : w.experts) {
        for (const Fp4Linear* l : {&ew.w1, &ew.w3, &ew.w2}) {
            const auto bytes = static_cast<int64_t>(l->w.nbytes());
            if (f16)
                DS4R_CUDA_CHECK(kern::launch_fp4_to_f16_folded(l->w.ptr<uint8_t>(), l->s.ptr<uint8_t>(),
                                                               bytes, reinterpret_cast<uint16_t*>(dst),
                                                               prep_stream_));
            else
                DS4R_CUDA_CHECK(kern::launch_fp4_to_e5m2(l->w.ptr<uint8_t>(), bytes, dst, prep_stream_));
            (l == &ew.w1 ? pe.w1 : l == &ew.w3 ? pe.w3 : pe.w2).push_back(dst);
            dst += widen * l->w.nbytes();
        }
    }
    DS4R_CUDA_CHECK(cudaEventRecord(prep_done_, prep_stream_));
    pe.source = w.experts[0].w1.w.ptr<uint8_t>();
    pe.experts = w.experts.size();
    pe.layout = prepare_;
    prepared_ = std::move(pe);
}

void CudaBackend::wait_prepared_experts() {
    if (!prep_pending_) return;
    ProfileRange pr(*this, "moe/prepare_experts");  // what of the copy the first chunk's work did not hide
    // (prep_done_ was recorded after the last copy; were a launch to throw before it, the stream is
    // synchronized instead, below in release_experts)
    DS4R_CUDA_CHECK(cudaStreamWaitEvent(stream_, prep_done_, 0));
    prep_pending_ = false;
}

void CudaBackend::release_experts() {
    if (prep_pending_) {
        // the copy may still be writing the buffer that returns to the pool on stream_: join it first
        // (prep_done_ may not be recorded if a launch threw: then wait for the whole side stream). Not
        // checked: this also runs in the pass's scope guard while an exception unwinds, where a throw would
        // terminate; a sticky device error surfaces at the next checked call.
        cudaStreamSynchronize(prep_stream_);
        prep_pending_ = false;
    }
    prepared_ = PreparedExperts{};  // the buffer returns to the stream-ordered pool
}

const CudaBackend::PreparedExperts* CudaBackend::prepared_for(const MoeWeights& w) const {
    if (prepared_.source == nullptr || w.experts.size() != prepared_.experts ||
        w.experts[0].w1.w.ptr<uint8_t>() != prepared_.source)
        return nullptr;
    return &prepared_;
}

std::vector<Tensor> attach_grouped_tile_split(Backend& be, const int32_t* counts, const int32_t* expert_begin,
                                              int64_t E, int64_t max_tiles, kern::GroupedFp4Gemm& g,
                                              cudaStream_t stream) {
    // full_begin [E + 1], full_expert / full_start [max_tiles], tail_begin [E + 1], tail_expert / tail_start
    // [E]
    std::vector<Tensor> t;
    for (int64_t n : {E + 1, max_tiles, max_tiles, E + 1, E, E}) t.push_back(be.alloc(DType::I32, {n}));
    DS4R_CUDA_CHECK(kern::launch_moe_tile_split(counts, expert_begin, static_cast<int>(E),
                                                t[0].ptr<int32_t>(), t[1].ptr<int32_t>(), t[2].ptr<int32_t>(),
                                                max_tiles, t[3].ptr<int32_t>(), t[4].ptr<int32_t>(),
                                                t[5].ptr<int32_t>(), stream));
    g.full = {t[1].ptr<int32_t>(), t[2].ptr<int32_t>(), t[0].ptr<int32_t>(), max_tiles};
    g.tail = {t[4].ptr<int32_t>(), t[5].ptr<int32_t>(), t[3].ptr<int32_t>(), E};
    return t;
}

std::vector<Tensor> gather_pair_rows(Backend& be, kern::GroupedFp4Gemm& g, cudaStream_t stream) {
    if (!g.w_f16 || g.a_rows == nullptr || g.pairs <= 0) return {};
    std::vector<Tensor> t;
    t.push_back(be.alloc(DType::F8_E4M3, {g.pairs, g.K}));       // codes [pairs, K]
    t.push_back(be.alloc(DType::F8_E8M0, {g.pairs, g.K / 32}));  // scales [pairs, K / 32]
    DS4R_CUDA_CHECK(kern::launch_gather_rows(g.q, g.K, g.a_rows, g.pairs, t[0].ptr<uint8_t>(), stream));
    DS4R_CUDA_CHECK(kern::launch_gather_rows(g.sa, g.K / 32, g.a_rows, g.pairs, t[1].ptr<uint8_t>(), stream));
    g.q = t[0].ptr<uint8_t>();
    g.sa = t[1].ptr<uint8_t>();
    g.a_rows = nullptr;
    return t;
}

}  // namespace ds4r
