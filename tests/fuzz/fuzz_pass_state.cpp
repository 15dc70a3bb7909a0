// libFuzzer target: the header of a saved pass (<output>.pass, src/replay/pass_state.h) that
// --resume reads. The bytes go through a file (the reader's interface); expected rejections are
// ds4r::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ds4r/error.h"
#include "replay/pass_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string path = "/tmp/ds4r_fuzz_pass_state." + std::to_string(::getpid());
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
        const ds4r::SavedPass p = ds4r::read_pass_header(path);
        (void)p.total_tokens();
        (void)p.hidden_pending();
    } catch (const ds4r::Error&) {
    }
    return 0;
}
