// Logging to stderr (stdout carries results only, docs/DESIGN.md section 2). Thin wrapper over spdlog so
// that spdlog/fmt stay inside src/common/log.cpp.
#pragma once

#include <string>

namespace ds4r {

enum class LogLevel { Debug, Info, Warn, Error, Off };

void log_set_level(LogLevel level);
LogLevel log_level();
void log_debug(const std::string& msg);
void log_info(const std::string& msg);
void log_warn(const std::string& msg);
void log_error(const std::string& msg);

}  // namespace ds4r
