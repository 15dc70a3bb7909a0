// libFuzzer target: the results-line rewriting of `merge` (remap_hidden_rows): any text is either
// refused with a ds4r::Error or rewritten; an identity row map must give back the line unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ds4r/error.h"
#include "ds4r/merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string line(reinterpret_cast<const char*>(data), size);
    try {
        const std::string same = ds4r::remap_hidden_rows(
            line, [](int, int64_t begin, int64_t) { return begin; }, "fuzz:1");
        if (same != line) std::abort();
        ds4r::remap_hidden_rows(
            line, [](int layer, int64_t, int64_t) { return int64_t{layer} * 1000; }, "fuzz:1");
    } catch (const ds4r::Error&) {
    }
    return 0;
}
