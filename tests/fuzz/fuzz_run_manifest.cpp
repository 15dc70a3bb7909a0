// libFuzzer target: the run sidecar (<output>.run.json) that --resume and merge read. Expected
// rejections are ds4r::Error; whatever parses must survive a write/parse round trip and compare
// equal to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ds4r/error.h"
#include "ds4r/run_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const std::string text(reinterpret_cast<const char*>(data), size);
        const ds4r::RunManifest m = ds4r::parse_run_manifest(text, "fuzz.run.json");
        const ds4r::RunManifest back = ds4r::parse_run_manifest(ds4r::run_manifest_to_json(m), "round-trip");
        if (!ds4r::compare_run_manifests(m, back).empty()) std::abort();
    } catch (const ds4r::Error&) {
    }
    return 0;
}
