// Shared by the encode_*_test.cpp files: the V4.1 tokenizer of tests/data/tokenizer/ (gzipped,
// read with zlib), loaded once, and its encoder.
#pragma once

#include <zlib.h>

#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ds4r/text.h"
#include "ds4r/tokenizer.h"
#include "test_util.h"

namespace ds4r::test {

inline std::string tokenizer_data_dir() {
    return data_dir() + "/tokenizer";
}

inline std::string gunzip_file(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error("cannot open " + path);
    std::string out;
    std::vector<char> buf(1 << 20);
    for (;;) {
        const int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
        if (n < 0) {
            gzclose(f);
            throw std::runtime_error("gzip error in " + path);
        }
        if (n == 0) break;
        out.append(buf.data(), static_cast<size_t>(n));
    }
    gzclose(f);
    return out;
}

// The decompressed V4.1 tokenizer.json, written once into a temporary file (for the CLI tests).
inline const std::string& v41_tokenizer_json_path() {
    static const std::string path = [] {
        const std::string p = temp_dir("v41-tokenizer") + "/tokenizer.json";
        std::ofstream f(p, std::ios::binary);
        f << gunzip_file(tokenizer_data_dir() + "/deepseek-v41-tokenizer.json.gz");
        if (!f) throw std::runtime_error("cannot write " + p);
        return p;
    }();
    return path;
}

inline const Tokenizer& v41_tokenizer() {
    static const Tokenizer tok = Tokenizer::parse(
        gunzip_file(tokenizer_data_dir() + "/deepseek-v41-tokenizer.json.gz"), "deepseek-v41-tokenizer.json");
    return tok;
}

inline TextEncoder& v41_encoder() {
    static TextEncoder enc(v41_tokenizer());
    return enc;
}

inline std::vector<std::string> read_lines(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(f, line))
        if (!line.empty()) out.push_back(line);
    return out;
}

}  // namespace ds4r::test
