// The tensor binding for the V4.1 prefill (MODEL.md section 3): every tensor the forward needs,
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

struct TensorSpec {
    std::string name;  // checkpoint name, e.g. "layers.3.attn.wq_a.weight"
    DType dtype;
    Shape shape;
    int layer = -1;  // -1 for globals
    TensorUse use = TensorUse::Layer;
    // Tensors the released checkpoint has but the prefill never reads (ffn.gate.bias_vl);
    // make-tiny writes them, the validator does not require them.
    bool optional = false;
};

// embed.weight [V, D] BF16, norm.weight [D] BF16, head.weight [V, D] BF16.
std::vector<TensorSpec> global_tensor_specs(const ModelConfig& cfg);

// Every tensor block `role.layer` reads, including the Engram table + scale of an Engram layer
// (use EngramTable) and the optional unused ones (optional = true). Order: the order of MODEL.md
// 3.4 (attention, indexer/compressor, mHC, MoE gate, shared expert, routed experts by id, Engram).
std::vector<TensorSpec> layer_tensor_specs(const ModelConfig& cfg, const LayerRole& role);

// All of the above for the whole model (globals first, then layers in order).
std::vector<TensorSpec> all_tensor_specs(const ModelConfig& cfg, const std::vector<LayerRole>& roles);

// True for checkpoint names the prefill never uses even though the release ships them:
// mtp.*, vision.*, aligner.*, image_* and *.bias_vl (MODEL.md 3.5).
bool is_unused_in_prefill(const std::string& name);

// "layers.<L>.<suffix>"
std::string layer_tensor_name(int layer, const std::string& suffix);

}  // namespace ds4r
