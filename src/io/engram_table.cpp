// One Engram table in its shard (include/ds4r/engram_io.h): row-set planning (dedupe, file order),
// the read engines chosen per table (io_uring, pread pool, mmap), the in-memory scale tensor, and the
// exact dequantization of docs/MODEL.md 4.8 step 1: bf16( e4m3(row[d]) * 2^(scale[d / 32] - 127) ), the
// product in fp32 as the reference does it (exact for normal values; the bf16 cast rounds subnormals).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ds4r/clock.h"
#include "ds4r/engram_io.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/log.h"
#include "ds4r/numeric.h"
#include "io/engram_reads.h"

namespace ds4r {

namespace {

constexpr int64_t kScaleBlock = 32;  // one e8m0 scale per 32 elements of a row (docs/MODEL.md 3.4)
constexpr int kMmapThreads = 16;     // the earlier engine: 16 threads of page faults

// One element's bf16 bits, f32_to_bf16(e4m3 * 2^(scale - 127)). A NaN product (a NaN code, or scale code
// 255) is the quiet NaN 0x7FC0: the sign of NaN x NaN follows the multiply's operand order, which the
// compiler may swap.
uint16_t engram_dequant_bf16(uint8_t code, uint8_t scale) {
    const float v = e4m3_to_f32(code) * e8m0_to_f32(scale);
    return v != v ? static_cast<uint16_t>(kF32QuietNanBits >> 16) : f32_to_bf16(v);
}

// Every (scale code, e4m3 code) pair's engram_dequant_bf16: the dequant's arithmetic done once (64 Ki
// entries, 128 KiB), so a row element is one table load. (The Engram layer's host work measured ~30 us per
// token on the H200 machine; the per-element multiply and rounding alone took 13 us per token
// single-threaded on a 2-core machine, the table and 2 threads 4.)
struct DequantTables {
    std::vector<uint16_t> bf16;  // [scale code][e4m3 code]
    DequantTables() : bf16(256 * 256) {
        for (int s = 0; s < 256; ++s)
            for (int c = 0; c < 256; ++c)
                bf16[static_cast<size_t>(s * 256 + c)] =
                    engram_dequant_bf16(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
    }
};
const DequantTables& dequant_tables() {
    static const DequantTables t;
    return t;
}

std::once_flag g_uring_note_once;

}  // namespace

void EngramGatherStats::add(const EngramGatherStats& o) {
    lookups += o.lookups;
    unique_rows += o.unique_rows;
    read_requests += o.read_requests;
    bytes_read += o.bytes_read;
    scale_bytes_loaded += o.scale_bytes_loaded;
    busy_s += o.busy_s;
    scale_load_s += o.scale_load_s;
    wait_s += o.wait_s;
    next_pass_gathers += o.next_pass_gathers;
    tables_ready_at_start += o.tables_ready_at_start;
    if (!o.engine.empty()) engine = o.engine;
}

void EngramRowSet::dequant_bf16(size_t first, size_t n, uint16_t* out) const {
    const DequantTables& t = dequant_tables();
    const auto hd = static_cast<size_t>(head_dim);
    const size_t ns = hd / kScaleBlock;
    DS4R_CHECK(first + n <= index.size(), "Engram dequant: lookups [%zu, %zu) of %zu", first, first + n,
               index.size());
    auto part = [&](size_t k0, size_t k1) {
        for (size_t k = k0; k < k1; ++k) {
            const size_t u = index[first + k];
            const uint8_t* w = rows.data() + u * hd;
            const uint8_t* s = scales.data() + u * ns;
            uint16_t* o = out + k * hd;
            for (size_t b = 0; b < ns; ++b) {
                const uint16_t* tb = t.bf16.data() + static_cast<size_t>(s[b]) * 256;
                for (size_t d = b * kScaleBlock; d < (b + 1) * kScaleBlock; ++d) o[d] = tb[w[d]];
            }
        }
    };
    // A chunk's lookups (e.g. 2,420 rows x 24 = 58k lookups, 15M elements) split over up to 8 threads;
    // every element is written by exactly one of them, so the bytes do not depend on the split.
    constexpr size_t kMinPerThread = size_t{1} << 20;  // elements
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    const size_t n_threads = std::min({hw, size_t{8}, std::max<size_t>(1, n * hd / kMinPerThread)});
    if (n_threads <= 1) {
        part(0, n);
        return;
    }
    struct Joiner {  // joins the started threads also when starting another one throws
        std::vector<std::thread> threads;
        ~Joiner() {
            for (auto& th : threads) th.join();
        }
    } j;
    j.threads.reserve(n_threads - 1);
    const size_t per = (n + n_threads - 1) / n_threads;
    for (size_t i = 1; i < n_threads; ++i) {
        const size_t k0 = std::min(n, i * per), k1 = std::min(n, (i + 1) * per);
        j.threads.emplace_back(part, k0, k1);
    }
    part(0, std::min(n, per));
}

EngramRowSet plan_engram_rows(const int64_t* lookups, size_t n, size_t stride, int64_t table_rows,
                              int64_t head_dim, const std::string& path) {
    EngramRowSet set;
    set.head_dim = head_dim;
    DS4R_CHECK(n <= std::numeric_limits<uint32_t>::max(), "Engram gather: %zu lookups in one table", n);
    DS4R_CHECK(table_rows <= (int64_t{1} << 32),
               "Engram gather: %s has %lld rows (the row plan takes ids < 2^32)", path.c_str(),
               (long long)table_rows);
    // Keys (row id << 32 | lookup k), sorted by row id with a stable LSD radix sort over the id's bits:
    // equal ids keep k ascending, and each lookup's place among the distinct ids falls out of one walk.
    // (The binary search per lookup this replaces cost ~0.8 us per lookup on 30M lookups: cache misses
    // in a 250 MB id array, the whole Engram stall of a 1.35M-token pass.)
    std::vector<uint64_t> keys(n), tmp(n);
    for (size_t k = 0; k < n; ++k) {
        const int64_t id = lookups[k * stride];
        if (id < 0 || id >= table_rows)
            throw RuntimeError(strfmt("%s: Engram row id %lld (entry %zu) is outside [0, %lld)", path.c_str(),
                                      (long long)id, k, (long long)table_rows));
        keys[k] = (static_cast<uint64_t>(id) << 32) | k;
    }
    int id_bits = 0;
    while (id_bits < 32 && (uint64_t{1} << id_bits) < static_cast<uint64_t>(table_rows)) ++id_bits;
    constexpr int kDigit = 11;
    std::vector<size_t> count(size_t{1} << kDigit);
    for (int shift = 32; shift < 32 + id_bits; shift += kDigit) {
        std::fill(count.begin(), count.end(), 0);
        for (uint64_t key : keys) ++count[(key >> shift) & ((1u << kDigit) - 1)];
        size_t sum = 0;
        for (size_t& c : count) sum += std::exchange(c, sum);  // exclusive prefix sums
        for (uint64_t key : keys) tmp[count[(key >> shift) & ((1u << kDigit) - 1)]++] = key;
        keys.swap(tmp);
    }
    tmp = {};
    // Repeated n-grams hash to the same rows: each distinct row is read once, in file order.
    set.index.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const auto id = static_cast<int64_t>(keys[i] >> 32);
        if (set.ids.empty() || set.ids.back() != id) set.ids.push_back(id);
        set.index[keys[i] & 0xFFFFFFFFu] = static_cast<uint32_t>(set.ids.size() - 1);
    }
    return set;
}

struct EngramTable::Impl {
    engram_reads::TableFile file;
    EngramTableOptions opt;
    uint64_t file_size = 0;
    uint64_t weight_offset = 0;  // e4m3 [rows, head_dim]
    uint64_t scale_offset = 0;   // e8m0 [rows, head_dim / 32]
    uint64_t scale_bytes = 0;
    // mmap engine: the whole file, mapped at the first gather.
    std::once_flag map_once;
    const uint8_t* map = nullptr;
    size_t map_bytes = 0;
    // scales_in_memory: the whole scale tensor, read at the first gather.
    std::mutex scales_mu;
    bool scales_loaded = false;
    std::vector<uint8_t> scales;

