// Built when the CUDA backend is compiled out (no nvcc): --backend cuda reports why.
#include "ds4r/backend.h"
#include "ds4r/kernel_bench.h"

namespace ds4r {

std::unique_ptr<Backend> make_cuda_backend(int, std::string* why, double, GpuKernels) {
    if (why)
        *why =
            "this ds4replay was built without the CUDA backend (-DDS4R_CUDA=OFF, or no nvcc at configure "
            "time)";
    return nullptr;
}

int cuda_device_count() {
    return 0;
}

std::unique_ptr<KernelBench> make_kernel_bench(Backend&) {
    return nullptr;
}

}  // namespace ds4r
