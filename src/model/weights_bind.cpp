// Binds checkpoint tensors to the fields the forward uses by walking the binding
// (include/ds4r/binding.h): names are spelled there only; here each WeightField picks its field.
#include "ds4r/binding.h"
#include "ds4r/error.h"
#include "ds4r/model.h"

namespace ds4r {

namespace {

// The field of `w` that spec `s` binds to, set to t (a linear's .weight or .scale half).
void bind_layer_field(LayerWeights& w, const TensorSpec& s, const Tensor& t) {
    auto fp8 = [&](Fp8Linear& l) { (s.scale ? l.s : l.w) = t; };
    auto fp4 = [&](Fp4Linear ExpertWeights::*m) {
        DS4R_CHECK(s.expert >= 0 && static_cast<size_t>(s.expert) < w.moe.experts.size(),
                   "binding: %s names expert %d of %zu", s.name.c_str(), s.expert, w.moe.experts.size());
        Fp4Linear& l = w.moe.experts[static_cast<size_t>(s.expert)].*m;
        (s.scale ? l.s : l.w) = t;
    };
    // One line per field.
    // clang-format off
    using F = WeightField;
    switch (s.field) {
        case F::AttnNorm: w.attn_norm = t; break;
        case F::FfnNorm: w.ffn_norm = t; break;
        case F::HcAttnFn: w.hc_attn_fn = t; break;
        case F::HcFfnFn: w.hc_ffn_fn = t; break;
        case F::HcAttnBase: w.hc_attn_base = t; break;
        case F::HcFfnBase: w.hc_ffn_base = t; break;
        case F::HcAttnScale: w.hc_attn_scale = t; break;
        case F::HcFfnScale: w.hc_ffn_scale = t; break;
        case F::AttnSink: w.attn_sink = t; break;
        case F::WqA: fp8(w.wq_a); break;
        case F::QNorm: w.q_norm = t; break;
        case F::WqB: fp8(w.wq_b); break;
        case F::Wkv: fp8(w.wkv); break;
        case F::KvNorm: w.kv_norm = t; break;
        case F::WoA: fp8(w.wo_a); break;
        case F::WoB: fp8(w.wo_b); break;
        case F::CmpWkv: w.cmp_wkv = t; break;
        case F::CmpWgate: w.cmp_wgate = t; break;
        case F::CmpNorm: w.cmp_norm = t; break;
        case F::IdxWk: w.idx_wk = t; break;
        case F::IdxKNorm: w.idx_k_norm = t; break;
        case F::IdxWqB: fp8(w.idx_wq_b); break;
        case F::IdxWeightsProj: w.idx_weights_proj = t; break;
        case F::GateW: w.moe.gate_w = t; break;
        case F::GateBias: w.moe.gate_bias = t; break;
        case F::SharedW1: fp8(w.moe.sw1); break;
        case F::SharedW2: fp8(w.moe.sw2); break;
        case F::SharedW3: fp8(w.moe.sw3); break;
        case F::ExpertW1: fp4(&ExpertWeights::w1); break;
        case F::ExpertW2: fp4(&ExpertWeights::w2); break;
        case F::ExpertW3: fp4(&ExpertWeights::w3); break;
        case F::EngWkv: fp8(w.eng_wkv); break;
        case F::EngQ: w.eng_q = t; break;
        case F::EngK: w.eng_k = t; break;
        case F::None:
        case F::FinalNorm:
        case F::Head:
            throw RuntimeError("binding: " + s.name + " is not a layer weight field");
    }
    // clang-format on
}

}  // namespace

LayerWeights bind_layer_weights(const ModelConfig& cfg, const LayerRole& role, const TensorLookup& get) {
    LayerWeights w;
    w.layer = role.layer;
    w.role = role;
    w.moe.experts.resize(static_cast<size_t>(cfg.n_routed_experts));
    for (const TensorSpec& s : layer_tensor_specs(cfg, role))
        if (s.field != WeightField::None) bind_layer_field(w, s, get(s.name));
    return w;
}

GlobalWeights bind_global_weights(const TensorLookup& get) {
    return GlobalWeights{get(kFinalNormTensorName), get(kHeadTensorName)};
}

}  // namespace ds4r
