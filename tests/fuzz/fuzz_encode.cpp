// libFuzzer target: `ds4replay encode` on the V4.1 tokenizer (tests/data/tokenizer/, gzipped): the
// first input byte picks the path, the rest is
//  - even: text -> TextEncoder::encode; valid UTF-8 must round-trip exactly through
//    Tokenizer::decode, invalid UTF-8 must be an InputError;
//  - odd: a chat record (JSON) -> render_chat_prompt -> encode -> decode == the prompt.
// No crash, no hang (the BPE merge is O(n log n) per word, the regexes JIT-compiled PCRE2).
// Expected rejections are ds4r::InputError.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "ds4r/error.h"
#include "ds4r/text.h"
#include "ds4r/tokenizer.h"
#include "text/utf8_check.h"

namespace {

// tests/data (DS4R_TEST_DATA from tests/fuzz/CMakeLists.txt, else next to this file).
std::string test_data_dir() {
#ifdef DS4R_TEST_DATA
    return DS4R_TEST_DATA;
#else
    std::string f = __FILE__;  // .../tests/fuzz/fuzz_encode.cpp
    return f.substr(0, f.rfind('/')) + "/../data";
#endif
}

std::string gunzip(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) {
        std::fprintf(stderr, "fuzz_encode: cannot open %s\n", path.c_str());
        std::abort();
    }
    std::string out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    gzclose(f);
    return out;
}

struct Setup {
    ds4r::Tokenizer tok;
    std::unique_ptr<ds4r::TextEncoder> enc;
    Setup()
        : tok(ds4r::Tokenizer::parse(gunzip(test_data_dir() + "/tokenizer/deepseek-v41-tokenizer.json.gz"),
                                     "deepseek-v41-tokenizer.json")),
          enc(std::make_unique<ds4r::TextEncoder>(tok)) {}
};

Setup* setup = nullptr;

}  // namespace

// The tokenizer is loaded once, before fuzzing starts (not counted against -timeout).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
    setup = new Setup();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const bool chat = data[0] & 1;
    std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    if (!chat) {
        const bool valid = ds4r::text::first_invalid_utf8(body) == std::string_view::npos;
        try {
            const auto ids = setup->enc->encode(body);
            if (!valid) __builtin_trap();  // invalid UTF-8 must be refused
            if (setup->tok.decode(ids) != body) __builtin_trap();
        } catch (const ds4r::InputError&) {
            if (valid) __builtin_trap();
        }
        return 0;
    }
    try {
        const std::string prompt = ds4r::render_chat_prompt(body);
        const auto ids = setup->enc->encode(prompt);
        if (setup->tok.decode(ids) != prompt) __builtin_trap();
    } catch (const ds4r::InputError&) {
    }
    return 0;
}
