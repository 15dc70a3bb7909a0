// The number of CUDA devices this process sees (score --devices all).
#include <cuda_runtime.h>

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

}  // namespace ds4r
