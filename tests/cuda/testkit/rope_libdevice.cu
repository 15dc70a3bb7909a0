// The RoPE table with CUDA's libdevice cosf / sinf (see rope_libdevice.h).
#include <algorithm>

#include "rope_libdevice.h"
#include "rope_table_device.cuh"

namespace ds4r {

namespace kern {
namespace {
struct LibdeviceSinCos {
    __device__ __forceinline__ void operator()(float angle, float* c, float* s) const {
        *c = cosf(angle);
        *s = sinf(angle);
    }
};
}  // namespace
}  // namespace kern

void cuda_rope_table_libdevice(CudaBackend& be, double base, double factor, int64_t yarn_orig,
                               double beta_fast, double beta_slow, int64_t rd, const Tensor& table) {
    const Tensor inv_freq = be.rope_inv_freqs(base, factor, yarn_orig, beta_fast, beta_slow, rd, table);
    const int64_t n_pos = table.dim(0), half = rd / 2;
    if (n_pos == 0 || half == 0) return;
    constexpr int kThreads = 256;
    const int64_t blocks = std::min<int64_t>(kern::cdiv(n_pos * half, kThreads), 65535LL * 16);
    kern::rope_table_kernel<kern::LibdeviceSinCos>
        <<<static_cast<unsigned>(blocks), kThreads, 0, be.stream()>>>(inv_freq.ptr<float>(), n_pos, half,
                                                                      table.ptr<float>());
    DS4R_CUDA_LAUNCH_CHECK();
}

}  // namespace ds4r
