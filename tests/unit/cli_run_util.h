// Helpers for the tests that run the ds4replay binary on the golden tiny-a checkpoint (score CLI,
// resume / kill, progress): files in and out, and a child process with its own stdout / stderr.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace ds4r::test {

inline std::string tiny_model_dir() {
    return golden_model_dir();
}

inline std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw std::runtime_error("cannot write " + path);
}

// Complete lines (each ended by '\n'), without their newline; *tail receives bytes after the last '\n'.
inline std::vector<std::string> split_lines(const std::string& text, std::string* tail = nullptr) {
    std::vector<std::string> out;
    size_t pos = 0;
    for (;;) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) break;
        out.push_back(text.substr(pos, nl - pos));
        pos = nl + 1;
    }
    if (tail) *tail = text.substr(pos);
    return out;
}

// The fields of one CSV line (RFC 4180: quoted fields may hold commas and doubled quotes); an unclosed
// quote or a quote inside an unquoted field throws.
inline std::vector<std::string> split_csv_line(const std::string& line) {
    std::vector<std::string> fields(1);
    size_t i = 0;
    bool field_start = true;
    while (i < line.size()) {
        const char c = line[i];
        if (field_start && c == '"') {
            const size_t start = i++;
            for (;;) {
                if (i >= line.size())
                    throw std::runtime_error("unclosed quote at byte " + std::to_string(start));
                if (line[i] == '"') {
                    if (i + 1 < line.size() && line[i + 1] == '"') {
                        fields.back() += '"';
                        i += 2;
                        continue;
                    }
                    ++i;
                    break;
                }
                fields.back() += line[i++];
            }
            if (i < line.size() && line[i] != ',') throw std::runtime_error("text after a closing quote");
            field_start = false;
            continue;
        }
        if (c == ',') {
            fields.emplace_back();
            field_start = true;
        } else {
            if (c == '"') throw std::runtime_error("quote inside an unquoted field");
            fields.back() += c;
            field_start = false;
        }
        ++i;
    }
    return fields;
}

inline std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// `ds4replay <args>` through the shell; stdout and stderr together into *out. Returns the exit code.
inline int run_ds4replay(const std::string& args, std::string* out) {
    return run_command(shell_quote(binary_path()) + " " + args, out);
}

// A ds4replay child process: stdout and stderr go to files; the test can signal it and wait.
class Child {
public:
    Child(const std::vector<std::string>& args, const std::string& stdout_path,
          const std::string& stderr_path) {
        // Everything the child needs is prepared before fork(): after it only async-signal-safe calls.
        std::vector<std::string> argv_s{binary_path()};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : argv_s) argv.push_back(a.data());
        argv.push_back(nullptr);
        const int out_fd = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        const int err_fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (out_fd < 0 || err_fd < 0)
            throw std::runtime_error("cannot create " + stdout_path + " / " + stderr_path);
        pid_ = ::fork();
        if (pid_ == 0) {
            if (::dup2(out_fd, STDOUT_FILENO) < 0 || ::dup2(err_fd, STDERR_FILENO) < 0) ::_exit(126);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        ::close(out_fd);
        ::close(err_fd);
        if (pid_ < 0) throw std::runtime_error("fork failed");
    }
    ~Child() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            int st;
            ::waitpid(pid_, &st, 0);
        }
    }
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;
    void signal(int sig) { ::kill(pid_, sig); }
    // Returns true when the child had already exited (the signal came too late).
    bool exited_now() {
        if (reaped_) return true;
        int st;
        pid_t r = ::waitpid(pid_, &st, WNOHANG);
        if (r == pid_) {
            reaped_ = true;
            status_ = st;
            return true;
        }
        return false;
    }
    // Waits; returns the exit code, or 128 + signal number when killed by a signal.
    int wait() {
        if (!reaped_) {
            int st;
            while (::waitpid(pid_, &st, 0) < 0) {
            }
            reaped_ = true;
            status_ = st;
        }
        if (WIFEXITED(status_)) return WEXITSTATUS(status_);
        if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
        return -1;
    }

private:
    pid_t pid_ = -1;
    bool reaped_ = false;
    int status_ = 0;
};

inline void sleep_ms(double ms) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

}  // namespace ds4r::test
