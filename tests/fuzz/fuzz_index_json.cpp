// libFuzzer target: parse_safetensors_index (model.safetensors.index.json) on arbitrary text.
// Expected rejections are ds4r::Error; an accepted index must be sorted, without duplicate names,
// and name only plain files.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ds4r/error.h"
#include "ds4r/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto idx = ds4r::parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size),
                                                 "fuzz.index.json");
        for (size_t i = 0; i < idx.weight_map.size(); ++i) {
            const auto& [name, file] = idx.weight_map[i];
            if (i && !(idx.weight_map[i - 1].first < name)) __builtin_trap();
            if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
                __builtin_trap();
        }
    } catch (const ds4r::Error&) {
    }
    return 0;
}
