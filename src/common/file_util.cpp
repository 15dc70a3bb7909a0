#include "ds4r/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "ds4r/error.h"

namespace ds4r {

FileHandle::FileHandle(const std::string& path, int flags, int mode, bool checkpoint) : path_(path) {
    do {
        fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) {
        std::string msg = strfmt("%s: cannot open (%s)", path.c_str(), errno_text(errno).c_str());
        if (checkpoint) throw CheckpointError(msg);
        throw RuntimeError(msg);
    }
}

FileHandle::~FileHandle() {
    if (fd_ >= 0) ::close(fd_);
}

FileHandle::FileHandle(FileHandle&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) {
    o.fd_ = -1;
}

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.fd_;
        path_ = std::move(o.path_);
        o.fd_ = -1;
    }
    return *this;
}

uint64_t FileHandle::size() const {
    struct stat st;
    if (::fstat(fd_, &st) != 0)
        throw RuntimeError(strfmt("%s: fstat failed (%s)", path_.c_str(), errno_text(errno).c_str()));
    return static_cast<uint64_t>(st.st_size);
}

size_t FileHandle::pread_some(void* buf, size_t n, uint64_t offset) const {
    size_t done = 0;
    auto* p = static_cast<uint8_t*>(buf);
    while (done < n) {
        ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            throw RuntimeError(strfmt("%s: read of %zu bytes at offset %llu failed (%s)", path_.c_str(), n,
                                      (unsigned long long)offset, errno_text(errno).c_str()));
        }
        if (r == 0) break;
        done += static_cast<size_t>(r);
    }
    return done;
}

void FileHandle::pread_exact(void* buf, size_t n, uint64_t offset) const {
    size_t got = pread_some(buf, n, offset);
    if (got != n)
        throw RuntimeError(strfmt("%s: unexpected end of file reading %zu bytes at offset %llu (got %zu)",
                                  path_.c_str(), n, (unsigned long long)offset, got));
}

void FileHandle::write_all(const void* buf, size_t n) {
    const auto* p = static_cast<const uint8_t*>(buf);
    while (n > 0) {
        ssize_t w = ::write(fd_, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw RuntimeError(strfmt("%s: write failed (%s)", path_.c_str(), errno_text(errno).c_str()));
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void FileHandle::fsync_or_throw() {
    if (::fsync(fd_) != 0)
        throw RuntimeError(strfmt("%s: fsync failed (%s)", path_.c_str(), errno_text(errno).c_str()));
}

void FileHandle::close() {
    if (fd_ >= 0) {
        int r = ::close(fd_);
        fd_ = -1;
        if (r != 0 && errno != EINTR)
            throw RuntimeError(strfmt("%s: close failed (%s)", path_.c_str(), errno_text(errno).c_str()));
    }
}

std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_bytes) {
    FileHandle f(path, O_RDONLY);
    uint64_t n = f.size();
    if (n > max_bytes)
        throw RuntimeError(strfmt("%s: file is %llu bytes, more than the %zu allowed", path.c_str(),
                                  (unsigned long long)n, max_bytes));
    std::vector<uint8_t> out(static_cast<size_t>(n));
    if (n) f.pread_exact(out.data(), out.size(), 0);
    return out;
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
    auto v = read_whole_file(path, max_bytes);
    return std::string(v.begin(), v.end());
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path),
      tmp_(path + ".tmp." + std::to_string(::getpid())),
      fh_(tmp_, O_WRONLY | O_CREAT | O_TRUNC, 0644) {}

AtomicFileWriter::~AtomicFileWriter() {
    if (!done_) {
        fh_ = FileHandle();
        ::unlink(tmp_.c_str());
    }
}

void AtomicFileWriter::write(const void* data, size_t n) {
    fh_.write_all(data, n);
}

void AtomicFileWriter::commit() {
    fh_.fsync_or_throw();
    fh_.close();
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
        throw RuntimeError(
            strfmt("%s: rename from %s failed (%s)", path_.c_str(), tmp_.c_str(), errno_text(errno).c_str()));
    done_ = true;
    fsync_parent_dir(path_);
}

void fsync_parent_dir(const std::string& path) {
    std::string dir = ".";
    size_t p = path.find_last_of('/');
    if (p != std::string::npos) dir = p == 0 ? "/" : path.substr(0, p);
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

uint64_t mem_available_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    uint64_t val = 0;
    while (f >> key >> val >> unit)
        if (key == "MemAvailable:") return val * 1024;
    return 0;
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dirs(const std::string& path) {
    if (path.empty() || is_directory(path)) return;
    size_t p = path.find_last_of('/');
    if (p != std::string::npos && p > 0) make_dirs(path.substr(0, p));
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
        throw RuntimeError(
            strfmt("%s: cannot create directory (%s)", path.c_str(), errno_text(errno).c_str()));
}

std::string path_join(const std::string& a, const std::string& b) {
    if (a.empty() || (!b.empty() && b[0] == '/')) return b;
    if (a.back() == '/') return a + b;
    return a + "/" + b;
}

uint64_t for_each_line(const FileHandle& f, const std::function<void(const std::string&, int64_t)>& fn) {
    const uint64_t size = f.size();
    std::string chunk(size_t{4} << 20, '\0'), line;
    uint64_t off = 0, line_start = 0;
    int64_t line_no = 0;
    while (off < size) {
        const size_t n = f.pread_some(chunk.data(),
                                      static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - off)), off);
        if (n == 0) break;
        size_t p = 0;
        while (p < n) {
            const void* nl = std::memchr(chunk.data() + p, '\n', n - p);
            const size_t take =
                nl ? static_cast<size_t>(static_cast<const char*>(nl) - (chunk.data() + p)) : n - p;
            line.append(chunk.data() + p, take);
            p += take;
            if (!nl) break;
            ++p;
            fn(line, ++line_no);
            line.clear();
            line_start = off + p;
        }
        off += n;
    }
    return line_start;
}

}  // namespace ds4r
