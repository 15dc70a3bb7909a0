// The backend factory behind --backend (score, bench, selftest, the tests).
#include "ds4r/backend.h"
#include "ds4r/error.h"
#include "ds4r/log.h"

namespace ds4r {

std::unique_ptr<Backend> select_backend(const std::string& kind, int device, double gpu_memory_gb) {
    if (kind == "cpu") return make_cpu_backend();
    std::string why;
    if (kind == "cuda" || kind == "auto") {
        auto be = make_cuda_backend(device, &why, gpu_memory_gb);
        if (be) return be;
        if (kind == "cuda") throw RuntimeError("--backend cuda: " + why);
        log_info("no usable GPU (" + why + "); using the CPU reference backend");
        return make_cpu_backend();
    }
    throw InputError("--backend must be auto, cuda or cpu, not '" + kind + "'");
}

}  // namespace ds4r
