// A pass saved mid-way (src/replay/pass_state.h) and the runner's state blobs.
#include "replay/pass_state.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/replay.h"

namespace ds4r {

using json = nlohmann::json;

namespace {
constexpr char kMagic[8] = {'D', 'S', '4', 'R', 'P', 'A', 'S', 'S'};
constexpr size_t kCopyBytes = size_t{64} << 20;  // bounce buffer for the backend arenas
}  // namespace

int64_t SavedPass::total_tokens() const {
    int64_t n = 0;
    for (const auto& t : tokens) n += static_cast<int64_t>(t.size());
    return n;
}

std::map<int, int64_t> SavedPass::hidden_pending() const {
    std::map<int, int64_t> rows;
    for (const auto& [seq, refs] : hidden_refs)
        for (const HiddenRef& r : refs) rows[r.layer] += r.row_end - r.row_begin;
    return rows;
}

std::string pass_state_path(const std::string& output) {
    return output + ".pass";
}

// --- the runner's state ----------------------------------------------------------------------------

std::vector<std::pair<std::string, uint64_t>> PassRunner::state_blobs() const {
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim;
    return {
        {"stream", static_cast<uint64_t>(total_rows_ * hc * D) * 2},  // BF16 [rows, hc, D]
        {"premix", static_cast<uint64_t>(total_rows_ * hc) * 4},      // F32 [rows, hc]
        {"slots", ctx_.seqs.size() * 3 * 8},                          // I64 [seqs, 3]
        {"cmp_kv", ctx_.cmp_kv.nbytes()},                             // BF16 [rows, hd]
        {"index_k", ctx_.index_k.nbytes()},                           // BF16 [rows, ihd]
        {"topk", ctx_.topk.nbytes()},                                 // I32 [sum len * topk_cap]
        {"cand", ctx_.cand.nbytes()},                                 // U32 [sum len * cand_cap]
    };
}

void PassRunner::write_state(AtomicFileWriter& out) {
    be_.synchronize();
    const auto blobs = state_blobs();
    out.write(stream_.get(), blobs[0].second);
    out.write(premix_.get(), blobs[1].second);
    std::vector<int64_t> slots;
    for (const SeqInfo& s : ctx_.seqs) slots.insert(slots.end(), {s.cmp_rows, s.topk_width, s.cand_words});
    out.write(slots.data(), slots.size() * 8);
    std::shared_ptr<void> bounce = be_.alloc_host(kCopyBytes);
    for (const Tensor* t : {&ctx_.cmp_kv, &ctx_.index_k, &ctx_.topk, &ctx_.cand})
        for (size_t off = 0; off < t->nbytes(); off += kCopyBytes) {
            const size_t n = std::min(kCopyBytes, t->nbytes() - off);
            be_.download(bounce.get(), *t, off, n);
            be_.synchronize();
            out.write(bounce.get(), n);
        }
}

void PassRunner::read_state(const FileHandle& in, uint64_t offset) {
    const auto blobs = state_blobs();
    in.pread_exact(stream_.get(), blobs[0].second, offset);
    offset += blobs[0].second;
    in.pread_exact(premix_.get(), blobs[1].second, offset);
    offset += blobs[1].second;
    std::vector<int64_t> slots(ctx_.seqs.size() * 3);
    in.pread_exact(slots.data(), slots.size() * 8, offset);
    offset += blobs[2].second;
    for (size_t i = 0; i < ctx_.seqs.size(); ++i) {
        ctx_.seqs[i].cmp_rows = slots[3 * i];
        ctx_.seqs[i].topk_width = slots[3 * i + 1];
        ctx_.seqs[i].cand_words = slots[3 * i + 2];
    }
    std::shared_ptr<void> bounce = be_.alloc_host(kCopyBytes);
    for (const Tensor* t : {&ctx_.cmp_kv, &ctx_.index_k, &ctx_.topk, &ctx_.cand})
        for (size_t off = 0; off < t->nbytes(); off += kCopyBytes) {
            const size_t n = std::min(kCopyBytes, t->nbytes() - off);
            in.pread_exact(bounce.get(), n, offset);
            offset += n;
            be_.upload(*t, off, bounce.get(), n);
            be_.synchronize();
        }
}

// --- the file --------------------------------------------------------------------------------------

void save_pass_state(const std::string& path, SavedPass h, PassRunner& runner) {
    h.blobs = runner.state_blobs();
    json j;
    j["manifest"] = h.manifest_json;
    j["records_before"] = h.records_before;
    j["next_layer"] = h.next_layer;
    j["n_layers"] = h.n_layers;
    json items = json::array();
    for (const auto& it : h.items)
        items.push_back({{"pos", it.pos}, {"id", it.id_json}, {"bad", it.bad}, {"replaces", it.replaces}});
    j["items"] = items;
    j["tokens"] = h.tokens;
    json hidden = json::array();
    for (const auto& [L, rows] : h.hidden_committed) hidden.push_back({{"layer", L}, {"committed", rows}});
    j["hidden_committed"] = hidden;
    json refs = json::array();
    for (const auto& [seq, rs] : h.hidden_refs)
        for (const HiddenRef& r : rs)
            refs.push_back(
                {{"seq", seq}, {"layer", r.layer}, {"file", r.file}, {"rows", {r.row_begin, r.row_end}}});
    j["hidden_refs"] = refs;
    json blobs = json::array();
    for (const auto& [name, bytes] : h.blobs) blobs.push_back({{"name", name}, {"bytes", bytes}});
    j["blobs"] = blobs;
    const std::string text = j.dump();
    AtomicFileWriter out(path);
    out.write(kMagic, sizeof kMagic);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    out.write(len, sizeof len);
    out.write(text);
    runner.write_state(out);
    out.commit();
}

SavedPass read_pass_header(const std::string& path) {
    FileHandle f(path, O_RDONLY);
    const uint64_t size = f.size();
    auto bad = [&](const std::string& what) {
        return InputError(path + ": not a saved pass of ds4replay (" + what +
                          "); remove it to run the pass again from its start");
    };
    uint8_t head[16];
    if (size < sizeof head) throw bad("too short");
    f.pread_exact(head, sizeof head, 0);
    if (std::memcmp(head, kMagic, sizeof kMagic) != 0) throw bad("bad magic");
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(head[8 + i]) << (8 * i);
    if (len > size - sizeof head || len > (uint64_t{1} << 32)) throw bad("header length past the end");
    std::string text(static_cast<size_t>(len), '\0');
    f.pread_exact(text.data(), text.size(), sizeof head);
    SavedPass h;
    try {
        const json j = json::parse(text);
        h.manifest_json = j.at("manifest").get<std::string>();
        h.records_before = j.at("records_before").get<int64_t>();
        h.next_layer = j.at("next_layer").get<int>();
        h.n_layers = j.at("n_layers").get<int>();
        for (const auto& it : j.at("items"))
            h.items.push_back({it.at("pos").get<int64_t>(), it.at("id").get<std::string>(),
                               it.at("bad").get<bool>(), it.at("replaces").get<int64_t>()});
        h.tokens = j.at("tokens").get<std::vector<std::vector<int32_t>>>();
        for (const auto& x : j.at("hidden_committed"))
            h.hidden_committed[x.at("layer").get<int>()] = x.at("committed").get<int64_t>();
        for (const auto& x : j.at("hidden_refs")) {
            HiddenRef r;
            r.layer = x.at("layer").get<int>();
            r.file = x.at("file").get<std::string>();
            r.row_begin = x.at("rows").at(0).get<int64_t>();
            r.row_end = x.at("rows").at(1).get<int64_t>();
            if (r.row_end < r.row_begin) throw bad("hidden rows end before they begin");
            h.hidden_refs[x.at("seq").get<int>()].push_back(r);
        }
        for (const auto& x : j.at("blobs"))
            h.blobs.emplace_back(x.at("name").get<std::string>(), x.at("bytes").get<uint64_t>());
    } catch (const json::exception& e) {
        throw bad(std::string("malformed header: ") + e.what());
    }
    h.data_offset = sizeof head + len;
    uint64_t total = 0;
    for (const auto& b : h.blobs) total += b.second;
    if (total != size - h.data_offset)
        throw bad(strfmt("holds %llu bytes of state, its header announces %llu",
                         (unsigned long long)(size - h.data_offset), (unsigned long long)total));
    if (h.next_layer < 1 || h.next_layer > h.n_layers) throw bad("layer out of range");
    if (h.items.empty() || h.tokens.empty()) throw bad("no sequences");
    return h;
}

void load_pass_state(const std::string& path, const SavedPass& h, PassRunner& runner) {
    if (runner.state_blobs() != h.blobs)
        throw InputError(path +
                         ": the saved pass's state does not have the sizes of this pass (another model "
                         "or a change of ds4replay?); remove it to run the pass again from its start");
    FileHandle f(path, O_RDONLY);
    runner.read_state(f, h.data_offset);
}

}  // namespace ds4r
