// Tensor binding: names, dtypes and shapes of docs/MODEL.md 3.3 / 3.4, derived from the config.
#include "ds4r/binding.h"

namespace ds4r {

namespace {
int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}
}  // namespace

std::string layer_tensor_name(int layer, const std::string& suffix) {
    return "layers." + std::to_string(layer) + "." + suffix;
}
std::string engram_table_tensor_name(int layer) {
    return layer_tensor_name(layer, "engram.embed.weight");
}
std::string engram_table_scale_tensor_name(int layer) {
    return layer_tensor_name(layer, "engram.embed.scale");
}

std::vector<TensorSpec> global_tensor_specs(const ModelConfig& c) {
    return {
        {kEmbedTensorName, DType::BF16, {c.vocab_size, c.dim}, -1, TensorUse::Global, false},
        {kFinalNormTensorName, DType::BF16, {c.dim}, -1, TensorUse::Global, false, WeightField::FinalNorm},
        // The reference widens the head to fp32 in memory (exact); the file holds bf16.
        {kHeadTensorName,
         DType::BF16,
         {c.vocab_size, c.dim},
         -1,
         TensorUse::Global,
         false,
         WeightField::Head},
    };
}

std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& c, const LayerRole& role) {
    const int L = role.layer;
    const int64_t bs = c.weight_block_size;
    std::vector<TensorSpec> out;
    using F = WeightField;
    auto add = [&](F field, const std::string& suffix, DType t, Shape shape, TensorUse use = TensorUse::Layer,
                   bool optional = false, bool scale = false, int expert = -1) {
        out.push_back(
            {layer_tensor_name(L, suffix), t, std::move(shape), L, use, optional, field, scale, expert});
    };
    // fp8 linear: e4m3 weight [out, in] + e8m0 scale [ceil(out/32), ceil(in/32)].
    auto fp8 = [&](F field, const std::string& base, int64_t out_f, int64_t in_f) {
        add(field, base + ".weight", DType::F8_E4M3, {out_f, in_f});
        add(field, base + ".scale", DType::F8_E8M0, {cdiv(out_f, bs), cdiv(in_f, bs)}, TensorUse::Layer,
            false, true);
    };
    // fp4 linear (routed experts): two e2m1 codes per I8 byte [out, in/2] + e8m0 [out, in/32].
    auto fp4 = [&](F field, int expert, const std::string& base, int64_t out_f, int64_t in_f) {
        add(field, base + ".weight", DType::I8, {out_f, in_f / 2}, TensorUse::Layer, false, false, expert);
        add(field, base + ".scale", DType::F8_E8M0, {out_f, cdiv(in_f, 32)}, TensorUse::Layer, false, true,
            expert);
    };
    const int64_t D = c.dim, hd = c.head_dim, H = c.n_heads;
    const int64_t mix = c.mix_hc(), hcd = c.hc_dim();

    add(F::AttnNorm, "attn_norm.weight", DType::BF16, {D});
    add(F::FfnNorm, "ffn_norm.weight", DType::BF16, {D});
    add(F::HcAttnFn, "hc_attn_fn", DType::F32, {mix, hcd});
    add(F::HcFfnFn, "hc_ffn_fn", DType::F32, {mix, hcd});
    add(F::HcAttnBase, "hc_attn_base", DType::F32, {mix});
    add(F::HcFfnBase, "hc_ffn_base", DType::F32, {mix});
    add(F::HcAttnScale, "hc_attn_scale", DType::F32, {3});
    add(F::HcFfnScale, "hc_ffn_scale", DType::F32, {3});
    // Attention (docs/MODEL.md 4.6).
    add(F::AttnSink, "attn.attn_sink", DType::F32, {H});
    fp8(F::WqA, "attn.wq_a", c.q_lora_rank, D);
    add(F::QNorm, "attn.q_norm.weight", DType::BF16, {c.q_lora_rank});
    fp8(F::WqB, "attn.wq_b", H * hd, c.q_lora_rank);
    fp8(F::Wkv, "attn.wkv", hd, D);
    add(F::KvNorm, "attn.kv_norm.weight", DType::BF16, {hd});
    // wo_a is stored fp8 and dequantized exactly to bf16 by the reference's convert.py (3.6).
    fp8(F::WoA, "attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups);
    fp8(F::WoB, "attn.wo_b", D, c.o_groups * c.o_lora_rank);
    if (role.kv_source) {
        add(F::CmpWkv, "attn.compressor.wkv.weight", DType::BF16, {hd, D});
        // Gated pooling only at ratio 2 (docs/MODEL.md 4.6.1).
        if (role.ratio == 2) add(F::CmpWgate, "attn.compressor.wgate.weight", DType::BF16, {hd, D});
        add(F::CmpNorm, "attn.compressor.norm.weight", DType::BF16, {hd});
    }
    if (role.owns_index_keys) {
        add(F::IdxWk, "attn.indexer.wk.weight", DType::BF16, {c.index_head_dim, hd});
        add(F::IdxKNorm, "attn.indexer.k_norm.weight", DType::BF16, {c.index_head_dim});
    }
    if (role.index_source) {
        fp8(F::IdxWqB, "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        add(F::IdxWeightsProj, "attn.indexer.weights_proj.weight", DType::BF16, {c.index_n_heads, D});
    }
    // MoE (docs/MODEL.md 4.7).
    const int64_t E = c.n_routed_experts, I = c.moe_inter_dim;
    add(F::GateW, "ffn.gate.weight", DType::BF16, {E, D});
    add(F::GateBias, "ffn.gate.bias", DType::F32, {E});
    add(F::None, "ffn.gate.bias_vl", DType::F32, {E}, TensorUse::Layer,
        /*optional=*/true);  // image tokens only
    fp8(F::SharedW1, "ffn.shared_experts.w1", I, D);
    fp8(F::SharedW2, "ffn.shared_experts.w2", D, I);
    fp8(F::SharedW3, "ffn.shared_experts.w3", I, D);
    for (int64_t e = 0; e < E; ++e) {
        const std::string b = "ffn.experts." + std::to_string(e);
        fp4(F::ExpertW1, static_cast<int>(e), b + ".w1", I, D);
        fp4(F::ExpertW2, static_cast<int>(e), b + ".w2", D, I);
        fp4(F::ExpertW3, static_cast<int>(e), b + ".w3", I, D);
    }
    // Engram (docs/MODEL.md 4.8): projections stream with the layer, the table is gathered.
    const int ei = c.engram_index(L);
    if (ei >= 0) {
        const int64_t cols = c.engram_hash_cols(), ehd = c.engram_head_dim;
        fp8(F::EngWkv, "engram.wkv", D * (c.hc_mult + 1), cols * ehd);
        add(F::EngQ, "engram.q_weight", DType::BF16, {c.hc_mult, D});
        add(F::EngK, "engram.k_weight", DType::BF16, {c.hc_mult, D});
        const int64_t rows = c.engram_num_embeddings[static_cast<size_t>(ei)];
        out.push_back({engram_table_tensor_name(L), DType::F8_E4M3, {rows, ehd}, L, TensorUse::EngramTable});
        out.push_back({engram_table_scale_tensor_name(L),
                       DType::F8_E8M0,
                       {rows, cdiv(ehd, 32)},
                       L,
                       TensorUse::EngramTable});
    }
    return out;
}

std::vector<TensorSpec> all_tensor_specs(const ModelConfig& cfg, const std::vector<LayerRole>& roles) {
    std::vector<TensorSpec> out = global_tensor_specs(cfg);
    for (const auto& r : roles) {
        auto v = layer_tensor_specs(cfg, r);
        out.insert(out.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    }
    return out;
}

bool is_unused_in_prefill(const std::string& n) {
    auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
    auto ends = [&](const char* s) {
        std::string suf(s);
        return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
    };
    return starts("mtp.") || starts("vision.") || starts("aligner.") || starts("image_") || ends(".bias_vl");
}

}  // namespace ds4r
