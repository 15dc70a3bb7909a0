// Diagnostic for the CUDA test suite (cuda_rope_test), not used by the model.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace ds4r {

// CudaBackend::rope_table's table F32 [n_pos, rd/2, 2] (same inverse frequencies), but with CUDA's
// libdevice cosf / sinf instead of the glibc port: measures on the GPU how far CUDA's own functions
// are from the golden tables (docs/MODEL.md 8.3 asked for them; cuda_rope_test reports the count).
void cuda_rope_table_libdevice(CudaBackend& be, double base, double factor, int64_t yarn_orig,
                               double beta_fast, double beta_slow, int64_t rd, const Tensor& table);

}  // namespace ds4r
