// The tensor binding for the V4.1 prefill (docs/MODEL.md section 3): every tensor the forward needs,
// with its exact dtype and shape derived from the config and the layer's role. This list is the one
// place tensor names are spelled; the validator, `inspect`, `make-tiny`, the byte plan of the
// prefetcher and the model's weight structs all walk it.
#pragma once

#include <string>
#include <vector>

#include "ds4r/config.h"
#include "ds4r/dtype.h"

namespace ds4r {

enum class TensorUse : uint8_t {
    Global,       // embed / final norm / head: read once per run
    Layer,        // streamed per layer (attention, mHC, MoE, Engram projections)
    EngramTable,  // Engram rows + scales: gathered by hash id, never streamed
};

// The weight-struct field (include/ds4r/model.h LayerWeights / GlobalWeights) a tensor binds to, so that
// bind_layer_weights walks this list instead of spelling the names again. A linear's weight and
// scale share a field (TensorSpec::scale tells which); routed experts carry their id.
// Grouped in the order of docs/MODEL.md 3.4.
// clang-format off
enum class WeightField : uint8_t {
    None,  // not bound to a weight struct (optional tensors, the Engram table, the embedding)
    FinalNorm, Head,
    AttnNorm, FfnNorm, HcAttnFn, HcFfnFn, HcAttnBase, HcFfnBase, HcAttnScale, HcFfnScale,
    AttnSink, WqA, QNorm, WqB, Wkv, KvNorm, WoA, WoB,
    CmpWkv, CmpWgate, CmpNorm, IdxWk, IdxKNorm, IdxWqB, IdxWeightsProj,
    GateW, GateBias, SharedW1, SharedW2, SharedW3, ExpertW1, ExpertW2, ExpertW3,
    EngWkv, EngQ, EngK,
};
// clang-format on

struct TensorSpec {
    std::string name;  // checkpoint name, e.g. "layers.3.attn.wq_a.weight"
    DType dtype;
    Shape shape;
    int layer = -1;  // -1 for globals
    TensorUse use = TensorUse::Layer;
    // Tensors the released checkpoint has but the prefill never reads (ffn.gate.bias_vl);
    // make-tiny writes them, the validator does not require them.
    bool optional = false;
    WeightField field = WeightField::None;
    bool scale = false;  // the .scale half of an fp8 / fp4 linear
    int expert = -1;     // routed expert id (ExpertW1 / W2 / W3)
};

// Names of the global tensors and of an Engram layer's table (read outside the layer stream).
inline constexpr const char* kEmbedTensorName = "embed.weight";
inline constexpr const char* kFinalNormTensorName = "norm.weight";
inline constexpr const char* kHeadTensorName = "head.weight";

// embed.weight [V, D] BF16, norm.weight [D] BF16, head.weight [V, D] BF16.
std::vector<TensorSpec> global_tensor_specs(const ModelConfig& cfg);

// Every tensor block `role.layer` reads, including the Engram table + scale of an Engram layer
// (use EngramTable) and the optional unused ones (optional = true). Order: the order of docs/MODEL.md
// 3.4 (attention, indexer/compressor, mHC, MoE gate, shared expert, routed experts by id, Engram).
std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& cfg, const LayerRole& role);

// All of the above for the whole model (globals first, then layers in order).
std::vector<TensorSpec> all_tensor_specs(const ModelConfig& cfg, const std::vector<LayerRole>& roles);

// True for checkpoint names the prefill never uses even though the release ships them:
// mtp.*, vision.*, aligner.*, image_* and *.bias_vl (docs/MODEL.md 3.5).
bool is_unused_in_prefill(const std::string& name);

// "layers.<L>.<suffix>"
std::string layer_tensor_name(int layer, const std::string& suffix);
// The Engram table of layer L: rows F8_E4M3 [rows, ehd] and their scales F8_E8M0 [rows, ehd / 32].
std::string engram_table_tensor_name(int layer);
std::string engram_table_scale_tensor_name(int layer);

}  // namespace ds4r
