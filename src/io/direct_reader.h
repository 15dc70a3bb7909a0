// Large aligned reads from one checkpoint shard for the weight prefetcher (docs/DESIGN.md section 8: reads at
// the disk's speed need O_DIRECT, which bypasses the page cache and wants the file offset, the length
// and the buffer address aligned to the logical block size; 4 KiB covers every common device).
// Where the file system refuses O_DIRECT (EINVAL at open or at the first read, e.g. some tmpfs or
// network file systems) the reader falls back to buffered pread and logs it once per process.
// Thread safety: read_aligned() may be called from several threads at once (positional reads on one
// descriptor); the fallback switches every thread to the buffered descriptor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace ds4r {

class DirectReader {
public:
    static constexpr size_t kAlign = 4096;  // offsets, lengths and buffers of read_aligned()

    enum class Mode {
        Auto,      // O_DIRECT, buffered where refused
        Buffered,  // buffered pread only
        // Tests only: behave as if the file system refused O_DIRECT at the first read (EINVAL), to
        // exercise the fallback on file systems that accept it.
        RefuseDirectForTest,
    };

    // Opens `path` (RuntimeError naming it if it cannot be opened).
    DirectReader(std::string path, Mode mode);
    ~DirectReader();
    DirectReader(const DirectReader&) = delete;
    DirectReader& operator=(const DirectReader&) = delete;

    // Reads up to `len` bytes at `offset` into `buf`; all three kAlign-aligned. Returns the count,
    // short only at the end of the file. RuntimeError naming the file on an I/O error. When `direct`
    // is given it is set to whether every byte of this call was read with O_DIRECT.
    size_t read_aligned(void* buf, uint64_t offset, size_t len, bool* direct = nullptr);

    bool direct() const { return direct_.load(std::memory_order_acquire); }
    const std::string& path() const { return path_; }
    uint64_t file_size() const;  // current size (fstat), for error messages

private:
    // Opens the buffered descriptor (if not yet) and turns direct_ off; every thread then uses it.
    void fall_back(int err);

    std::string path_;
    int direct_fd_ = -1;    // O_DIRECT descriptor (fixed after construction; -1 when refused / not asked)
    int buffered_fd_ = -1;  // written once, before direct_ turns false (release), under fallback_mu_
    std::atomic<bool> direct_{false};
    bool refuse_for_test_ = false;
    std::mutex fallback_mu_;
};

inline uint64_t align_down(uint64_t x, uint64_t a) {
    return x / a * a;
}
inline uint64_t align_up(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

}  // namespace ds4r
