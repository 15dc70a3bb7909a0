// Runtime settings that come from the environment: the one module of the product that reads it
// (src/common/settings.cpp). Settings a user needs are command-line flags (src/cli/); what is read
// here is a debugging switch or a default that users expect from their environment.
#pragma once

#include <string>

namespace ds4r {

// DS4R_PROFILE=1 (debugging switch, read once): backends time the named regions of the forward and
// `ds4replay bench` prints them (docs/PERFORMANCE.md). No effect on results.
bool profiling_enabled();

// The default of --model: $DSV41_PATH when set and not empty, else $HOME/models/DeepSeek-V4.1-Flash.
std::string default_model_dir();

// A scheduler's variable (`score --shard auto`: SLURM_ARRAY_TASK_*, JOB_COMPLETION_INDEX), nullptr
// when unset: the way job arrays pass a task its index.
const char* scheduler_env(const char* name);

}  // namespace ds4r
