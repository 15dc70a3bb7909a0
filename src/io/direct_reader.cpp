// DirectReader: O_DIRECT reads with a buffered fallback (see direct_reader.h).
#include "io/direct_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "ds4r/error.h"
#include "ds4r/log.h"

namespace ds4r {

namespace {

std::atomic<bool> g_fallback_logged{false};

void log_fallback_once(const std::string& path, int err) {
    if (!g_fallback_logged.exchange(true))
        log_warn(
            strfmt("O_DIRECT refused for %s (%s): reading shards through the page cache (buffered pread)",
                   path.c_str(), errno_text(err).c_str()));
}

int open_or_throw(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags);
    if (fd < 0) DS4R_THROW(RuntimeError, "%s: cannot open (%s)", path.c_str(), errno_text(errno).c_str());
    return fd;
}

}  // namespace

DirectReader::DirectReader(std::string path, Mode mode) : path_(std::move(path)) {
    if (mode == Mode::Buffered) {
        buffered_fd_ = open_or_throw(path_, O_RDONLY | O_CLOEXEC);
        return;
    }
    refuse_for_test_ = mode == Mode::RefuseDirectForTest;
    direct_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (direct_fd_ >= 0) {
        direct_.store(true, std::memory_order_release);
        return;
    }
    const int err = errno;
    if (err != EINVAL)
        DS4R_THROW(RuntimeError, "%s: cannot open (%s)", path_.c_str(), errno_text(err).c_str());
    log_fallback_once(path_, err);
    buffered_fd_ = open_or_throw(path_, O_RDONLY | O_CLOEXEC);
}

DirectReader::~DirectReader() {
    if (direct_fd_ >= 0) ::close(direct_fd_);
    if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

void DirectReader::fall_back(int err) {
    std::lock_guard<std::mutex> lk(fallback_mu_);
    if (!direct_.load(std::memory_order_acquire)) return;  // another thread switched already
    log_fallback_once(path_, err);
    // The O_DIRECT descriptor stays open: other threads may be inside a pread on it.
    buffered_fd_ = open_or_throw(path_, O_RDONLY | O_CLOEXEC);
    direct_.store(false, std::memory_order_release);
}

uint64_t DirectReader::file_size() const {
    struct stat st {};
    // direct_fd_ is fixed after construction; when it is -1 the buffered one was opened there.
    if (::fstat(direct_fd_ >= 0 ? direct_fd_ : buffered_fd_, &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_size);
}

size_t DirectReader::read_aligned(void* buf, uint64_t offset, size_t len, bool* direct) {
    DS4R_CHECK(reinterpret_cast<uintptr_t>(buf) % kAlign == 0 && offset % kAlign == 0 && len % kAlign == 0,
               "%s: unaligned read request (buffer %p, offset %llu, %zu bytes)", path_.c_str(), buf,
               (unsigned long long)offset, len);
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = 0;
    bool all_direct = true;
    while (done < len) {
        // Acquire: a false here makes the buffered descriptor written before it visible.
        const bool d = direct_.load(std::memory_order_acquire);
        all_direct = all_direct && d;
        ssize_t r;
        if (d && refuse_for_test_) {
            r = -1;
            errno = EINVAL;
        } else {
            r = ::pread(d ? direct_fd_ : buffered_fd_, p + done, len - done,
                        static_cast<off_t>(offset + done));
        }
        if (r < 0) {
            const int err = errno;
            if (err == EINTR) continue;
            if (err == EINVAL && d) {  // the file system takes O_DIRECT at open but not at read
                fall_back(err);
                continue;
            }
            DS4R_THROW(RuntimeError, "%s: read of %zu bytes at offset %llu failed (%s)", path_.c_str(),
                       len - done, (unsigned long long)(offset + done), errno_text(err).c_str());
        }
        if (r == 0) break;  // end of file
        done += static_cast<size_t>(r);
        // O_DIRECT: a short read that is not a block multiple means the end of the file.
        if (d && done % kAlign != 0) break;
    }
    if (direct) *direct = all_direct;
    return done;
}

}  // namespace ds4r
