// DirectReader: O_DIRECT reads with a buffered fallback (see direct_reader.h).
#include "io/direct_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "ds4r/error.h"
#include "ds4r/log.h"

namespace ds4r {

namespace {

std::atomic<bool> g_fallback_logged{false};

void log_fallback_once(const std::string& path, int err) {
    if (!g_fallback_logged.exchange(true))
        log_warn(strfmt("O_DIRECT refused for %s (%s): reading shards through the page cache (buffered pread)",
                        path.c_str(), errno_text(err).c_str()));
}

}  // namespace

DirectReader::DirectReader(std::string path, Mode mode) : path_(std::move(path)) {
    if (mode == Mode::Buffered) {
        open_buffered();
        return;
    }
    refuse_for_test_ = mode == Mode::RefuseDirectForTest;
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ >= 0) {
        direct_ = true;
        return;
    }
    const int err = errno;
    if (err != EINVAL) DS4R_THROW(RuntimeError, "%s: cannot open (%s)", path_.c_str(), errno_text(err).c_str());
    log_fallback_once(path_, err);
    open_buffered();
}

DirectReader::~DirectReader() {
    if (fd_ >= 0) ::close(fd_);
}

void DirectReader::open_buffered() {
    if (fd_ >= 0) ::close(fd_);
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) DS4R_THROW(RuntimeError, "%s: cannot open (%s)", path_.c_str(), errno_text(errno).c_str());
}

uint64_t DirectReader::file_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_size);
}

size_t DirectReader::read_aligned(void* buf, uint64_t offset, size_t len) {
    DS4R_CHECK(reinterpret_cast<uintptr_t>(buf) % kAlign == 0 && offset % kAlign == 0 && len % kAlign == 0,
               "%s: unaligned read request (buffer %p, offset %llu, %zu bytes)", path_.c_str(), buf,
               (unsigned long long)offset, len);
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = 0;
    while (done < len) {
        ssize_t r;
        if (direct_ && refuse_for_test_) {
            r = -1;
            errno = EINVAL;
        } else {
            r = ::pread(fd_, p + done, len - done, static_cast<off_t>(offset + done));
        }
        if (r < 0) {
            const int err = errno;
            if (err == EINTR) continue;
            if (err == EINVAL && direct_) {  // the file system takes O_DIRECT at open but not at read
                log_fallback_once(path_, err);
                open_buffered();
                continue;
            }
            DS4R_THROW(RuntimeError, "%s: read of %zu bytes at offset %llu failed (%s)", path_.c_str(), len - done,
                       (unsigned long long)(offset + done), errno_text(err).c_str());
        }
        if (r == 0) break;  // end of file
        done += static_cast<size_t>(r);
        // O_DIRECT: a short read that is not a block multiple means the end of the file.
        if (direct_ && done % kAlign != 0) break;
    }
    return done;
}

}  // namespace ds4r