    ~Impl() {
        if (map) ::munmap(const_cast<uint8_t*>(map), map_bytes);
        if (file.direct_fd >= 0) ::close(file.direct_fd);
        if (file.buffered_fd >= 0) ::close(file.buffered_fd);
    }
};

EngramTable::EngramTable(const std::string& shard_path, uint64_t weight_offset, uint64_t scale_offset,
                         int64_t rows, int64_t head_dim, EngramTableOptions opt)
    : impl_(std::make_unique<Impl>()), rows_(rows), head_dim_(head_dim) {
    const char* path = shard_path.c_str();
    if (rows <= 0 || head_dim <= 0 || head_dim % kScaleBlock != 0 || head_dim > (int64_t{1} << 16))
        throw CheckpointError(
            strfmt("%s: Engram table shape [%lld, %lld]: expected positive rows and a "
                   "row width that is a multiple of 32 (at most 65536)",
                   path, (long long)rows, (long long)head_dim));
    const auto urows = static_cast<uint64_t>(rows);
    const auto row_bytes = static_cast<uint64_t>(head_dim);
    const uint64_t scale_row = row_bytes / kScaleBlock;
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    if (urows > kMax / row_bytes || weight_offset > kMax - urows * row_bytes ||
        scale_offset > kMax - urows * scale_row)
        throw CheckpointError(strfmt("%s: Engram table extents overflow", path));

    Impl& im = *impl_;
    im.opt = std::move(opt);
    im.file.path = shard_path;
    im.file.pread = im.opt.pread_for_test;
    {
        FileHandle probe(shard_path, O_RDONLY, 0644, /*checkpoint=*/true);  // CheckpointError naming it
        im.file_size = probe.size();
    }
    im.file.buffered_fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (im.file.buffered_fd < 0)
        throw CheckpointError(strfmt("%s: cannot open (%s)", path, errno_text(errno).c_str()));
    if (im.opt.io != EngramIoMode::Mmap) {
        im.file.direct_fd = ::open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        im.file.direct_ok = im.file.direct_fd >= 0;  // EINVAL: the file system refuses O_DIRECT
    }
    im.weight_offset = weight_offset;
    im.scale_offset = scale_offset;
    im.scale_bytes = urows * scale_row;
    const uint64_t weight_end = weight_offset + urows * row_bytes;
    const uint64_t scale_end = scale_offset + im.scale_bytes;
    if (weight_end > im.file_size || scale_end > im.file_size)
        throw CheckpointError(strfmt(
            "%s: the Engram table needs bytes up to %llu (weight) and %llu (scale), the file has %llu", path,
            (unsigned long long)weight_end, (unsigned long long)scale_end, (unsigned long long)im.file_size));
}

EngramTable::~EngramTable() = default;

const std::string& EngramTable::path() const {
    return impl_->file.path;
}
uint64_t EngramTable::scale_bytes() const {
    return impl_->scale_bytes;
}

std::string EngramTable::engine() const {
    const Impl& im = *impl_;
    const int qd = std::clamp(im.opt.queue_depth, 1, 1024);
    if (im.opt.io == EngramIoMode::Mmap) return strfmt("mmap, %d threads of page faults", kMmapThreads);
    const char* dio = im.file.direct_fd >= 0 ? "O_DIRECT" : "buffered";
    if ((im.opt.io == EngramIoMode::Auto || im.opt.io == EngramIoMode::Uring) &&
        !im.opt.refuse_uring_for_test && engram_reads::uring_available(nullptr))
        return strfmt("io_uring, %d in flight, %s", qd, dio);
    return strfmt("pread, %d threads, %s", std::min(qd, 64), dio);
}

void EngramTable::read_rows(EngramRowSet& set, EngramGatherStats& st, const std::atomic<bool>* stop) const {
    Impl& im = *impl_;
    const auto hd = static_cast<size_t>(head_dim_);
    const size_t ns = hd / kScaleBlock;
    const size_t u = set.ids.size();
    set.head_dim = head_dim_;
    set.rows.resize(u * hd);
    set.scales.resize(u * ns);
    st.unique_rows += u;
    st.engine = engine();

    // The whole scale tensor, once (sequential reads), when asked: then only the rows are random reads.
    if (im.opt.scales_in_memory) {
        std::lock_guard<std::mutex> lk(im.scales_mu);
        if (!im.scales_loaded) {
            const double t0 = now_s();
            std::vector<uint8_t> all(im.scale_bytes);
            std::vector<engram_reads::Piece> pieces;
            for (uint64_t off = 0; off < im.scale_bytes; off += engram_reads::kMaxRequest / 2) {
                const uint64_t len = std::min<uint64_t>(engram_reads::kMaxRequest / 2, im.scale_bytes - off);
                pieces.push_back({im.scale_offset + off, static_cast<uint32_t>(len), all.data() + off});
            }
            const auto reqs = engram_reads::plan_requests(pieces);
            engram_reads::ReadCounters c;
            engram_reads::read_with_threads(im.file, reqs, pieces, 8, stop, c);
            im.scales = std::move(all);
            im.scales_loaded = true;
            st.scale_bytes_loaded += im.scale_bytes;
            st.scale_load_s += now_s() - t0;
            log_info(strfmt("%s: Engram scales in memory: %.2f GB read in %.2f s", im.file.path.c_str(),
                            im.scale_bytes / 1e9, now_s() - t0));
        }
    }
    const bool scales_from_memory = im.opt.scales_in_memory && im.scales_loaded;
    if (scales_from_memory)
        for (size_t i = 0; i < u; ++i)
            std::memcpy(set.scales.data() + i * ns, im.scales.data() + static_cast<uint64_t>(set.ids[i]) * ns,
                        ns);

    if (im.opt.io == EngramIoMode::Mmap) {
        std::call_once(im.map_once, [&] {
            void* p = ::mmap(nullptr, static_cast<size_t>(im.file_size), PROT_READ, MAP_SHARED,
                             im.file.buffered_fd, 0);
            if (p == MAP_FAILED)
                DS4R_THROW(RuntimeError, "%s: mmap failed (%s)", im.file.path.c_str(),
                           errno_text(errno).c_str());
            // Rows are hashed: no locality, so read-ahead would only waste I/O.
            if (::madvise(p, static_cast<size_t>(im.file_size), MADV_RANDOM) != 0)
                log_debug(
                    strfmt("%s: madvise(MADV_RANDOM): %s", im.file.path.c_str(), errno_text(errno).c_str()));
            im.map = static_cast<const uint8_t*>(p);
            im.map_bytes = static_cast<size_t>(im.file_size);
        });
        // A file truncated after it was opened would SIGBUS a page fault: check its size first.
        struct stat sb {};
        if (::fstat(im.file.buffered_fd, &sb) == 0 && static_cast<uint64_t>(sb.st_size) < im.file_size)
            DS4R_THROW(CheckpointError,
                       "%s: shard truncated: the Engram table needs %llu bytes, the file has %lld",
                       im.file.path.c_str(), (unsigned long long)im.file_size, (long long)sb.st_size);
        const double t0 = now_s();
        std::vector<std::thread> pool;
        const size_t per = (u + kMmapThreads - 1) / kMmapThreads;
        for (size_t b = 0; b < u; b += per)
            pool.emplace_back([&, b] {
                for (size_t i = b; i < std::min(u, b + per); ++i) {
                    if (stop && stop->load(std::memory_order_relaxed)) return;
                    const auto id = static_cast<uint64_t>(set.ids[i]);
                    std::memcpy(set.rows.data() + i * hd, im.map + im.weight_offset + id * hd, hd);
                    if (!scales_from_memory)
                        std::memcpy(set.scales.data() + i * ns, im.map + im.scale_offset + id * ns, ns);
                }
            });
        for (auto& t : pool) t.join();
        if (stop && stop->load()) throw RuntimeError(im.file.path + ": Engram gather cancelled");
        st.busy_s += now_s() - t0;
        st.bytes_read += u * (hd + (scales_from_memory ? 0 : ns));  // what was touched (pages: more)
        return;
    }

    // Pieces in file order: the rows (sorted ids) and, unless in memory, their scales.
    std::vector<engram_reads::Piece> pieces;
    pieces.reserve(scales_from_memory ? u : 2 * u);
    std::vector<engram_reads::Piece> scale_pieces;
    for (size_t i = 0; i < u; ++i) {
        const auto id = static_cast<uint64_t>(set.ids[i]);
        pieces.push_back({im.weight_offset + id * hd, static_cast<uint32_t>(hd), set.rows.data() + i * hd});
        if (!scales_from_memory)
            scale_pieces.push_back(
                {im.scale_offset + id * ns, static_cast<uint32_t>(ns), set.scales.data() + i * ns});
    }
    if (!scale_pieces.empty()) {
        std::vector<engram_reads::Piece> merged(pieces.size() + scale_pieces.size());
        std::merge(pieces.begin(), pieces.end(), scale_pieces.begin(), scale_pieces.end(), merged.begin(),
                   [](const auto& a, const auto& b) { return a.offset < b.offset; });
        pieces = std::move(merged);
    }
    const auto reqs = engram_reads::plan_requests(pieces);
    engram_reads::ReadCounters c;
    const int qd = std::clamp(im.opt.queue_depth, 1, 1024);
    bool done = false;
    if ((im.opt.io == EngramIoMode::Auto || im.opt.io == EngramIoMode::Uring) &&
        !im.opt.refuse_uring_for_test) {
        std::string why;
        done = engram_reads::read_with_uring(im.file, reqs, pieces, qd, stop, c, &why);
        if (!done)
            std::call_once(g_uring_note_once, [&] {
                const std::string msg =
                    strfmt("io_uring unavailable (%s): Engram rows read by %d pread threads", why.c_str(),
                           std::min(qd, 64));
                if (im.opt.io == EngramIoMode::Uring)
                    log_warn(msg);
                else
                    log_info(msg);
            });
    }
    if (!done) engram_reads::read_with_threads(im.file, reqs, pieces, std::min(qd, 64), stop, c);
    st.read_requests += c.requests;
    st.bytes_read += c.bytes;
    st.busy_s += c.busy_s;
}

void EngramTable::gather_bf16(const int64_t* ids, size_t n, uint16_t* out) const {
    EngramRowSet set = plan_engram_rows(ids, n, 1, rows_, head_dim_, impl_->file.path);
    EngramGatherStats st;
    read_rows(set, st);
    set.dequant_bf16(0, n, out);
}

}  // namespace ds4r
