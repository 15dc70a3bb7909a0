#include "ds4r/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "ds4r/error.h"

namespace ds4r {

namespace {
double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}
std::string fmt_eta(double s) {
    if (s < 0 || s > 1e7) return "?";
    int h = static_cast<int>(s / 3600), m = static_cast<int>(s / 60) % 60, sec = static_cast<int>(s) % 60;
    return h ? strfmt("%dh%02dm", h, m) : strfmt("%dm%02ds", m, sec);
}
}  // namespace

Progress::Progress(const std::string& mode, int n_layers) : n_layers_(n_layers), run_t0_(now_s()) {
    if (mode == "none")
        mode_ = Mode::None;
    else if (mode == "plain")
        mode_ = Mode::Plain;
    else if (mode == "bar")
        mode_ = Mode::Bar;
    else if (mode == "auto")
        mode_ = isatty(STDERR_FILENO) ? Mode::Bar : Mode::Plain;
    else
        throw InputError("--progress must be auto, bar, plain or none, not '" + mode + "'");
}

void Progress::begin_pass(int pass_index, int64_t tokens) {
    pass_ = pass_index;
    tokens_ = tokens;
    pass_t0_ = now_s();
    layers_done_ = 0;
    bytes_at_pass_start_ = bytes_read_;
}

void Progress::layer_done(const LayerTiming& t) {
    if (mode_ == Mode::None) return;
    ++layers_done_;
    const double el = now_s() - pass_t0_;
    const int total = n_layers_ + 1;  // layers + head
    const double frac = static_cast<double>(layers_done_) / total;
    const double eta = frac > 0 ? el / frac - el : -1;
    const double tps = el > 0 ? static_cast<double>(tokens_) * frac / el : 0;
    const double gbs = el > 0 ? static_cast<double>(bytes_read_ - bytes_at_pass_start_) / el / 1e9 : 0;
    std::string what = t.layer < 0 ? std::string("head") : strfmt("layer %d/%d", t.layer + 1, n_layers_);
    emit(strfmt("pass %d: %s  %lld tokens  %.0f tok/s  wait %.2fs compute %.2fs  read %.2f GB/s  pass ETA %s",
                pass_ + 1, what.c_str(), (long long)tokens_, tps, t.wait_s, t.compute_s, gbs, fmt_eta(eta).c_str()),
         false);
}

void Progress::end_pass() {
    if (mode_ == Mode::None) return;
    tokens_done_total_ += tokens_;
    const double el = now_s() - pass_t0_, tot = now_s() - run_t0_;
    emit(strfmt("pass %d done: %lld tokens in %.2fs (%.0f tok/s); %lld tokens in %.1fs overall", pass_ + 1,
                (long long)tokens_, el, el > 0 ? tokens_ / el : 0.0, (long long)tokens_done_total_, tot),
         true);
}

void Progress::emit(const std::string& line, bool final_line) {
    if (mode_ == Mode::Bar) {
        std::string pad = line.size() < last_len_ ? std::string(last_len_ - line.size(), ' ') : "";
        std::fprintf(stderr, "\r%s%s%s", line.c_str(), pad.c_str(), final_line ? "\n" : "");
        last_len_ = final_line ? 0 : line.size();
    } else {
        std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
}

}  // namespace ds4r
