// libFuzzer target: tokenizer.json -> Tokenizer -> Engram token map (docs/MODEL.md 4.2), the path every
// untrusted tokenizer takes when a checkpoint is opened; plus the UTF-8 / Unicode helpers on the
// raw input bytes. Expected rejections are ds4r::Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ds4r/config.h"
#include "ds4r/engram.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool quiet = (ds4r::log_set_level(ds4r::LogLevel::Error), true);  // no hole warnings
    (void)quiet;
    std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        // The byte-level helpers must take any bytes.
        (void)ds4r::utf8_from_bytes_lossy(text);
        (void)ds4r::byte_level_decode(text);
        (void)ds4r::engram_normalize(std::string(text));

        ds4r::Tokenizer tok = ds4r::Tokenizer::parse(text, "fuzz.tokenizer.json");
        ds4r::ModelConfig cfg;
        cfg.engram_pad_id = 0;
        // Ids may reach 4M (holes included); the full map is built for tables the size of the
        // released one and below, a sample of ids otherwise, to keep each run fast.
        if (tok.size() <= 200000) {
            ds4r::EngramTokenMap m =
                ds4r::build_engram_token_map(tok, cfg, "fuzz.tokenizer.json", /*check=*/false);
            if (static_cast<int64_t>(m.map.size()) != tok.size() || m.num_keys < 1 || m.num_keys > tok.size())
                __builtin_trap();
        } else {
            for (int64_t id = 0; id < tok.size(); id += tok.size() / 1000 + 1)
                (void)ds4r::engram_normalize(tok.decode_one(id));
        }
    } catch (const ds4r::Error&) {
    }
    return 0;
}
