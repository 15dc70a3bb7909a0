// `ds4replay selftest`: builds a tiny model in a temporary directory, scores it and checks known
// quantization answers, sane distributions, determinism, batch invariance and (on CUDA) agreement
// with the CPU reference backend. Prints a short report; returns the exit code (0 pass, 1 fail).
#pragma once

#include <cstdio>
#include <string>

namespace ds4r {

struct SelftestOptions {
    std::string backend = "auto";
    int device = 0;
    std::string kernels = "auto";  // CUDA GEMM kernels (--kernels, ds4r/backend.h)
    std::string keep_dir;  // keep the tiny model here instead of a removed temp dir
};

int run_selftest(const SelftestOptions& opt, std::FILE* out);

}  // namespace ds4r
