// The layouts of a backend's prepared routed experts (ds4r/backend.h Backend::prepare_experts; chosen by
// `--prepared-experts`, ds4r/replay.h plan_prepared_experts).
#pragma once

#include <cstdint>

namespace ds4r {

// Narrowest first: none, one byte per weight (CudaBackend: e5m2), two bytes per weight (CudaBackend: fp16
// with the scales folded in).
enum class ExpertLayout : uint8_t { None = 0, E5m2 = 1, F16 = 2 };
// `--prepared-experts auto`: the widest layout it may take (docs/PERFORMANCE.md, "Prepared fp16 experts" and
// "A by TMA"). fp16: on an H200 its grouped GEMMs (A and B by TMA) run 1.5x the e5m2 ones, and at workload
// b's layers they save 0.18 s a pass against 0.02 s more to make the copy (the planner still takes e5m2, or
// none, where the fp16 copy would pass half of the memory left for the attention state).
constexpr ExpertLayout kAutoExpertLayout = ExpertLayout::F16;
const char* expert_layout_name(ExpertLayout layout);  // "off", "e5m2", "fp16"

}  // namespace ds4r
