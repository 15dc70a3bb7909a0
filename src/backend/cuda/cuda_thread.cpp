// The CUDA devices this process sees (score --devices all), and a worker thread's device selection.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "ds4r/backend.h"

namespace ds4r {

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver / no device: none visible (clears the sticky error)
        return 0;
    }
    return n;
}

void CudaBackend::use_on_this_thread() {
    DS4R_CUDA_CHECK(cudaSetDevice(device_));
}

}  // namespace ds4r
