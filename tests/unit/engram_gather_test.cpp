// The Engram gather (include/ds4r/engram_io.h): row-set planning (dedupe, file order), request planning,
// every read engine (io_uring, pread pool, mmap; scales in memory or per row) against the stored bytes,
// short reads / EINTR / O_DIRECT refused at read, a table truncated after it was opened (CheckpointError
// naming the shard), io_uring refused (the pread fallback), and the pass gather (order, errors, stop).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ds4r/engram_io.h"
#include "ds4r/error.h"
#include "ds4r/numeric.h"
#include "io/engram_reads.h"
#include "test_util.h"

using namespace ds4r;

namespace {

// A file holding one table: `rows` x `hd` e4m3 codes at weight_offset, rows x hd/32 e8m0 at scale_offset
// (offsets deliberately not 4 KiB aligned), random other bytes around them.
struct TableFile {
    std::string path;
    uint64_t weight_offset = 0, scale_offset = 0;
    int64_t rows = 0, hd = 0;
    std::vector<uint8_t> bytes;
};

TableFile make_table_file(const std::string& tag, int64_t rows, int64_t hd, uint64_t seed) {
    TableFile t;
    t.path = test::temp_dir(tag) + "/table.safetensors";
    t.rows = rows;
    t.hd = hd;
    t.weight_offset = 3 * 4096 + 136;
    t.scale_offset = t.weight_offset + static_cast<uint64_t>(rows * hd) + 40;
    t.bytes.resize(t.scale_offset + static_cast<uint64_t>(rows * hd / 32) + 1000);
    std::mt19937_64 rng(seed);
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    for (uint64_t i = 0; i < static_cast<uint64_t>(rows * hd); ++i) {
        uint8_t& b = t.bytes[t.weight_offset + i];
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    }
    for (uint64_t i = 0; i < static_cast<uint64_t>(rows * hd / 32); ++i)
        t.bytes[t.scale_offset + i] = static_cast<uint8_t>(110 + (t.bytes[t.scale_offset + i] & 15));
    std::ofstream f(t.path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    return t;
}

// The dequant's formula: bf16(e4m3 * 2^(scale - 127)), a NaN product as the quiet NaN 0x7FC0 (whose sign
// would otherwise follow the multiply's operand order).
uint16_t formula_bf16(uint8_t code, uint8_t scale) {
    const float v = e4m3_to_f32(code) * e8m0_to_f32(scale);
    return std::isnan(v) ? uint16_t{0x7FC0} : f32_to_bf16(v);
}

std::vector<uint16_t> expected_bf16(const TableFile& t, const std::vector<int64_t>& ids) {
    std::vector<uint16_t> out;
    for (int64_t id : ids)
        for (int64_t d = 0; d < t.hd; ++d) {
            const uint8_t w = t.bytes[t.weight_offset + static_cast<uint64_t>(id * t.hd + d)];
            const uint8_t s = t.bytes[t.scale_offset + static_cast<uint64_t>(id * (t.hd / 32) + d / 32)];
            out.push_back(formula_bf16(w, s));
        }
    return out;
}

std::vector<int64_t> random_ids(int64_t rows, size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> ids(n);
    for (auto& i : ids) i = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
    ids.push_back(0);
    ids.push_back(rows - 1);
    ids.push_back(rows - 1);  // repeats
    return ids;
}

std::vector<uint16_t> gather(const TableFile& t, const std::vector<int64_t>& ids, EngramTableOptions o) {
    EngramTable table(t.path, t.weight_offset, t.scale_offset, t.rows, t.hd, std::move(o));
    std::vector<uint16_t> out(ids.size() * static_cast<size_t>(t.hd));
    table.gather_bf16(ids.data(), ids.size(), out.data());
    return out;
}

}  // namespace

// The dequant's table path against the formula it replaces (docs/MODEL.md 3.4: bf16(e4m3 x 2^(s - 127)),
// one e8m0 scale per 32 elements), over every (scale code, e4m3 code) pair, NaN and subnormal codes
// included, and on a set large enough for the multithreaded split (lookups repeating rows, in any order).
TEST(EngramRowDequant, TableAndThreadsGiveTheFormulasBits) {
    EngramRowSet set;
    set.head_dim = 256;
    const size_t hd = 256, ns = hd / 32, u = 2048;
    std::mt19937_64 rng(3);
    set.rows.resize(u * hd);
    set.scales.resize(u * ns);
    for (size_t r = 0; r < u; ++r) {
        for (size_t d = 0; d < hd; ++d)  // rows 0..255: code d everywhere; later rows: random codes
            set.rows[r * hd + d] = static_cast<uint8_t>(r < 256 ? d : rng() & 0xFF);
        for (size_t b = 0; b < ns; ++b)  // rows 0..255 cover every scale code with every code
            set.scales[r * ns + b] = static_cast<uint8_t>(r < 256 ? (r + 32 * b) & 0xFF : rng() & 0xFF);
    }
    const size_t n = 6000;  // 1.5M elements: more than one thread's share
    set.index.resize(n);
    for (size_t k = 0; k < n; ++k) set.index[k] = static_cast<uint32_t>(k < 256 ? k : rng() % u);
    std::vector<uint16_t> out(n * hd), part(100 * hd);
    set.dequant_bf16(0, n, out.data());
    set.dequant_bf16(1234, 100, part.data());
    size_t pairs_seen = 0;
    for (size_t k = 0; k < n; ++k) {
        const size_t r = set.index[k];
        for (size_t d = 0; d < hd; ++d) {
            const uint16_t want = formula_bf16(set.rows[r * hd + d], set.scales[r * ns + d / 32]);
            ASSERT_EQ(out[k * hd + d], want) << "lookup " << k << " element " << d;
            if (k >= 1234 && k < 1334) {
                ASSERT_EQ(part[(k - 1234) * hd + d], want) << "lookup " << k;
            }
            pairs_seen += k < 256;
        }
    }
    EXPECT_EQ(pairs_seen, 256u * 256u);
}

TEST(EngramRowPlan, DeduplicatesAndSortsByFileOffset) {
    const std::vector<int64_t> ids = {5, 3, 5, 9, 3, 0};
    const EngramRowSet s = plan_engram_rows(ids.data(), ids.size(), 1, 10, 64, "t.safetensors");
    EXPECT_EQ(s.ids, (std::vector<int64_t>{0, 3, 5, 9}));
    EXPECT_EQ(s.index, (std::vector<uint32_t>{2, 1, 2, 3, 1, 0}));
    // A stride picks every k-th entry (one table's columns of the pass's [rows, tables, cols] hashes).
    const std::vector<int64_t> strided = {7, -1, 2, -1, 7, -1};
    const EngramRowSet t = plan_engram_rows(strided.data(), 3, 2, 10, 64, "t.safetensors");
    EXPECT_EQ(t.ids, (std::vector<int64_t>{2, 7}));
    EXPECT_EQ(t.index, (std::vector<uint32_t>{1, 0, 1}));
    for (int64_t bad : {int64_t{-1}, int64_t{10}}) {
        try {
            plan_engram_rows(&bad, 1, 1, 10, 64, "t.safetensors");
            ADD_FAILURE() << "id " << bad << " accepted";
        } catch (const RuntimeError& e) {
            EXPECT_NE(std::string(e.what()).find("t.safetensors"), std::string::npos) << e.what();
        }
    }
}

TEST(EngramRowPlan, RequestsCoverAlignedPagesInFileOrder) {
    using namespace engram_reads;
    std::vector<uint8_t> sink(1 << 20);
    std::vector<Piece> pieces = {
        {100, 256, sink.data()},         // page 0
        {3000, 256, sink.data()},        // pages 0 (3000..3256): same request
        {4000, 256, sink.data()},        // straddles pages 0 and 1: same request, 8 KiB
        {40960, 8, sink.data()},         // page 10: a new request
        {40960 + 4096, 8, sink.data()},  // page 11 touches page 10: merged
        {1 << 20, 256, sink.data()},     // far away
    };
    const auto reqs = plan_requests(pieces);
    ASSERT_EQ(reqs.size(), 3u);
    EXPECT_EQ(reqs[0].offset, 0u);
    EXPECT_EQ(reqs[0].len, 8192u);
    EXPECT_EQ(reqs[0].needed, 4256u);
    EXPECT_EQ(reqs[0].count, 3u);
    EXPECT_EQ(reqs[1].offset, 40960u);
    EXPECT_EQ(reqs[1].len, 8192u);
    EXPECT_EQ(reqs[1].needed, 4096u + 8u);
    EXPECT_EQ(reqs[2].first, 5u);
    // Merging stops at kMaxRequest.
    std::vector<Piece> run;
    for (uint64_t off = 0; off < 4 * kMaxRequest; off += 4096) run.push_back({off, 4096, sink.data()});
    const auto capped = plan_requests(run);
    ASSERT_EQ(capped.size(), 4u);
    for (const auto& r : capped) EXPECT_EQ(r.len, kMaxRequest);
}

// Every engine and scale mode gives the stored values, byte for byte.
TEST(EngramGather, EveryEngineReadsTheStoredRows) {
    const TableFile t = make_table_file("eg-engines", 3001, 64, 1);
    const std::vector<int64_t> ids = random_ids(t.rows, 700, 2);
    const std::vector<uint16_t> want = expected_bf16(t, ids);
    for (EngramIoMode mode :
         {EngramIoMode::Auto, EngramIoMode::Uring, EngramIoMode::Pread, EngramIoMode::Mmap})
        for (bool in_memory : {false, true})
            for (int qd : {1, 7, 64}) {
                EngramTableOptions o;
                o.io = mode;
                o.queue_depth = qd;
                o.scales_in_memory = in_memory;
                EXPECT_EQ(gather(t, ids, o), want)
                    << engram_io_name(mode) << " scales in memory " << in_memory << " qd " << qd;
            }
}

TEST(EngramGather, UringRefusedFallsBackToPreadThreads) {
    const TableFile t = make_table_file("eg-refuse", 500, 256, 3);
    const std::vector<int64_t> ids = random_ids(t.rows, 300, 4);
    EngramTableOptions o;
    o.io = EngramIoMode::Uring;
    o.queue_depth = 16;
    o.refuse_uring_for_test = true;
    EngramTable table(t.path, t.weight_offset, t.scale_offset, t.rows, t.hd, o);
    EXPECT_NE(table.engine().find("pread, 16 threads"), std::string::npos) << table.engine();
    std::vector<uint16_t> out(ids.size() * static_cast<size_t>(t.hd));
    table.gather_bf16(ids.data(), ids.size(), out.data());
    EXPECT_EQ(out, expected_bf16(t, ids));
    std::string why;
    if (engram_reads::uring_available(&why)) {
        o.refuse_uring_for_test = false;
        EngramTable u(t.path, t.weight_offset, t.scale_offset, t.rows, t.hd, o);
        EXPECT_NE(u.engine().find("io_uring"), std::string::npos) << u.engine();
    } else {
        std::printf("note: io_uring unavailable here (%s): the uring cases ran the pread fallback\n",
                    why.c_str());
    }
}

// Short reads, EINTR and EAGAIN are retried; O_DIRECT refused at read (EINVAL) switches to buffered.
TEST(EngramGather, ShortReadsInterruptsAndRefusedDirectReadsAreRetried) {
    const TableFile t = make_table_file("eg-short", 2000, 64, 5);
    const std::vector<int64_t> ids = random_ids(t.rows, 500, 6);
    const std::vector<uint16_t> want = expected_bf16(t, ids);
    for (bool refuse_direct : {false, true}) {
        std::atomic<int> calls{0}, interrupted{0}, short_reads{0};
        EngramTableOptions o;
        o.io = EngramIoMode::Pread;
        o.queue_depth = 4;
        o.pread_for_test = [&](int fd, void* buf, size_t n, off_t off) -> ssize_t {
            const int k = calls++;
            if (refuse_direct && (::fcntl(fd, F_GETFL) & O_DIRECT)) {
                errno = EINVAL;
                return -1;
            }
            if (k % 3 == 0) {
                ++interrupted;
                errno = k % 2 ? EINTR : EAGAIN;
                return -1;
            }
            if (k % 3 == 1 && n > 100) {
                ++short_reads;
                n = 100;  // short: the rest continues (buffered where it is no longer aligned)
            }
            return ::pread(fd, buf, n, off);
        };
        EXPECT_EQ(gather(t, ids, o), want) << "refuse_direct " << refuse_direct;
        EXPECT_GT(interrupted.load(), 0);
        EXPECT_GT(short_reads.load(), 0);
    }
}

// A shard cut short after the table was opened: CheckpointError naming the shard, for every engine.
TEST(EngramGather, TruncatedTableIsACheckpointErrorNamingTheShard) {
    for (EngramIoMode mode : {EngramIoMode::Uring, EngramIoMode::Pread, EngramIoMode::Mmap}) {
        const TableFile t = make_table_file(std::string("eg-trunc-") + engram_io_name(mode), 1000, 64, 7);
        EngramTableOptions o;
        o.io = mode;
        EngramTable table(t.path, t.weight_offset, t.scale_offset, t.rows, t.hd, o);
        std::filesystem::resize_file(t.path, t.weight_offset + 500 * 64);
        const std::vector<int64_t> ids = {10, 999};
        std::vector<uint16_t> out(ids.size() * 64);
        try {
            table.gather_bf16(ids.data(), ids.size(), out.data());
            ADD_FAILURE() << engram_io_name(mode) << ": truncated table read without error";
        } catch (const CheckpointError& e) {
            EXPECT_NE(std::string(e.what()).find(t.path), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
        }
        // Opened after the cut: the constructor names it.
        EXPECT_THROW(EngramTable(t.path, t.weight_offset, t.scale_offset, t.rows, t.hd, o), CheckpointError);
    }
}

// The pass gather: tables gathered in order into stored-row sets whose dequantization equals the
// table's own gather; an error reaches wait() of its table and every later one; destruction mid-gather
// stops the thread.
TEST(EngramPassGather, GathersEveryTableOfThePass) {
    EngramResources res;
    std::vector<TableFile> files = {make_table_file("eg-pass0", 1500, 64, 8),
                                    make_table_file("eg-pass1", 900, 64, 9)};
    for (const auto& f : files)
        res.tables.push_back(
            std::make_unique<EngramTable>(f.path, f.weight_offset, f.scale_offset, f.rows, f.hd));
    const int64_t rows = 200, cols = 6, n = 2;
    std::mt19937_64 rng(10);
    std::vector<int64_t> hashes(static_cast<size_t>(rows * n * cols));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < n; ++e)
            for (int64_t c = 0; c < cols; ++c)
                hashes[static_cast<size_t>((r * n + e) * cols + c)] = static_cast<int64_t>(
                    rng() % static_cast<uint64_t>(files[static_cast<size_t>(e)].rows / 4));
    EngramPassGather g(res, hashes, rows, cols);
    for (int e = 0; e < 2; ++e) {
        std::vector<int64_t> ids;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
                ids.push_back(hashes[static_cast<size_t>((r * n + e) * cols + c)]);
        const EngramRowSet& set = g.wait(e);
        EXPECT_LT(set.ids.size(), ids.size()) << "repeated ids were not deduplicated";
        std::vector<uint16_t> out(ids.size() * 64);
        set.dequant_bf16(0, ids.size(), out.data());
        EXPECT_EQ(out, expected_bf16(files[static_cast<size_t>(e)], ids)) << "table " << e;
        g.release(e);
    }
    const EngramGatherStats st = g.stats();
    EXPECT_EQ(st.lookups, static_cast<uint64_t>(2 * rows * cols));
    EXPECT_GT(st.read_requests, 0u);

    // Table 0 truncated: both waits throw the CheckpointError.
    std::filesystem::resize_file(files[0].path, files[0].weight_offset + 10);
    EngramPassGather bad(res, hashes, rows, cols);
    EXPECT_THROW(bad.wait(0), CheckpointError);
    EXPECT_THROW(bad.wait(1), CheckpointError);
    // Destroyed without waiting: the thread stops and joins.
    { EngramPassGather dropped(res, hashes, rows, cols); }
}

namespace {

// Two tables and a pass's hash ids [rows, 2, cols] into them (as GathersEveryTableOfThePass).
struct TwoTables {
    EngramResources res;
    std::vector<TableFile> files;
    std::vector<int64_t> hashes;
    int64_t rows = 120, cols = 6;
    std::vector<int64_t> ids(int e) const {  // table e's lookups in pass order
        std::vector<int64_t> v;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
                v.push_back(hashes[static_cast<size_t>((r * 2 + e) * cols + c)]);
        return v;
    }
};

std::unique_ptr<TwoTables> two_tables(const std::string& tag, uint64_t seed) {
    auto t = std::make_unique<TwoTables>();
    t->files = {make_table_file(tag + "0", 1200, 64, seed), make_table_file(tag + "1", 700, 64, seed + 1)};
    for (const auto& f : t->files)
        t->res.tables.push_back(
            std::make_unique<EngramTable>(f.path, f.weight_offset, f.scale_offset, f.rows, f.hd));
    std::mt19937_64 rng(seed);
    t->hashes.resize(static_cast<size_t>(t->rows * 2 * t->cols));
    for (int64_t r = 0; r < t->rows; ++r)
        for (int64_t e = 0; e < 2; ++e)
            for (int64_t c = 0; c < t->cols; ++c)
                t->hashes[static_cast<size_t>((r * 2 + e) * t->cols + c)] = static_cast<int64_t>(
                    rng() % static_cast<uint64_t>(t->files[static_cast<size_t>(e)].rows));
    return t;
}

void expect_rows(EngramPassGather& g, const TwoTables& t, int e) {
    const std::vector<int64_t> ids = t.ids(e);
    std::vector<uint16_t> out(ids.size() * 64);
    g.wait(e).dequant_bf16(0, ids.size(), out.data());
    EXPECT_EQ(out, expected_bf16(t.files[static_cast<size_t>(e)], ids)) << "table " << e;
}

}  // namespace

// The next pass's gather (--engram-next-pass): nothing is read before the current pass's gather is done
// (its gate opens); each table then waits for the current pass to free the same table unless a second full
// set is allowed. tables_done() shows it without timing: a table whose release never came cannot be done.
TEST(EngramPassGather, NextPassWaitsForTheGateAndEachRelease) {
    const auto t = two_tables("eg-next", 21);
    auto gate = std::make_shared<EngramGatherGate>(2);
    const auto hashes = t->hashes;
    EngramPassGather g(
        t->res, [hashes] { return hashes; }, t->rows, t->cols, gate, /*second_full_set=*/false);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(g.tables_done(), 0) << "read before the current pass's gather was done";
    gate->open();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_EQ(g.tables_done(), 0) << "table 0 read before the current pass freed its own";
    gate->release(0);
    expect_rows(g, *t, 0);
    EXPECT_EQ(g.tables_done(), 1) << "table 1 read before the current pass freed its own";
    gate->release(1);
    expect_rows(g, *t, 1);

    // A second full set: both tables once the gate opens, no release needed.
    auto gate2 = std::make_shared<EngramGatherGate>(2);
    EngramPassGather full(
        t->res, [hashes] { return hashes; }, t->rows, t->cols, gate2, /*second_full_set=*/true);
    gate2->open();
    expect_rows(full, *t, 0);
    expect_rows(full, *t, 1);
    EXPECT_EQ(full.stats().lookups, static_cast<uint64_t>(2 * t->rows * t->cols));

    // The current pass's gate: opens when its thread is done; release() and destruction free the tables.
    std::shared_ptr<const EngramGatherGate> done;
    {
        EngramPassGather current(t->res, hashes, t->rows, t->cols);
        done = current.done_gate();
        std::atomic<bool> never{false};
        EXPECT_TRUE(done->wait_open(never));
        current.release(0);
        EXPECT_TRUE(done->wait_released(0, never));
    }
    std::atomic<bool> never{false};
    EXPECT_TRUE(done->wait_released(1, never)) << "destroyed without release: its rows are gone too";
}

// Errors of the next pass's gather surface at its pass's wait() of the table, never earlier, naming the
// shard; a failing hash computation too; a gather destroyed while waiting on the gate stops (no hang).
TEST(EngramPassGather, NextPassErrorsSurfaceAtTheirWait) {
    const auto t = two_tables("eg-next-err", 31);
    const auto hashes = t->hashes;
    auto gate = std::make_shared<EngramGatherGate>(2);
    EngramPassGather g(
        t->res, [hashes] { return hashes; }, t->rows, t->cols, gate, /*second_full_set=*/true);
    // Cut after the table was opened (and after the gather was created): read when the gate opens.
    std::filesystem::resize_file(t->files[0].path, t->files[0].weight_offset + 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(g.tables_done(), 0);
    gate->open();
    try {
        g.wait(0);
        ADD_FAILURE() << "truncated table read without error";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find(t->files[0].path), std::string::npos) << e.what();
    }
    EXPECT_THROW(g.wait(1), CheckpointError);  // the pass stops at its first failed table

    EngramPassGather bad_hashes(
        t->res, []() -> std::vector<int64_t> { throw InputError("hashing failed"); }, t->rows, t->cols, gate,
        true);
    EXPECT_THROW(bad_hashes.wait(0), InputError);
    EXPECT_THROW(bad_hashes.wait(1), InputError);

    // Never opened: destruction stops the wait.
    auto closed = std::make_shared<EngramGatherGate>(2);
    {
        EngramPassGather waiting(
            t->res, [hashes] { return hashes; }, t->rows, t->cols, closed, false);
    }
    SUCCEED();
}
