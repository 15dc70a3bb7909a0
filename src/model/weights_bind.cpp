// Binds checkpoint tensors (by the names of include/ds4r/binding.h) to the fields the forward uses.
#include "ds4r/binding.h"
#include "ds4r/model.h"

namespace ds4r {

LayerWeights bind_layer_weights(const ModelConfig& cfg, const LayerRole& role, const TensorLookup& get) {
    const int L = role.layer;
    auto t = [&](const std::string& suffix) { return get(layer_tensor_name(L, suffix)); };
    auto fp8 = [&](const std::string& base) { return Fp8Linear{t(base + ".weight"), t(base + ".scale")}; };
    auto fp4 = [&](const std::string& base) { return Fp4Linear{t(base + ".weight"), t(base + ".scale")}; };
    LayerWeights w;
    w.layer = L;
    w.role = role;
    w.attn_norm = t("attn_norm.weight");
    w.ffn_norm = t("ffn_norm.weight");
    w.hc_attn_fn = t("hc_attn_fn");
    w.hc_ffn_fn = t("hc_ffn_fn");
    w.hc_attn_base = t("hc_attn_base");
    w.hc_ffn_base = t("hc_ffn_base");
    w.hc_attn_scale = t("hc_attn_scale");
    w.hc_ffn_scale = t("hc_ffn_scale");
    w.attn_sink = t("attn.attn_sink");
    w.wq_a = fp8("attn.wq_a");
    w.q_norm = t("attn.q_norm.weight");
    w.wq_b = fp8("attn.wq_b");
    w.wkv = fp8("attn.wkv");
    w.kv_norm = t("attn.kv_norm.weight");
    w.wo_a = fp8("attn.wo_a");
    w.wo_b = fp8("attn.wo_b");
    if (role.kv_source) {
        w.cmp_wkv = t("attn.compressor.wkv.weight");
        if (role.ratio == 2) w.cmp_wgate = t("attn.compressor.wgate.weight");
        w.cmp_norm = t("attn.compressor.norm.weight");
    }
    if (role.owns_index_keys) {
        w.idx_wk = t("attn.indexer.wk.weight");
        w.idx_k_norm = t("attn.indexer.k_norm.weight");
    }
    if (role.index_source) {
        w.idx_wq_b = fp8("attn.indexer.wq_b");
        w.idx_weights_proj = t("attn.indexer.weights_proj.weight");
    }
    w.moe.gate_w = t("ffn.gate.weight");
    w.moe.gate_bias = t("ffn.gate.bias");
    w.moe.sw1 = fp8("ffn.shared_experts.w1");
    w.moe.sw2 = fp8("ffn.shared_experts.w2");
    w.moe.sw3 = fp8("ffn.shared_experts.w3");
    w.moe.experts.resize(static_cast<size_t>(cfg.n_routed_experts));
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e) {
        const std::string b = "ffn.experts." + std::to_string(e);
        auto& x = w.moe.experts[static_cast<size_t>(e)];
        x.w1 = fp4(b + ".w1");
        x.w2 = fp4(b + ".w2");
        x.w3 = fp4(b + ".w3");
    }
    if (role.engram) {
        w.eng_wkv = fp8("engram.wkv");
        w.eng_q = t("engram.q_weight");
        w.eng_k = t("engram.k_weight");
    }
    return w;
}

GlobalWeights bind_global_weights(const TensorLookup& get) {
    return GlobalWeights{get("norm.weight"), get("head.weight")};
}

}  // namespace ds4r
