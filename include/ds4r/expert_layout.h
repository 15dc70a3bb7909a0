// The layouts of a backend's prepared routed experts (ds4r/backend.h Backend::prepare_experts; chosen by
// `--prepared-experts`, ds4r/replay.h plan_prepared_experts).
#pragma once

#include <cstdint>

namespace ds4r {

// Narrowest first: none, one byte per weight (CudaBackend: e5m2), two bytes per weight (CudaBackend: fp16
// with the scales folded in).
enum class ExpertLayout : uint8_t { None = 0, E5m2 = 1, F16 = 2 };
// `--prepared-experts auto`: the widest layout it may take (docs/PERFORMANCE.md, "Prepared fp16 experts").
// e5m2: on an H200 the fp16 copy's grouped GEMMs are 9-10% faster alone, but at workload b's layers that
// gain (0.014 s a pass) is what the twice larger copy costs to make (0.018 s): no net gain yet.
constexpr ExpertLayout kAutoExpertLayout = ExpertLayout::E5m2;
const char* expert_layout_name(ExpertLayout layout);  // "off", "e5m2", "fp16"

}  // namespace ds4r
