// `bench` I/O measurements and report (src/replay/bench_io.h).
#include "replay/bench_io.h"

#include <algorithm>

#include "ds4r/checkpoint.h"
#include "ds4r/log.h"

namespace ds4r {

namespace {
std::string frac(double v, double ref) {
    return ref > 0 ? strfmt("%.0f%%", 100 * v / ref) : std::string("-");
}
}  // namespace

DiskRates bench_measure_disk(const Checkpoint& ck, double seconds, std::FILE* out, const BenchCsvRow& csv) {
    DiskRates d;
    if (seconds <= 0) return d;
    std::string path;
    uint64_t best = 0;
    for (const auto& sh : ck.shards())
        if (sh.file_size > best) best = sh.file_size, path = sh.path;
    d = measure_disk(path, seconds);
    std::fprintf(out,
                 "\ndisk (%s, %.1f GB, %s): sequential %.0f MB/s (8 MiB reads, 4 in flight); random 4 KiB "
                 "reads/s: %.0f at QD 1, %.0f at QD 32, %.0f at QD 256 (%s)\n",
                 path.c_str(), best / 1e9, d.direct ? "O_DIRECT" : "buffered: page cache, not the disk",
                 d.seq_mb_s, d.iops_qd1, d.iops_qd32, d.iops_qd256, d.random_engine.c_str());
    csv("disk_seq", d.seq_mb_s, "MB/s");
    csv("disk_iops_qd1", d.iops_qd1, "reads/s");
    csv("disk_iops_qd32", d.iops_qd32, "reads/s");
    csv("disk_iops_qd256", d.iops_qd256, "reads/s");
    return d;
}

void bench_report_io(const Checkpoint& ck, const std::vector<LayerTiming>& timings,
                     const WeightSourceStats& ws, const EngramGatherStats& eg, double wall,
                     const DiskRates& disk, std::FILE* out, const BenchCsvRow& csv) {
    const auto& roles = ck.roles();
    const double w_mb_s = ws.read_seconds > 0 ? ws.bytes_read / 1e6 / ws.read_seconds : 0;
    std::fprintf(out, "  weights: %.0f MB/s while reading (%s of the disk's sequential rate)\n", w_mb_s,
                 frac(w_mb_s, disk.seq_mb_s).c_str());
    csv("weights_read_mb_s", w_mb_s, "MB/s");
    if (eg.lookups > 0) {
        const double rows_s = eg.busy_s > 0 ? eg.unique_rows / eg.busy_s : 0;
        const double iops = eg.busy_s > 0 ? eg.read_requests / eg.busy_s : 0;
        std::fprintf(
            out,
            "  Engram gather (%s): %llu lookups -> %llu distinct rows, %llu requests, %.2f GB in %.2f s "
            "busy: %.0f rows/s, %.0f IOPS (%s of the disk's best random rate); scales loaded %.2f GB in "
            "%.2f s; stall %.2f s\n",
            eg.engine.c_str(), (unsigned long long)eg.lookups, (unsigned long long)eg.unique_rows,
            (unsigned long long)eg.read_requests, eg.bytes_read / 1e9, eg.busy_s, rows_s, iops,
            frac(iops, disk.best_iops()).c_str(), eg.scale_bytes_loaded / 1e9, eg.scale_load_s, eg.wait_s);
        csv("engram_rows_per_s", rows_s, "rows/s");
        csv("engram_iops", iops, "reads/s");
        csv("engram_busy_s", eg.busy_s, "s");
        csv("engram_stall_s", eg.wait_s, "s");
    }
    // The disk's busy time: each is the union of the intervals with a request of that kind in flight.
    std::fprintf(
        out,
        "  disk busy: weights (sequential) %.2f s, Engram rows (random) %.2f s + scales %.2f s, of %.2f s "
        "wall\n",
        ws.read_seconds, eg.busy_s, eg.scale_load_s, wall);
    csv("disk_busy_weights_s", ws.read_seconds, "s");
    csv("disk_busy_engram_s", eg.busy_s + eg.scale_load_s, "s");
    double eng = 0, other = 0;
    int n_eng = 0, n_other = 0;
    for (const LayerTiming& t : timings) {
        if (t.layer < 0) continue;
        const double lw = t.wait_s + t.compute_s;
        if (roles[static_cast<size_t>(t.layer)].engram)
            eng += lw, ++n_eng;
        else
            other += lw, ++n_other;
    }
    if (n_eng > 0 && n_other > 0) {
        const double ratio = (eng / n_eng) / (other / n_other);
        std::fprintf(out,
                     "  Engram layers: %.2f s wall each vs %.2f s for the others (%.2fx; target <= 1.1x)\n",
                     eng / n_eng, other / n_other, ratio);
        csv("engram_layer_wall_ratio", ratio, "ratio");
    }
}

}  // namespace ds4r
