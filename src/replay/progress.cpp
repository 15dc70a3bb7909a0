// Progress lines and the interrupt flag of a score run (include/ds4r/progress.h).
#include "ds4r/progress.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>

#include "ds4r/error.h"
#include "ds4r/plural.h"

namespace ds4r {

namespace {

double steady_now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string format_eta(double s) {
    if (!(s >= 0) || s > 1e8) return "?";
    const long long t = static_cast<long long>(s + 0.5);
    const long long h = t / 3600, m = (t / 60) % 60, sec = t % 60;
    return h ? strfmt("%lldh%02lldm", h, m) : strfmt("%lldm%02llds", m, sec);
}

Progress::Progress(const std::string& mode, int n_layers, std::FILE* out, std::function<double()> clock)
    : n_layers_(n_layers),
      out_(out),
      clock_(clock ? std::move(clock) : std::function<double()>(steady_now_s)) {
    if (mode == "none")
        mode_ = Mode::None;
    else if (mode == "plain")
        mode_ = Mode::Plain;
    else if (mode == "bar")
        mode_ = Mode::Bar;
    else if (mode == "auto")
        mode_ = isatty(fileno(out_)) ? Mode::Bar : Mode::Plain;
    else
        throw InputError("--progress must be auto, bar, plain or none, not '" + mode + "'");
    run_t0_ = clock_();
}

void Progress::begin_pass(int64_t sequences, int64_t tokens, uint64_t input_bytes) {
    ++pass_;
    seqs_ = sequences;
    tokens_ = tokens;
    pass_input_bytes_ = input_bytes;
    pass_t0_ = clock_();
    layer_t0_ = pass_t0_;
    layers_done_ = 0;
    bytes_at_pass_start_ = bytes_read_;
}

double Progress::run_fraction(double pass_frac) const {
    if (input_size_ <= 0) return -1;
    const double done = static_cast<double>(input_skipped_ + input_done_) +
                        static_cast<double>(pass_input_bytes_) * pass_frac;
    return std::min(1.0, done / static_cast<double>(input_size_));
}

double Progress::run_eta(double pass_frac) const {
    if (input_size_ <= 0) return -1;
    // Only the bytes that need compute count: skipped lines (resume, bad) took no time.
    const double need = static_cast<double>(input_size_) - static_cast<double>(input_skipped_);
    const double done = static_cast<double>(input_done_) + static_cast<double>(pass_input_bytes_) * pass_frac;
    const double el = clock_() - run_t0_;
    if (done <= 0 || el <= 0) return -1;
    return std::max(0.0, el * (need - done) / done);
}

std::string Progress::layer_line(const LayerTiming& t) const {
    const double el = clock_() - pass_t0_;
    const int steps = n_layers_ + 1;  // layers + head
    const double frac = std::min(1.0, static_cast<double>(layers_done_) / steps);
    const double pass_eta = frac > 0 && el > 0 ? el / frac - el : -1;
    const double tps = el > 0 ? static_cast<double>(tokens_) * frac / el : 0;
    const double gbs = el > 0 ? static_cast<double>(bytes_read_ - bytes_at_pass_start_) / el / 1e9 : 0;
    const std::string what =
        t.layer < 0 ? std::string("head") : strfmt("layer %d/%d", t.layer + 1, n_layers_);
    const double rf = run_fraction(frac);
    return strfmt(
        "pass %d %s: %lld tokens, %.0f tok/s, read %.2f GB/s, wait %.2fs, compute %.2fs, pass ETA %s, run %s "
        "ETA %s",
        pass_, what.c_str(), (long long)tokens_, tps, gbs, t.stall_s(), t.compute_s,
        format_eta(pass_eta).c_str(), rf < 0 ? "?" : strfmt("%.0f%%", 100 * rf).c_str(),
        format_eta(run_eta(frac)).c_str());
}

std::string Progress::pass_done_line() const {
    const double el = pass_end_t_ - pass_t0_, tot = pass_end_t_ - run_t0_;
    const double rf = run_fraction(0);
    return strfmt(
        "pass %d done: %s, %lld tokens in %.2fs (%.0f tok/s); run: %lld tokens in %.1fs (%.0f "
        "tok/s), "
        "%s of input, ETA %s",
        pass_, plural(seqs_, "sequence").c_str(), (long long)tokens_, el, el > 0 ? tokens_ / el : 0.0,
        (long long)tokens_done_total_, tot, tot > 0 ? tokens_done_total_ / tot : 0.0,
        rf < 0 ? "?" : strfmt("%.0f%%", 100 * rf).c_str(), format_eta(run_eta(0)).c_str());
}

std::string Progress::chunk_line(int layer, int64_t rows_done, int64_t rows_total) const {
    const std::string what = layer < 0 ? std::string("head") : strfmt("layer %d/%d", layer + 1, n_layers_);
    const double el = clock_() - layer_t0_;
    const double pct = rows_total > 0 ? 100.0 * static_cast<double>(rows_done) / rows_total : 100.0;
    const double left = rows_done > 0 ? el * static_cast<double>(rows_total - rows_done) / rows_done : -1;
    return strfmt("pass %d %s: %lld/%lld tokens of the layer done (%.0f%%) in %.1fs, layer ETA %s", pass_,
                  what.c_str(), (long long)rows_done, (long long)rows_total, pct, el,
                  format_eta(left).c_str());
}

void Progress::chunk_done(int layer, int64_t rows_done, int64_t rows_total) {
    if (mode_ == Mode::None || rows_done >= rows_total) return;  // the layer line follows
    const double now = clock_();
    // Only layers slow enough that the user would otherwise wait without a word.
    if (now - layer_t0_ < kChunkLinesAfterS) return;
    if (now - last_emit_t_ < (mode_ == Mode::Bar ? 1.0 : kChunkLinesAfterS)) return;
    emit(chunk_line(layer, rows_done, rows_total), false);
}

void Progress::layer_done(const LayerTiming& t) {
    // from the layer, not a count: a pass run again after running out of memory starts over
    layers_done_ = t.layer < 0 ? n_layers_ + 1 : t.layer + 1;
    layer_t0_ = clock_();
    if (mode_ == Mode::None) return;
    emit(layer_line(t), false);
}

void Progress::end_pass() {
    tokens_done_total_ += tokens_;
    input_done_ += pass_input_bytes_;
    pass_input_bytes_ = 0;
    pass_end_t_ = clock_();
    if (mode_ == Mode::None) return;
    emit(pass_done_line(), true);
}

void Progress::emit(const std::string& line, bool final_line) {
    last_emit_t_ = clock_();
    if (mode_ == Mode::Bar) {
        std::string pad = line.size() < last_len_ ? std::string(last_len_ - line.size(), ' ') : "";
        std::fprintf(out_, "\r%s%s%s", line.c_str(), pad.c_str(), final_line ? "\n" : "");
        last_len_ = final_line ? 0 : line.size();
    } else {
        std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
}

// --- interruption ---------------------------------------------------------------------------------

namespace {

std::atomic<int> g_interrupts{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_interrupt_signal(int sig) {
    const int n = g_interrupts.fetch_add(1) + 1;
    if (n == 1) {
        static const char msg[] =
            "\nds4replay: stopping at the next layer boundary (nothing half-written); interrupt again to "
            "quit now\n";
        ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        return;
    }
    // Second signal: the default action, now.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

}  // namespace

void install_interrupt_handlers() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt_signal;
    sigemptyset(&sa.sa_mask);
    // SA_RESTART: reads and writes elsewhere (the prefetch threads, the input reader) resume
    // instead of failing with EINTR; the flag is polled at layer and pass boundaries.
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM})
        if (::sigaction(sig, &sa, nullptr) != 0)
            throw RuntimeError(
                strfmt("cannot install the handler of signal %d (%s)", sig, errno_text(errno).c_str()));
}

bool interrupt_requested() {
    return g_interrupts.load(std::memory_order_relaxed) > 0;
}
void request_interrupt() {
    g_interrupts.fetch_add(1);
}
void clear_interrupt() {
    g_interrupts.store(0);
}

void throw_if_interrupted() {
    if (interrupt_requested()) throw Interrupted(0);
}

}  // namespace ds4r
