// Small POSIX file helpers with errors that name the file. Used by every module that touches disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ds4r {

// RAII file descriptor.
class FileHandle {
public:
    FileHandle() = default;
    // Opens with open(2) flags; throws RuntimeError (or CheckpointError when `checkpoint` is true)
    // naming the path and errno text.
    FileHandle(const std::string& path, int flags, int mode = 0644, bool checkpoint = false);
    ~FileHandle();
    FileHandle(FileHandle&& o) noexcept;
    FileHandle& operator=(FileHandle&& o) noexcept;
    FileHandle(const FileHandle&) = delete;
    FileHandle& operator=(const FileHandle&) = delete;

    int fd() const { return fd_; }
    const std::string& path() const { return path_; }
    bool is_open() const { return fd_ >= 0; }
    uint64_t size() const;  // fstat size
    // Reads exactly `n` bytes at `offset` (retrying short reads and EINTR); throws on EOF/error.
    void pread_exact(void* buf, size_t n, uint64_t offset) const;
    // Reads up to `n` bytes; returns the count (short only at end of file).
    size_t pread_some(void* buf, size_t n, uint64_t offset) const;
    void write_all(const void* buf, size_t n);
    void fsync_or_throw();
    void close();

private:
    int fd_ = -1;
    std::string path_;
};

// Whole file into memory; throws RuntimeError if it is missing or larger than max_bytes.
std::vector<uint8_t> read_whole_file(const std::string& path, size_t max_bytes);
// Calls fn(line, line_number) for every complete line of `f` (1-based numbers, the '\n' removed), read
// in 4 MiB pieces; returns the offset just past the last newline, where a partial last line (a run
// killed mid-write) starts.
uint64_t for_each_line(const FileHandle& f, const std::function<void(const std::string&, int64_t)>& fn);
std::string read_text_file(const std::string& path, size_t max_bytes);

// Writes to "<path>.tmp.<pid>", then fsync + rename + fsync(dir) on commit(). If destroyed without
// commit() the temp file is removed: a reader never sees a half-written file.
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(const std::string& path);
    ~AtomicFileWriter();
    void write(const void* data, size_t n);
    void write(const std::string& s) { write(s.data(), s.size()); }
    void commit();

private:
    std::string path_, tmp_;
    FileHandle fh_;
    bool done_ = false;
};

// fsync of the directory holding `path` (after a rename or a create).
void fsync_parent_dir(const std::string& path);
bool file_exists(const std::string& path);
// MemAvailable of /proc/meminfo in bytes (0 when unknown): what sizes passes and in-memory I/O buffers.
uint64_t mem_available_bytes();
bool is_directory(const std::string& path);
// mkdir -p; throws RuntimeError naming the path.
void make_dirs(const std::string& path);
std::string path_join(const std::string& a, const std::string& b);

}  // namespace ds4r
