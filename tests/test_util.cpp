#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace ds4r::test {

namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;
void cleanup() {
    if (!g_dirs) return;
    if (!std::getenv("DS4R_KEEP_TEMP"))
        for (const auto& d : *g_dirs) {
            std::error_code ec;
            std::filesystem::remove_all(d, ec);
        }
}
}  // namespace

std::string data_dir() {
    return DS4R_TEST_DATA;
}
std::string binary_path() {
    return DS4R_BINARY;
}
std::string golden_model_dir() {
    return data_dir() + "/tiny-a/model";
}

std::string copy_golden_model(const std::string& tag) {
    const std::string d = temp_dir(tag) + "/model";
    std::filesystem::copy(golden_model_dir(), d, std::filesystem::copy_options::recursive);
    return d;
}

std::string temp_dir(const std::string& tag) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_dirs) {
        g_dirs = new std::vector<std::string>();
        std::atexit(cleanup);
    }
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/ds4r-" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* d = mkdtemp(buf.data());
    if (!d) return {};
    g_dirs->push_back(d);
    return d;
}

int run_command(const std::string& cmd, std::string* output) {
    std::string full = cmd + " 2>&1";
    FILE* p = popen(full.c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    std::string out;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int st = pclose(p);
    if (output) *output = out;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    return -1;
}

}  // namespace ds4r::test
