// Host error policy (docs/DESIGN.md section 2 and 6): every failure is an exception that carries the
// source location and a message naming the file / line / tensor and what was expected. `main`
// maps the kind to the process exit code. Nothing in a parser aborts.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ds4r {

// Exit codes of the command line tool (docs/DESIGN.md section 2).
enum class ErrorKind : int {
    Runtime = 1,     // runtime failure (I/O error, CUDA error, out of memory, ...)
    Usage = 2,       // bad command line or bad input file (tokens.jsonl)
    Checkpoint = 3,  // missing / corrupt / inconsistent model files
};

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, std::string message, const char* src_file = nullptr, int src_line = 0);
    ErrorKind kind() const noexcept { return kind_; }
    int exit_code() const noexcept { return static_cast<int>(kind_); }
    // Source location of the throw (for --verbose logs); empty when unknown.
    const std::string& where() const noexcept { return where_; }

private:
    ErrorKind kind_;
    std::string where_;
};

// Bad input data: tokens.jsonl lines, command line values. Exit code 2.
class InputError : public Error {
public:
    InputError(std::string message, const char* f = nullptr, int l = 0)
        : Error(ErrorKind::Usage, std::move(message), f, l) {}
};

// A checkpoint problem: the message names the file and, where known, the tensor. Exit code 3.
class CheckpointError : public Error {
public:
    CheckpointError(std::string message, const char* f = nullptr, int l = 0)
        : Error(ErrorKind::Checkpoint, std::move(message), f, l) {}
};

// Anything else that stops a run (I/O, CUDA, allocation). Exit code 1.
class RuntimeError : public Error {
public:
    RuntimeError(std::string message, const char* f = nullptr, int l = 0)
        : Error(ErrorKind::Runtime, std::move(message), f, l) {}
};

// The backend ran out of memory (an allocation failed or the GPU budget is spent). The pass runner
// shrinks its chunks and runs the pass again (docs/DESIGN.md section 6); elsewhere it stops the run (exit 1).
class OutOfMemoryError : public RuntimeError {
public:
    OutOfMemoryError(std::string message, const char* f = nullptr, int l = 0)
        : RuntimeError(std::move(message), f, l) {}
};

// The same kind of error (exit code and OutOfMemoryError kept) with `context` in front of its message;
// other exceptions become RuntimeError. For errors carried across threads (a reader, a device worker).
std::exception_ptr with_context(std::exception_ptr e, const std::string& context);

// printf-style formatting into std::string (the project compiles with g++ 12: no std::format).
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// errno text for messages about files.
std::string errno_text(int err);

}  // namespace ds4r

#define DS4R_THROW(Type, ...) throw Type(::ds4r::strfmt(__VA_ARGS__), __FILE__, __LINE__)

// Internal invariant: a broken one is a bug, reported as a runtime error with its location.
#define DS4R_CHECK(cond, ...)                                                                     \
    do {                                                                                          \
        if (!(cond)) throw ::ds4r::RuntimeError(::ds4r::strfmt(__VA_ARGS__), __FILE__, __LINE__); \
    } while (0)
