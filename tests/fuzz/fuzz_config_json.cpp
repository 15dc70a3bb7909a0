// libFuzzer target: config.json (both forms) -> ModelConfig -> layer roles -> tensor binding, the
// path every untrusted config takes in Checkpoint::open. Expected rejections are ds4r::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ds4r/binding.h"
#include "ds4r/config.h"
#include "ds4r/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        std::string_view text(reinterpret_cast<const char*>(data), size);
        ds4r::ModelConfig cfg = ds4r::parse_model_config(text, "fuzz.config.json");
        auto roles = ds4r::derive_layer_roles(cfg, "fuzz.config.json");
        for (const auto& r : roles) (void)r.describe();
        // The binding lists ~3 tensors per routed expert per layer: keep the list small enough for
        // the fuzzer's memory limit (the real model has 96k).
        if (cfg.n_routed_experts <= 100000 && cfg.n_layers * (cfg.n_routed_experts + 16) <= 200000)
            (void)ds4r::all_tensor_specs(cfg, roles);
    } catch (const ds4r::Error&) {
    }
    return 0;
}
