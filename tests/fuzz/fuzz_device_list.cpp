// libFuzzer target: the --devices value (score --devices LIST|all) -> device indices. Expected
// rejections are ds4r::InputError; anything else (an abort, a crash, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4r/error.h"
#include "ds4r/score.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    try {
        // The first byte picks how many devices `all` sees (0..7).
        const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
        const auto devices = ds4r::parse_device_list(text, data[0] % 8);
        if (devices.empty() || devices.size() > static_cast<size_t>(ds4r::kMaxDeviceWorkers))
            __builtin_trap();
        for (int d : devices)
            if (d < 0 || d >= ds4r::kMaxDeviceIndex) __builtin_trap();
    } catch (const ds4r::InputError&) {
    }
    return 0;
}
