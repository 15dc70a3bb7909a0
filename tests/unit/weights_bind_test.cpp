// bind_layer_weights walks the binding (include/ds4r/binding.h): every tensor of a layer's binding
// that names a weight field lands in exactly that field, for every layer role of the golden tiny-a
// checkpoint, and nothing is looked up that the binding does not list.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ds4r/binding.h"
#include "ds4r/checkpoint.h"
#include "ds4r/model.h"
#include "test_util.h"

using namespace ds4r;

namespace {

// Every (name -> data pointer) the lookup handed out; the pointers are distinct fake addresses that
// are never dereferenced.
struct FakeLookup {
    std::map<std::string, void*> given;
    Tensor operator()(const std::string& name) {
        Tensor t;
        t.shape = {1};
        t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + 16 * given.size()));
        given.emplace(name, t.data);
        return t;
    }
};

// The data pointers of every tensor field of w (both halves of each linear).
std::vector<void*> bound_pointers(const LayerWeights& w) {
    std::vector<void*> p;
    for (const Tensor* t :
         {&w.attn_norm,   &w.ffn_norm,         &w.hc_attn_fn,   &w.hc_ffn_fn,     &w.hc_attn_base,
          &w.hc_ffn_base, &w.hc_attn_scale,    &w.hc_ffn_scale, &w.attn_sink,     &w.q_norm,
          &w.kv_norm,     &w.cmp_wkv,          &w.cmp_wgate,    &w.cmp_norm,      &w.idx_wk,
          &w.idx_k_norm,  &w.idx_weights_proj, &w.moe.gate_w,   &w.moe.gate_bias, &w.eng_q,
          &w.eng_k})
        p.push_back(t->data);
    for (const Fp8Linear* l : {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_a, &w.wo_b, &w.idx_wq_b, &w.moe.sw1,
                               &w.moe.sw2, &w.moe.sw3, &w.eng_wkv}) {
        p.push_back(l->w.data);
        p.push_back(l->s.data);
    }
    for (const ExpertWeights& e : w.moe.experts)
        for (const Fp4Linear* l : {&e.w1, &e.w2, &e.w3}) {
            p.push_back(l->w.data);
            p.push_back(l->s.data);
        }
    return p;
}

}  // namespace

TEST(WeightsBind, EveryBoundTensorLandsInOneFieldForEveryRole) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const ModelConfig& cfg = ck.config();
    ASSERT_FALSE(ck.roles().empty());
    for (const LayerRole& role : ck.roles()) {
        FakeLookup get;
        const LayerWeights w = bind_layer_weights(cfg, role, [&](const std::string& n) { return get(n); });
        std::set<std::string> want;
        for (const TensorSpec& s : layer_tensor_specs(cfg, role))
            if (s.field != WeightField::None) want.insert(s.name);
        std::set<std::string> got;
        for (const auto& [name, ptr] : get.given) got.insert(name);
        EXPECT_EQ(got, want) << "layer " << role.layer << ": looked-up names differ from the binding's";
        // Each looked-up tensor is in exactly one field; no field holds a tensor that was not looked up.
        std::map<void*, int> uses;
        for (void* p : bound_pointers(w))
            if (p) ++uses[p];
        for (const auto& [name, ptr] : get.given)
            EXPECT_EQ(uses[ptr], 1) << "layer " << role.layer << ": " << name << " bound " << uses[ptr]
                                    << " times";
        EXPECT_EQ(uses.size(), get.given.size()) << "layer " << role.layer;
        EXPECT_EQ(w.moe.experts.size(), static_cast<size_t>(cfg.n_routed_experts));
        EXPECT_EQ(w.layer, role.layer);
        // The forward's role-dependent fields are there exactly when the role needs them.
        EXPECT_EQ(w.cmp_wkv.data != nullptr, role.kv_source) << "layer " << role.layer;
        EXPECT_EQ(w.idx_wq_b.w.data != nullptr, role.index_source) << "layer " << role.layer;
        EXPECT_EQ(w.eng_wkv.w.data != nullptr, role.engram) << "layer " << role.layer;
    }
}

TEST(WeightsBind, GlobalWeightsByTheBindingsNames) {
    FakeLookup get;
    const GlobalWeights g = bind_global_weights([&](const std::string& n) { return get(n); });
    ASSERT_EQ(get.given.size(), 2u);
    EXPECT_EQ(g.norm.data, get.given.at(kFinalNormTensorName));
    EXPECT_EQ(g.head.data, get.given.at(kHeadTensorName));
}
