// Progress and interruption of a long score run (docs/DESIGN.md section 6; issue "the user must see that
// work is happening", "Ctrl-C stops cleanly").
//
// Progress on stderr, one update per layer of each pass (and one for the head), then a summary line
// per pass. `bar` redraws one line (terminals), `plain` prints a line per update (logs, pipes),
// `none` is silent; `auto` picks bar when the stream is a terminal, else plain. Plain lines:
//   pass P layer L/N: T tokens, R tok/s, read G GB/s, wait W s, compute C s, pass ETA E, run X% ETA F
//   pass P head: ...same fields...
//   pass P done: S sequence(s), T tokens in D s (R tok/s); run: T2 tokens in D2 s (R2 tok/s),
//     X% of input, ETA F
// Within a layer that runs longer than kChunkLinesAfterS (a long sequence on a slow backend), the
// chunks done so far, at most one line per kChunkLinesAfterS (bar: per second):
//   pass P layer L/N: R/T tokens of the layer done (X%) in S s, layer ETA E
// P counts passes from 1, L the layers from 1 (N = n_layers). R: pass tokens x fraction of the pass
// done / pass time. G: weight bytes read during the pass / pass time (WeightSource::stats). Pass ETA:
// pass time x (layers left / layers done), the head counting as a layer. Run X% and ETA: the total
// number of tokens of a streamed input is not known in advance, so the run's progress is measured in
// bytes of the input file: (bytes skipped + bytes of completed passes + bytes of this pass x its
// fraction done) / file size; the ETA extrapolates the run time over the bytes that need compute
// (lines skipped for --resume or as bad cost nothing). When the input is a pipe, X% and the run ETA
// print as "?". ETAs print as 1h02m, 3m05s or "?".
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

#include "ds4r/replay.h"

namespace ds4r {

class Progress {
public:
    // mode: auto | bar | plain | none (else InputError). `out`: the stream (stderr); `clock`: seconds
    // on a monotonic clock (steady_clock when empty) — both replaceable for tests.
    Progress(const std::string& mode, int n_layers, std::FILE* out = stderr,
             std::function<double()> clock = {});
    bool silent() const { return mode_ == Mode::None; }

    // Size of the input in bytes (-1: unknown, a pipe) and bytes consumed without compute.
    void set_input_size(int64_t bytes) { input_size_ = bytes; }
    void skip_input(uint64_t bytes) { input_skipped_ += bytes; }
    // A pass of `sequences` sequences and `tokens` tokens read from `input_bytes` bytes of the input.
    void begin_pass(int64_t sequences, int64_t tokens, uint64_t input_bytes);
    // Weight bytes read by the WeightSource so far (for GB/s); call before begin_pass and layer_done.
    void set_bytes_read(uint64_t bytes) { bytes_read_ = bytes; }
    void layer_done(const LayerTiming& t);
    // A chunk of `layer` (kHeadLayer: the head) finished: rows_done of the pass's rows_total rows
    // (tokens) have been through it (PassRunner::set_on_chunk).
    void chunk_done(int layer, int64_t rows_done, int64_t rows_total);
    void end_pass();
    static constexpr double kChunkLinesAfterS = 3.0;

    // The text of the update layer_done / end_pass print (without "\r" or newline).
    std::string layer_line(const LayerTiming& t) const;
    std::string pass_done_line() const;
    std::string chunk_line(int layer, int64_t rows_done, int64_t rows_total) const;

private:
    void emit(const std::string& line, bool final_line);
    // Fraction of the run's input done and the run ETA in seconds (-1 when unknown).
    double run_fraction(double pass_frac) const;
    double run_eta(double pass_frac) const;
    enum class Mode { Bar, Plain, None } mode_;
    int n_layers_;
    std::FILE* out_;
    std::function<double()> clock_;
    int pass_ = 0;  // 1-based index of the current / last pass
    int64_t seqs_ = 0, tokens_ = 0;
    uint64_t pass_input_bytes_ = 0, input_done_ = 0, input_skipped_ = 0;
    int64_t input_size_ = -1;
    int64_t tokens_done_total_ = 0;
    double pass_t0_ = 0, run_t0_ = 0, pass_end_t_ = 0;
    double layer_t0_ = 0;     // when the current layer started (the previous layer line)
    double last_emit_t_ = 0;  // when the last line was printed
    int layers_done_ = 0;
    uint64_t bytes_read_ = 0, bytes_at_pass_start_ = 0;
    size_t last_len_ = 0;
};

// "1h02m", "3m05s", or "?" for a negative / absurd value.
std::string format_eta(double seconds);

// --- Interruption (Ctrl-C, SIGTERM) --------------------------------------------------------------
// install_interrupt_handlers(): the first SIGINT or SIGTERM sets a flag (and prints one line on
// stderr); the run stops at the next layer boundary, commits nothing half-written and exits 130. A
// second signal restores the default action and re-raises it (immediate exit, still safe: results are
// appended and fsynced per pass, and --resume drops any partial tail).
void install_interrupt_handlers();
bool interrupt_requested();
void request_interrupt();  // as if a signal had arrived (tests)
void clear_interrupt();

// Thrown when an interrupt was requested (by the score loop, or by the runner's on_layer callback to
// stop mid-pass). Not a ds4r::Error: the CLI maps it to exit code 130.
class Interrupted : public std::runtime_error {
public:
    explicit Interrupted(int64_t sequences_saved = 0, std::string pass_saved = {})
        : std::runtime_error("interrupted"),
          sequences_saved(sequences_saved),
          pass_saved(std::move(pass_saved)) {}
    int64_t sequences_saved;  // records in the output file (earlier runs included) when it stopped
    // "pass of 12 sequences / 34,567 tokens saved at layer 3 of 6" when the pass in flight was saved
    // (--resume continues it); empty when it was dropped.
    std::string pass_saved;
};
// Throws Interrupted(0) when an interrupt was requested.
void throw_if_interrupted();

}  // namespace ds4r
