// The backend factory behind --backend (score, bench, selftest, the tests).
#include "ds4r/backend.h"
#include "ds4r/error.h"
#include "ds4r/log.h"

namespace ds4r {

GpuKernels parse_gpu_kernels(const std::string& s) {
    if (s == "auto") return GpuKernels::Auto;
    if (s == "portable") return GpuKernels::Portable;
    if (s == "hopper") return GpuKernels::Hopper;
    if (s == "hopper-fp8") return GpuKernels::HopperFp8Partials;
    throw InputError("--kernels must be auto, portable, hopper or hopper-fp8, not '" + s + "'");
}

std::unique_ptr<Backend> select_backend(const std::string& kind, int device, double gpu_memory_gb,
                                        GpuKernels kernels) {
    if (kind == "cpu") return make_cpu_backend();
    std::string why;
    if (kind == "cuda" || kind == "auto") {
        auto be = make_cuda_backend(device, &why, gpu_memory_gb, kernels);
        if (be) return be;
        if (kind == "cuda") throw RuntimeError("--backend cuda: " + why);
        log_info("no usable GPU (" + why + "); using the CPU reference backend");
        return make_cpu_backend();
    }
    throw InputError("--backend must be auto, cuda or cpu, not '" + kind + "'");
}

}  // namespace ds4r
