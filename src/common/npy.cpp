#include "ds4r/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "ds4r/error.h"
#include "ds4r/file_util.h"

namespace ds4r {

size_t NpyArray::item_size() const {
    if (descr.size() < 3) return 0;
    return static_cast<size_t>(std::atoi(descr.c_str() + 2));
}

namespace {

// Finds `'key': value` in the header dict and returns the text of value (up to the next top-level
// comma or closing brace).
bool header_value(const std::string& h, const std::string& key, std::string& out) {
    std::string pat = "'" + key + "'";
    size_t p = h.find(pat);
    if (p == std::string::npos) return false;
    p = h.find(':', p + pat.size());
    if (p == std::string::npos) return false;
    ++p;
    while (p < h.size() && h[p] == ' ') ++p;
    int depth = 0;
    size_t q = p;
    for (; q < h.size(); ++q) {
        char c = h[q];
        if (c == '(' || c == '[') ++depth;
        if (c == ')' || c == ']') --depth;
        if (depth == 0 && (c == ',' || c == '}')) break;
        if (depth < 0) break;
    }
    out = h.substr(p, q - p);
    return true;
}

}  // namespace

NpyHeader parse_npy_header(const uint8_t* b, size_t n, const std::string& path) {
    auto fail = [&](const char* what) {
        throw RuntimeError(strfmt("%s: not a valid .npy file: %s", path.c_str(), what));
    };
    if (n < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) fail("bad magic");
    int major = b[6];
    size_t hlen, hoff;
    if (major == 1) {
        hlen = b[8] | (b[9] << 8);
        hoff = 10;
    } else if (major == 2 || major == 3) {
        if (n < 12) fail("truncated header");
        hlen = b[8] | (b[9] << 8) | (static_cast<size_t>(b[10]) << 16) | (static_cast<size_t>(b[11]) << 24);
        hoff = 12;
    } else {
        fail("unsupported format version");
    }
    if (hoff + hlen > n) fail("header runs past the end of the file");
    std::string h(reinterpret_cast<const char*>(b + hoff), hlen);
    NpyHeader a;
    std::string v;
    if (!header_value(h, "descr", v) || v.size() < 5 || v.front() != '\'' || v.back() != '\'')
        fail("no descr");
    a.descr = v.substr(1, v.size() - 2);
    if (a.descr.size() < 3 || (a.descr[0] != '<' && a.descr[0] != '|'))
        fail("only little-endian dtypes are supported");
    if (!header_value(h, "fortran_order", v)) fail("no fortran_order");
    if (v.find("True") != std::string::npos) fail("fortran order is not supported");
    if (!header_value(h, "shape", v)) fail("no shape");
    {
        std::string s;
        for (char c : v)
            if (c != '(' && c != ')' && c != ' ') s += c;
        std::stringstream ss(s);
        std::string tok;
        while (std::getline(ss, tok, ','))
            if (!tok.empty()) {
                char* end = nullptr;
                long long d = std::strtoll(tok.c_str(), &end, 10);
                if (*end != '\0' || d < 0) fail("bad shape");
                a.shape.push_back(d);
            }
    }
    if (a.descr.size() < 3 || std::atoi(a.descr.c_str() + 2) <= 0) fail("bad dtype");
    a.data_offset = hoff + hlen;
    return a;
}

NpyArray parse_npy(const uint8_t* b, size_t n, const std::string& path) {
    const NpyHeader h = parse_npy_header(b, n, path);
    NpyArray a;
    a.descr = h.descr;
    a.shape = h.shape;
    size_t item = a.item_size();
    size_t bytes = static_cast<size_t>(a.numel()) * item;
    if (n - h.data_offset < bytes)
        throw RuntimeError(
            strfmt("%s: not a valid .npy file: data shorter than shape x dtype", path.c_str()));
    a.data.assign(b + h.data_offset, b + h.data_offset + bytes);
    return a;
}

NpyHeader read_npy_header(const std::string& path) {
    FileHandle f(path, O_RDONLY);
    std::vector<uint8_t> head(size_t{1} << 16);
    head.resize(f.pread_some(head.data(), head.size(), 0));
    return parse_npy_header(head.data(), head.size(), path);
}

NpyArray load_npy(const std::string& path) {
    std::vector<uint8_t> bytes = read_whole_file(path, size_t(1) << 34);
    return parse_npy(bytes.data(), bytes.size(), path);
}

std::string npy_header(const std::string& descr, const Shape& shape, size_t min_header_bytes) {
    std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
    for (size_t i = 0; i < shape.size(); ++i) {
        dict += std::to_string(shape[i]);
        if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
        if (i + 1 < shape.size()) dict += " ";
    }
    dict += "), }";
    size_t total = 10 + dict.size() + 1;  // magic(6) ver(2) len(2) + dict + '\n'
    size_t want = std::max(total, min_header_bytes);
    want = (want + 63) / 64 * 64;
    dict.append(want - total, ' ');
    dict += '\n';
    std::string out = "\x93NUMPY";
    out += static_cast<char>(1);
    out += static_cast<char>(0);
    size_t hlen = dict.size();
    out += static_cast<char>(hlen & 0xff);
    out += static_cast<char>((hlen >> 8) & 0xff);
    out += dict;
    return out;
}

void save_npy(const std::string& path, const std::string& descr, const Shape& shape, const void* data,
              size_t bytes) {
    std::string h = npy_header(descr, shape);
    AtomicFileWriter w(path);
    w.write(h.data(), h.size());
    w.write(data, bytes);
    w.commit();
}

}  // namespace ds4r
