#include "ds4r/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>

namespace ds4r {

namespace {
std::atomic<LogLevel> g_level{LogLevel::Info};

spdlog::logger& logger() {
    static std::shared_ptr<spdlog::logger> l = [] {
        auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
        auto lg = std::make_shared<spdlog::logger>("ds4replay", sink);
        lg->set_pattern("[%H:%M:%S.%e] %^%l%$: %v");
        lg->set_level(spdlog::level::trace);
        lg->flush_on(spdlog::level::trace);
        return lg;
    }();
    return *l;
}
bool on(LogLevel l) {
    return static_cast<int>(l) >= static_cast<int>(g_level.load());
}
}  // namespace

void log_set_level(LogLevel level) {
    g_level = level;
}
LogLevel log_level() {
    return g_level;
}
void log_debug(const std::string& m) {
    if (on(LogLevel::Debug)) logger().debug("{}", m);
}
void log_info(const std::string& m) {
    if (on(LogLevel::Info)) logger().info("{}", m);
}
void log_warn(const std::string& m) {
    if (on(LogLevel::Warn)) logger().warn("{}", m);
}
void log_error(const std::string& m) {
    if (on(LogLevel::Error)) logger().error("{}", m);
}

}  // namespace ds4r
