// Python json.dumps(ensure_ascii=False) (see python_json.h).
#include "text/python_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ds4r::text {

namespace {

void dump_string(const std::string& s, std::string& out) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);  // non-ASCII stays as UTF-8 (ensure_ascii=False)
                }
        }
    }
    out += '"';
}

void dump(const nlohmann::ordered_json& v, std::string& out, int depth) {
    using T = nlohmann::ordered_json::value_t;
    switch (v.type()) {
        case T::null:
            out += "null";
            break;
        case T::boolean:
            out += v.get<bool>() ? "true" : "false";
            break;
        case T::number_integer:
            out += std::to_string(v.get<int64_t>());
            break;
        case T::number_unsigned:
            out += std::to_string(v.get<uint64_t>());
            break;
        case T::number_float:
            out += python_float_repr(v.get<double>());
            break;
        case T::string:
            dump_string(v.get_ref<const std::string&>(), out);
            break;
        case T::array: {
            out += '[';
            bool first = true;
            for (const auto& e : v) {
                if (!first) out += ", ";
                first = false;
                dump(e, out, depth + 1);
            }
            out += ']';
            break;
        }
        case T::object: {
            out += '{';
            bool first = true;
            for (auto it = v.begin(); it != v.end(); ++it) {
                if (!first) out += ", ";
                first = false;
                dump_string(it.key(), out);
                out += ": ";
                dump(it.value(), out, depth + 1);
            }
            out += '}';
            break;
        }
        default:
            out += "null";
            break;  // binary / discarded: never produced by the parser
    }
}

}  // namespace

std::string python_float_repr(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    // Shortest round-trip digits in scientific form: [-]D[.DDD]e(+|-)XX.
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string sci(buf, res.ptr);
    const size_t e = sci.find('e');
    std::string mant = sci.substr(0, e);
    const int exp = std::atoi(sci.c_str() + e + 1);
    bool neg = false;
    if (!mant.empty() && mant[0] == '-') {
        neg = true;
        mant.erase(0, 1);
    }
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    std::string out = neg ? "-" : "";
    if (exp < -4 || exp >= 16) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        out += eb;
    } else if (exp < 0) {
        out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
        const size_t int_len = static_cast<size_t>(exp) + 1;
        if (digits.size() <= int_len) {
            out += digits + std::string(int_len - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, int_len) + "." + digits.substr(int_len);
        }
    }
    return out;
}

std::string python_json_dumps(const nlohmann::ordered_json& v) {
    std::string out;
    dump(v, out, 0);
    return out;
}

}  // namespace ds4r::text
