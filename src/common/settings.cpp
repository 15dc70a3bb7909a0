// The environment, read in one place (see include/ds4r/settings.h).
#include "ds4r/settings.h"

#include <cstdlib>

namespace ds4r {

bool profiling_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("DS4R_PROFILE");
        return e && *e && std::string(e) != "0";
    }();
    return on;
}

std::string default_model_dir() {
    if (const char* p = std::getenv("DSV41_PATH"); p && *p) return p;
    const char* home = std::getenv("HOME");
    return std::string(home ? home : ".") + "/models/DeepSeek-V4.1-Flash";
}

const char* scheduler_env(const char* name) { return std::getenv(name); }

}  // namespace ds4r
