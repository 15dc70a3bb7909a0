// Streaming safetensors writer: planned header, pwrite of bounded chunks, sparse holes, atomic rename.
#include "checkpoint/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"

namespace ds4r {

int64_t SafetensorsLayout::find(const std::string& name) const {
    auto it = std::lower_bound(entries.begin(), entries.end(), name,
                               [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
    if (it == entries.end() || it->name != name) return -1;
    return it - entries.begin();
}

SafetensorsLayout plan_safetensors(std::vector<SafetensorsEntry> entries,
                                   const std::map<std::string, std::string>& metadata) {
    std::sort(entries.begin(), entries.end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
    SafetensorsLayout L;
    std::string h = "{";
    if (!metadata.empty()) {
        h += "\"__metadata__\":";
        h += nlohmann::json(metadata).dump();
    }
    uint64_t off = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        if (e.name.empty() || e.name == "__metadata__")
            DS4R_THROW(RuntimeError, "safetensors writer: invalid tensor name '%s'", e.name.c_str());
        if (i > 0 && entries[i - 1].name == e.name)
            DS4R_THROW(RuntimeError, "safetensors writer: duplicate tensor name '%s'", e.name.c_str());
        uint64_t n = dtype_size(e.dtype);
        for (int64_t d : e.shape) {
            if (d < 0)
                DS4R_THROW(RuntimeError, "safetensors writer: tensor '%s' has a negative dim in %s",
                           e.name.c_str(), shape_str(e.shape).c_str());
            n *= static_cast<uint64_t>(d);
        }
        L.offsets.push_back(off);
        L.sizes.push_back(n);
        if (h.size() > 1) h += ",";
        h += nlohmann::json(e.name).dump();
        h += ":{\"dtype\":\"";
        h += dtype_name(e.dtype);
        h += "\",\"shape\":[";
        for (size_t d = 0; d < e.shape.size(); ++d) {
            if (d) h += ",";
            h += std::to_string(e.shape[d]);
        }
        h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + n) + "]}";
        off += n;
    }
    h += "}";
    // Space padding to a multiple of 8, as the safetensors library does (keeps data 8-aligned).
    while ((8 + h.size()) % 8 != 0) h += ' ';
    L.entries = std::move(entries);
    L.header = std::move(h);
    L.data_start = 8 + L.header.size();
    L.file_size = L.data_start + off;
    return L;
}

SafetensorsWriter::SafetensorsWriter(std::string path, SafetensorsLayout layout)
    : path_(std::move(path)),
      tmp_(path_ + ".tmp." + std::to_string(::getpid())),
      layout_(std::move(layout)),
      written_(layout_.entries.size(), 0),
      zero_(layout_.entries.size(), 0) {
    fh_ = FileHandle(tmp_, O_RDWR | O_CREAT | O_TRUNC, 0644);
    uint8_t len[8];
    uint64_t n = layout_.header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    try {
        fh_.write_all(len, 8);
        fh_.write_all(layout_.header.data(), layout_.header.size());
        if (::ftruncate(fh_.fd(), static_cast<off_t>(layout_.file_size)) != 0)
            DS4R_THROW(RuntimeError, "%s: cannot size the file to %llu bytes (%s)", tmp_.c_str(),
                       (unsigned long long)layout_.file_size, errno_text(errno).c_str());
    } catch (...) {
        fh_ = FileHandle();
        ::unlink(tmp_.c_str());
        throw;
    }
}

SafetensorsWriter::~SafetensorsWriter() {
    if (!done_) {
        fh_ = FileHandle();
        ::unlink(tmp_.c_str());
    }
}

void SafetensorsWriter::write(size_t i, uint64_t offset, const void* data, size_t n) {
    DS4R_CHECK(i < layout_.entries.size(), "%s: tensor index %zu out of range", path_.c_str(), i);
    const auto& name = layout_.entries[i].name;
    DS4R_CHECK(!zero_[i], "%s: tensor '%s' was declared zero", path_.c_str(), name.c_str());
    DS4R_CHECK(offset == written_[i], "%s: tensor '%s' written out of order (offset %llu, expected %llu)",
               path_.c_str(), name.c_str(), (unsigned long long)offset, (unsigned long long)written_[i]);
    DS4R_CHECK(n <= layout_.sizes[i] - written_[i], "%s: tensor '%s' overflows its %llu bytes", path_.c_str(),
               name.c_str(), (unsigned long long)layout_.sizes[i]);
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t pos = layout_.data_start + layout_.offsets[i] + offset;
    size_t left = n;
    while (left > 0) {
        ssize_t w = ::pwrite(fh_.fd(), p, left, static_cast<off_t>(pos));
        if (w < 0) {
            if (errno == EINTR) continue;
            DS4R_THROW(RuntimeError, "%s: write of tensor '%s' failed (%s)", tmp_.c_str(), name.c_str(),
                       errno_text(errno).c_str());
        }
        p += w;
        pos += static_cast<uint64_t>(w);
        left -= static_cast<size_t>(w);
    }
    written_[i] += n;
}

void SafetensorsWriter::leave_zero(size_t i) {
    DS4R_CHECK(i < layout_.entries.size(), "%s: tensor index %zu out of range", path_.c_str(), i);
    DS4R_CHECK(written_[i] == 0, "%s: tensor '%s' already has data", path_.c_str(),
               layout_.entries[i].name.c_str());
    zero_[i] = 1;
}

void SafetensorsWriter::commit() {
    DS4R_CHECK(!done_, "%s: committed twice", path_.c_str());
    for (size_t i = 0; i < layout_.entries.size(); ++i)
        DS4R_CHECK(zero_[i] || written_[i] == layout_.sizes[i],
                   "%s: tensor '%s' incomplete (%llu of %llu bytes written)", path_.c_str(),
                   layout_.entries[i].name.c_str(), (unsigned long long)written_[i],
                   (unsigned long long)layout_.sizes[i]);
    fh_.fsync_or_throw();
    fh_.close();
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
        DS4R_THROW(RuntimeError, "%s: rename from %s failed (%s)", path_.c_str(), tmp_.c_str(),
                   errno_text(errno).c_str());
    done_ = true;
    fsync_parent_dir(path_);
}

}  // namespace ds4r
