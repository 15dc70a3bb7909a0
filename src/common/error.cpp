#include "ds4r/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ds4r/plural.h"

namespace ds4r {

Error::Error(ErrorKind kind, std::string message, const char* src_file, int src_line)
    : std::runtime_error(std::move(message)), kind_(kind) {
    if (src_file) where_ = std::string(src_file) + ":" + std::to_string(src_line);
}

std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out;
    if (n > 0) {
        std::vector<char> buf(static_cast<size_t>(n) + 1);
        std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
        out.assign(buf.data(), static_cast<size_t>(n));
    }
    va_end(ap2);
    return out;
}

std::string plural(int64_t n, const std::string& one, const std::string& many) {
    return std::to_string(n) + " " + (n == 1 ? one : many.empty() ? one + "s" : many);
}

std::string errno_text(int err) {
    char buf[256];
    // GNU strerror_r returns a char* that may or may not point into buf.
    const char* s = strerror_r(err, buf, sizeof buf);
    return std::string(s);
}

std::exception_ptr with_context(std::exception_ptr e, const std::string& context) {
    try {
        std::rethrow_exception(e);
    } catch (const OutOfMemoryError& err) {
        return std::make_exception_ptr(OutOfMemoryError(context + ": " + err.what()));
    } catch (const Error& err) {
        const std::string msg = context + ": " + err.what();
        switch (err.kind()) {
            case ErrorKind::Checkpoint:
                return std::make_exception_ptr(CheckpointError(msg));
            case ErrorKind::Usage:
                return std::make_exception_ptr(InputError(msg));
            case ErrorKind::Runtime:
                break;
        }
        return std::make_exception_ptr(RuntimeError(msg));
    } catch (const std::bad_alloc&) {
        return std::make_exception_ptr(RuntimeError(context + ": out of host memory"));
    } catch (const std::exception& err) {
        return std::make_exception_ptr(RuntimeError(context + ": " + err.what()));
    } catch (...) {
        return std::make_exception_ptr(RuntimeError(context + ": unknown error"));
    }
}

}  // namespace ds4r
