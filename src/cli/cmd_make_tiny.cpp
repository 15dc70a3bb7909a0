// `ds4replay make-tiny OUT_DIR [--preset tiny|full-width] [--layers N] [--seed S] [--force]`:
// CLI glue over make_tiny() (include/ds4r/make_tiny.h). Progress and the summary go to stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/global_flags.h"
#include "ds4r/error.h"
#include "ds4r/make_tiny.h"

namespace ds4r::cli {

namespace {

struct MakeTinyArgs {
    std::string out_dir;
    std::string preset = "tiny";
    int layers = 0;
    uint64_t seed = 0;
    bool force = false;
    bool headers_only = false;
    int threads = 0;
    int64_t engram_rows = 0;
};

// Progress on stderr: an updating line on a terminal, otherwise a line per file and every 10 s.
class ProgressPrinter {
public:
    ProgressPrinter() : tty_(::isatty(2) != 0), last_(std::chrono::steady_clock::now()) {}
    void operator()(const MakeTinyProgress& p) {
        const auto now = std::chrono::steady_clock::now();
        const double since = std::chrono::duration<double>(now - last_).count();
        const bool new_file = p.file != file_;
        const bool done = p.bytes_done == p.bytes_total;
        if (done && done_printed_) return;
        if (!new_file && !done && since < (tty_ ? 0.5 : 10.0)) return;
        last_ = now;
        file_ = p.file;
        done_printed_ = done;
        const double pct = p.bytes_total ? 100.0 * static_cast<double>(p.bytes_done) / p.bytes_total : 100.0;
        const bool gb = p.bytes_total >= 1000000000ull;
        const double unit = gb ? 1e9 : 1e6;
        std::fprintf(stderr, "%smake-tiny: %.2f / %.2f %s (%5.1f%%)  %s%s", tty_ ? "\r" : "",
                     p.bytes_done / unit, p.bytes_total / unit, gb ? "GB" : "MB", pct, p.file.c_str(),
                     tty_ ? "   " : "\n");
        std::fflush(stderr);
    }
    void finish() {
        if (tty_) std::fprintf(stderr, "\n");
    }

private:
    bool tty_;
    std::chrono::steady_clock::time_point last_;
    std::string file_;
    bool done_printed_ = false;
};

}  // namespace

void add_make_tiny_command(CLI::App& root, std::vector<Command>& out) {
    auto a = std::make_shared<MakeTinyArgs>();
    Command c;
    c.app = root.add_subcommand("make-tiny",
                                "Write a random checkpoint in the released layout (tests, benchmarks)");
    c.app->add_option("OUT_DIR", a->out_dir, "Output directory (must be empty or absent unless --force)")
        ->required();
    c.app
        ->add_option(
            "--preset", a->preset,
            "tiny: the golden tiny-a dimensions; tiny-roles: tiny-a's dimensions with another layer-role "
            "pattern (8 layers, a key-less indexer before the candidate source); full-width: the real "
            "dimensions with --layers layers")
        ->check(CLI::IsMember({"tiny", "tiny-roles", "full-width"}));
    c.app->add_option("--layers", a->layers, "Number of layers (default: tiny 6, tiny-roles 8, full-width 4)")
        ->check(CLI::Range(1, 40));
    c.app->add_option("--seed", a->seed, "Random seed (same seed => byte-identical output; default 0)");
    c.app->add_flag("--force", a->force, "Write into a non-empty OUT_DIR (its stale shards are removed)");
    c.app->add_flag("--headers-only", a->headers_only,
                    "Write every shard as its header plus holes (weights read as zeros): a checkpoint of the "
                    "released size for inspect / validation checks, not for scoring");
    c.app
        ->add_option("--threads", a->threads,
                     "Generator threads (default: all cores; the bytes do not depend on it)")
        ->check(CLI::Range(0, 1024));
    c.app
        ->add_option("--engram-rows", a->engram_rows,
                     "Engram tables of about N rows at the preset's width, written DENSE with random data "
                     "(full width: 264 bytes per row, e.g. 40000000 = 10.6 GB per table) so gathers read the "
                     "disk; default: the preset's tables (full-width: sparse ~98 GB files)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
    c.run = [a]() -> int {
        MakeTinyOptions o;
        o.preset = *tiny_preset_from_name(a->preset);
        o.layers = a->layers;
        o.seed = a->seed;
        o.force = a->force;
        o.threads = a->threads;
        o.headers_only = a->headers_only;
        o.engram_rows = a->engram_rows;
        auto printer = std::make_shared<ProgressPrinter>();
        const bool quiet = global_flags().quiet;
        if (!quiet) o.progress = [printer](const MakeTinyProgress& p) { (*printer)(p); };
        MakeTinyResult r = make_tiny(a->out_dir, o);
        if (quiet) return 0;
        printer->finish();
        std::fprintf(stderr, "%s", r.readme.c_str());
        std::fprintf(stderr, "make-tiny: wrote %zu files (%.3f GB apparent) to %s in %.1f s\n",
                     r.files.size(), r.bytes_on_disk / 1e9, a->out_dir.c_str(), r.seconds);
        return 0;
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
