// Hidden-state .npy files (docs/DESIGN.md "Hidden states"): rows appended per pass, header rewritten at
// every commit so the file is always a valid .npy of exactly the committed rows.
#include <fcntl.h>
#include <unistd.h>

#include "ds4r/npy.h"
#include "ds4r/output.h"

namespace ds4r {

namespace {
// Room for any shape we can write (the largest header is ~90 bytes): a rewrite never moves data.
constexpr size_t kHeaderBytes = kHiddenHeaderBytes;
}  // namespace

HiddenLayout hidden_layout(HiddenMode mode, int layer, int n_layers, int64_t dim, int64_t hc) {
    const bool copies = mode == HiddenMode::Copies && layer < n_layers;
    HiddenLayout l;
    l.descr = copies ? "<u2" : "<f2";
    l.row_shape = copies ? Shape{hc, dim} : Shape{dim};
    l.row_elems = copies ? hc * dim : dim;
    return l;
}

HiddenNpyWriter::HiddenNpyWriter(std::string dir, int n_layers, HiddenMode mode, int64_t dim, int64_t hc)
    : dir_(std::move(dir)), n_layers_(n_layers), mode_(mode), dim_(dim), hc_(hc) {
    make_dirs(dir_);
}

std::string HiddenNpyWriter::file_name(int layer) const {
    return "hidden_L" + std::to_string(layer) + ".npy";
}

void HiddenNpyWriter::open_layer(int layer, int64_t rows_kept, int64_t rows_pending) {
    LayerFile lf;
    const HiddenLayout layout = hidden_layout(mode_, layer, n_layers_, dim_, hc_);
    lf.descr = layout.descr;
    lf.row_shape = layout.row_shape;
    lf.row_elems = layout.row_elems;
    const std::string path = path_join(dir_, file_name(layer));
    const uint64_t keep = kHeaderBytes + static_cast<uint64_t>((rows_kept + rows_pending) * lf.row_elems) * 2;
    // Checked before the file is created or cut (a failed resume changes nothing).
    if (rows_kept + rows_pending > 0 && (!file_exists(path) || FileHandle(path, O_RDONLY).size() < keep))
        throw RuntimeError(
            strfmt("%s: holds fewer rows than the results file references (%lld); cannot resume",
                   path.c_str(), (long long)(rows_kept + rows_pending)));
    lf.fh = FileHandle(path, O_RDWR | O_CREAT, 0644);
    if (::ftruncate(lf.fh.fd(), static_cast<off_t>(keep)) != 0)
        throw RuntimeError(strfmt("%s: ftruncate failed (%s)", path.c_str(), errno_text(errno).c_str()));
    lf.rows = rows_kept + rows_pending;
    lf.committed_rows = rows_kept;
    files_[layer] = std::move(lf);
    // Write a valid header now (0 rows for a new file; the committed rows on resume).
    auto& f = files_[layer];
    Shape shape{f.committed_rows};
    shape.insert(shape.end(), f.row_shape.begin(), f.row_shape.end());
    std::string h = npy_header(f.descr, shape, kHeaderBytes);
    DS4R_CHECK(h.size() == kHeaderBytes, "npy header size %zu != %zu", h.size(), kHeaderBytes);
    if (::pwrite(f.fh.fd(), h.data(), h.size(), 0) != static_cast<ssize_t>(h.size()))
        throw RuntimeError(strfmt("%s: header write failed", path.c_str()));
    f.fh.fsync_or_throw();
    fsync_parent_dir(path);
}

void HiddenNpyWriter::add_rows(int layer, int seq, const uint16_t* data, int64_t rows, int64_t row_elems) {
    auto it = files_.find(layer);
    if (it == files_.end()) {
        open_layer(layer, 0);
        it = files_.find(layer);
    }
    LayerFile& f = it->second;
    DS4R_CHECK(row_elems == f.row_elems, "hidden rows of layer %d have %lld elements, expected %lld", layer,
               (long long)row_elems, (long long)f.row_elems);
    const uint64_t off = kHeaderBytes + static_cast<uint64_t>(f.rows * f.row_elems) * 2;
    const size_t bytes = static_cast<size_t>(rows * row_elems) * 2;
    const auto* p = reinterpret_cast<const uint8_t*>(data);
    size_t done = 0;
    while (done < bytes) {
        ssize_t w = ::pwrite(f.fh.fd(), p + done, bytes - done, static_cast<off_t>(off + done));
        if (w < 0) {
            if (errno == EINTR) continue;
            throw RuntimeError(
                strfmt("%s: write failed (%s)", f.fh.path().c_str(), errno_text(errno).c_str()));
        }
        done += static_cast<size_t>(w);
    }
    refs_[seq].push_back(HiddenRef{layer, file_name(layer), f.rows, f.rows + rows});
    f.rows += rows;
}

std::vector<HiddenRef> HiddenNpyWriter::refs_for(int seq) const {
    auto it = refs_.find(seq);
    return it == refs_.end() ? std::vector<HiddenRef>{} : it->second;
}

void HiddenNpyWriter::clear_refs() {
    refs_.clear();
}

std::map<int, int64_t> HiddenNpyWriter::committed_rows() const {
    std::map<int, int64_t> rows;
    for (const auto& [layer, f] : files_) rows[layer] = f.committed_rows;
    return rows;
}

void HiddenNpyWriter::sync_data() {
    for (auto& [layer, f] : files_) f.fh.fsync_or_throw();
}

void HiddenNpyWriter::commit() {
    for (auto& [layer, f] : files_) {
        f.fh.fsync_or_throw();
        Shape shape{f.rows};
        shape.insert(shape.end(), f.row_shape.begin(), f.row_shape.end());
        std::string h = npy_header(f.descr, shape, kHeaderBytes);
        if (::pwrite(f.fh.fd(), h.data(), h.size(), 0) != static_cast<ssize_t>(h.size()))
            throw RuntimeError(strfmt("%s: header write failed", f.fh.path().c_str()));
        f.fh.fsync_or_throw();
        f.committed_rows = f.rows;
    }
}

void HiddenNpyWriter::rollback() {
    for (auto& [layer, f] : files_) {
        if (f.rows == f.committed_rows) continue;
        const uint64_t keep = kHeaderBytes + static_cast<uint64_t>(f.committed_rows * f.row_elems) * 2;
        if (::ftruncate(f.fh.fd(), static_cast<off_t>(keep)) != 0)
            throw RuntimeError(
                strfmt("%s: ftruncate failed (%s)", f.fh.path().c_str(), errno_text(errno).c_str()));
        f.rows = f.committed_rows;
        f.fh.fsync_or_throw();
    }
    refs_.clear();
}

}  // namespace ds4r
