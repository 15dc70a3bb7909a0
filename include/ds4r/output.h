// Result output (docs/DESIGN.md section 2): one JSONL record per input sequence, in input order, appended
// and fsynced per completed pass; hidden states as .npy files (one per captured layer).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/file_util.h"
#include "ds4r/replay.h"

namespace ds4r {

// Shortest text that reads back as the same double (C++ to_chars); "NaN"/inf never occur in
// results (asserted by callers).
std::string format_double(double v);

struct HiddenRef {
    int layer = 0;
    std::string file;  // file name relative to the hidden dir
    int64_t row_begin = 0, row_end = 0;
};

// One output line (without the trailing newline). `id_json` is the id as JSON text; `extra_json`
// the carried-through input fields as a JSON object text ("{}" when none). `top_k` alternatives are
// written per position (at most those in `s`); top_k 0 omits the topk_ids / topk_logprobs fields
// (docs/FORMATS.md). `tokens`, when given, is echoed as "tokens" after "n_tokens".
std::string format_record(const std::string& id_json, const SequenceScores& s, int top_k,
                          const std::vector<HiddenRef>& hidden, const std::string& extra_json,
                          const std::vector<int32_t>* tokens = nullptr);
// A record for an input line that could not be scored (--skip-bad).
std::string format_error_record(const std::string& id_json, int64_t line, const std::string& message);

// Appends whole lines and makes them durable: a line is never half-written as seen by a reader
// that truncates to the last newline (see --resume), and commit() fsyncs.
class ResultWriter {
public:
    // path "-" = stdout (flushed, not fsynced); a FIFO or device path is written, not fsynced.
    explicit ResultWriter(const std::string& path);
    void append(const std::string& line);  // buffered until commit()
    void commit();                         // write + fsync the buffered lines
    // Commits the buffered lines and, in the same step, replaces existing lines (by 0-based index
    // among the file's non-blank lines; --skip-bad error records retried on resume): the new file
    // is written beside the old one and renamed over it, so a crash leaves the old or the new file.
    void commit_replacing(const std::map<int64_t, std::string>& replaced);
    void discard() {  // drop the lines not yet committed (an interrupted pass)
        pending_.clear();
        pending_lines_ = 0;
    }
    const std::string& path() const { return path_; }
    int64_t lines_committed() const { return committed_; }  // by this writer

private:
    std::string path_;
    bool stdout_ = false;
    bool regular_ = false;  // a regular file (fsynced); else a FIFO / device (written only)
    FileHandle fh_;
    std::string pending_;
    int64_t pending_lines_ = 0, committed_ = 0;
};

// Layout of hidden_L<layer>.npy: mean / final: fp16 [rows, D]; copies: bf16 bit patterns as <u2
// [rows, hc, D].
struct HiddenLayout {
    std::string descr;  // numpy dtype
    Shape row_shape;    // one row
    int64_t row_elems = 0;
};
HiddenLayout hidden_layout(HiddenMode mode, int layer, int n_layers, int64_t dim, int64_t hc);
constexpr size_t kHiddenHeaderBytes = 128;  // the writer's fixed .npy header (room for any shape)

// Hidden-state capture files: <dir>/hidden_L<layer>.npy, every sequence's rows in input order.
// The npy header is rewritten with the final row count at every commit (it reserves room for any
// count), so a committed file is always a valid .npy whose rows match the committed records.
class HiddenNpyWriter : public HiddenSink {
public:
    HiddenNpyWriter(std::string dir, int n_layers, HiddenMode mode, int64_t dim, int64_t hc);
    // Opens (or, on resume, truncates to `rows_kept` rows and reopens) the layer's file. A pass saved
    // mid-way (Ctrl-C) also keeps its `rows_pending` uncommitted rows after them (see restore_refs).
    void open_layer(int layer, int64_t rows_kept = 0, int64_t rows_pending = 0);
    void add_rows(int layer, int seq, const uint16_t* data, int64_t rows, int64_t row_elems) override;
    // Rows [begin, end) written for (layer, seq) since the last clear_refs().
    std::vector<HiddenRef> refs_for(int seq) const;
    void clear_refs();
    // The refs of the uncommitted rows (a pass being saved mid-way) and their restoration on resume
    // (after open_layer kept the rows): layer -> seq -> [begin, end).
    std::map<int, std::vector<HiddenRef>> pending_refs() const { return refs_; }
    void restore_refs(const std::map<int, std::vector<HiddenRef>>& refs) { refs_ = refs; }
    std::map<int, int64_t> committed_rows() const;  // layer -> rows its header announces
    // fsync of the rows written so far (a saved pass keeps them), header unchanged.
    void sync_data();
    void commit();  // fsync data, rewrite the header with the current row count, fsync
    // Drops the rows added since the last commit (an interrupted pass): truncates every file back to
    // its committed rows and forgets the refs.
    void rollback();
    void restart_pass() override { rollback(); }  // the pass's rows are its uncommitted ones
    std::string file_name(int layer) const;

private:
    struct LayerFile {
        FileHandle fh;
        int64_t rows = 0;            // rows written
        int64_t committed_rows = 0;  // rows the header announces (after the last commit)
        int64_t row_elems = 0;
        std::string descr;
        Shape row_shape;
    };
    std::string dir_;
    int n_layers_;
    HiddenMode mode_;
    int64_t dim_, hc_;
    std::map<int, LayerFile> files_;
    std::map<int, std::vector<HiddenRef>> refs_;  // by seq index in the current pass
};

}  // namespace ds4r
