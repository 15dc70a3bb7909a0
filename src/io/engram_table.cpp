// Host-side gather of Engram table rows (MODEL.md 4.8 step 1). A table is far larger than any
// device (layer 1: 384,006,168 rows x 256 fp8 = 98 GB), and a forward reads only s x 24 rows of
// it, so the shard is mapped read-only with random-access advice and the few rows are
// dequantized on the host: bf16( e4m3(row[d]) * 2^(scale[d / 32] - 127) ), the product in fp32
// as the reference does it (exact for normal values; the bf16 cast then rounds only subnormals).
// Where mmap is not possible (or DS4R_ENGRAM_PREAD=1) the rows are read with pread.
#include <fcntl.h>
#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "ds4r/engram.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/log.h"
#include "ds4r/numeric.h"

namespace ds4r {

namespace {
constexpr int64_t kScaleBlock = 32;  // one e8m0 scale per 32 elements of a row (MODEL.md 3.4)
}

struct EngramTable::Impl {
    FileHandle file;
    const uint8_t* map = nullptr;  // whole file, PROT_READ, or nullptr when using pread
    size_t map_bytes = 0;
    uint64_t weight_offset = 0;     // e4m3 [rows, head_dim]
    uint64_t scale_offset = 0;      // e8m0 [rows, head_dim / 32]
    std::array<float, 256> e4m3{};  // code -> value
    std::array<float, 256> e8m0{};  // code -> 2^(code - 127)

    ~Impl() {
        if (map) ::munmap(const_cast<uint8_t*>(map), map_bytes);
    }
};

EngramTable::EngramTable(const std::string& shard_path, uint64_t weight_offset, uint64_t scale_offset,
                         int64_t rows, int64_t head_dim)
    : impl_(std::make_unique<Impl>()), rows_(rows), head_dim_(head_dim) {
    const char* path = shard_path.c_str();
    if (rows <= 0 || head_dim <= 0 || head_dim % kScaleBlock != 0 || head_dim > (int64_t{1} << 20))
        throw CheckpointError(
            strfmt("%s: Engram table shape [%lld, %lld]: expected positive rows and a "
                   "row width that is a multiple of 32",
                   path, (long long)rows, (long long)head_dim));
    const auto urows = static_cast<uint64_t>(rows);
    const auto row_bytes = static_cast<uint64_t>(head_dim);
    const uint64_t scale_bytes = row_bytes / kScaleBlock;
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    if (urows > kMax / row_bytes || weight_offset > kMax - urows * row_bytes ||
        scale_offset > kMax - urows * scale_bytes)
        throw CheckpointError(strfmt("%s: Engram table extents overflow", path));

    Impl& im = *impl_;
    im.file = FileHandle(shard_path, O_RDONLY, 0644, /*checkpoint=*/true);
    im.weight_offset = weight_offset;
    im.scale_offset = scale_offset;
    const uint64_t file_size = im.file.size();
    const uint64_t weight_end = weight_offset + urows * row_bytes;
    const uint64_t scale_end = scale_offset + urows * scale_bytes;
    if (weight_end > file_size || scale_end > file_size)
        throw CheckpointError(strfmt(
            "%s: the Engram table needs bytes up to %llu (weight) and %llu (scale), the file has %llu", path,
            (unsigned long long)weight_end, (unsigned long long)scale_end, (unsigned long long)file_size));
    for (int c = 0; c < 256; ++c) {
        im.e4m3[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
        im.e8m0[static_cast<size_t>(c)] = e8m0_to_f32(static_cast<uint8_t>(c));
    }

    // DS4R_ENGRAM_PREAD=1 skips the mapping (file systems where mmap of a huge file misbehaves;
    // tests use it to cover the pread path).
    const char* force_pread = std::getenv("DS4R_ENGRAM_PREAD");
    const bool use_mmap = !(force_pread && *force_pread && std::strcmp(force_pread, "0") != 0);
    if (use_mmap && file_size > 0 && file_size <= std::numeric_limits<size_t>::max()) {
        void* p = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ, MAP_SHARED, im.file.fd(), 0);
        if (p != MAP_FAILED) {
            im.map = static_cast<const uint8_t*>(p);
            im.map_bytes = static_cast<size_t>(file_size);
            // Rows are hashed: no locality, so read-ahead would only waste I/O.
            if (::madvise(p, im.map_bytes, MADV_RANDOM) != 0)
                log_debug(strfmt("%s: madvise(MADV_RANDOM): %s", path, errno_text(errno).c_str()));
        } else {
            log_warn(strfmt("%s: mmap failed (%s); reading Engram rows with pread", path,
                            errno_text(errno).c_str()));
        }
    }
}

EngramTable::~EngramTable() = default;

void EngramTable::gather_bf16(const int64_t* ids, size_t n, uint16_t* out) const {
    const Impl& im = *impl_;
    const auto hd = static_cast<size_t>(head_dim_);
    const size_t n_scales = hd / kScaleBlock;
    std::vector<uint8_t> row_buf, scale_buf;
    if (!im.map) {
        row_buf.resize(hd);
        scale_buf.resize(n_scales);
    }
    for (size_t i = 0; i < n; ++i) {
        const int64_t id = ids[i];
        if (id < 0 || id >= rows_)
            throw RuntimeError(strfmt("%s: Engram row id %lld (entry %zu) is outside [0, %lld)",
                                      im.file.path().c_str(), (long long)id, i, (long long)rows_));
        const auto row = static_cast<uint64_t>(id);
        const uint64_t woff = im.weight_offset + row * hd, soff = im.scale_offset + row * n_scales;
        const uint8_t* w;
        const uint8_t* s;
        if (im.map) {
            w = im.map + woff;
            s = im.map + soff;
        } else {
            im.file.pread_exact(row_buf.data(), hd, woff);
            im.file.pread_exact(scale_buf.data(), n_scales, soff);
            w = row_buf.data();
            s = scale_buf.data();
        }
        uint16_t* o = out + i * hd;
        for (size_t d = 0; d < hd; ++d) o[d] = f32_to_bf16(im.e4m3[w[d]] * im.e8m0[s[d / kScaleBlock]]);
    }
}

}  // namespace ds4r
