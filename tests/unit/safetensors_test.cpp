// Safetensors header parser and index parser: every validation rule, with the message it gives.
#include "ds4r/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

#include "ds4r/error.h"
#include "test_util.h"

using namespace ds4r;

namespace {

// A safetensors file image: 8-byte little-endian length, the header text, `data_bytes` data bytes
// (byte i of the data section = i mod 251, so offsets are checkable).
std::vector<uint8_t> st_file(const std::string& header, uint64_t data_bytes,
                             std::optional<uint64_t> len_field = std::nullopt) {
    std::vector<uint8_t> f(8);
    uint64_t len = len_field ? *len_field : header.size();
    for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<uint8_t>(len >> (8 * i));
    f.insert(f.end(), header.begin(), header.end());
    for (uint64_t i = 0; i < data_bytes; ++i) f.push_back(static_cast<uint8_t>(i % 251));
    return f;
}

SafetensorsHeader parse(const std::vector<uint8_t>& f) {
    return parse_safetensors_header(f.data(), f.size(), f.size(), "t.safetensors");
}

// Runs fn, expects a CheckpointError whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
    try {
        fn();
        ADD_FAILURE() << "no error; expected one containing '" << *parts.begin() << "'";
    } catch (const CheckpointError& e) {
        std::string msg = e.what();
        for (const auto& p : parts)
            EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
        EXPECT_EQ(e.exit_code(), 3);
    }
}

void expect_header_error(const std::string& header, uint64_t data_bytes,
                         std::initializer_list<std::string> parts) {
    auto f = st_file(header, data_bytes);
    expect_error([&] { parse(f); }, parts);
}

std::string write_temp(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
    std::string p = dir + "/" + name;
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
}

}  // namespace

TEST(SafetensorsHeader, ValidFileGivesAbsoluteOffsetsSortedByOffset) {
    const std::string hdr =
        R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[12,16]},)"
        R"("a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"e":{"dtype":"F32","shape":[0,5],"data_offsets":[16,16]},)"
        R"("s":{"dtype":"I64","shape":[],"data_offsets":[16,24]}}   )";  // trailing spaces: writers pad to 8
    auto f = st_file(hdr, 24);
    SafetensorsHeader h = parse(f);
    EXPECT_EQ(h.header_len, hdr.size());
    EXPECT_EQ(h.data_begin, 8 + hdr.size());
    EXPECT_EQ(h.data_end, 8 + hdr.size() + 24);
    ASSERT_EQ(h.tensors.size(), 4u);
    EXPECT_EQ(h.tensors[0].name, "a");
    EXPECT_EQ(h.tensors[0].dtype, DType::BF16);
    EXPECT_EQ(h.tensors[0].shape, (Shape{2, 3}));
    EXPECT_EQ(h.tensors[0].offset, h.data_begin);
    EXPECT_EQ(h.tensors[0].nbytes, 12u);
    EXPECT_EQ(h.tensors[1].name, "b");
    EXPECT_EQ(h.tensors[1].offset, h.data_begin + 12);
    EXPECT_EQ(h.tensors[1].nbytes, 4u);
    // The empty tensor sorts before the scalar at the same begin.
    EXPECT_EQ(h.tensors[2].name, "e");
    EXPECT_EQ(h.tensors[2].nbytes, 0u);
    EXPECT_EQ(h.tensors[3].name, "s");
    EXPECT_EQ(h.tensors[3].shape, Shape{});
    EXPECT_EQ(h.tensors[3].nbytes, 8u);
    ASSERT_EQ(h.metadata.size(), 1u);
    EXPECT_EQ(h.metadata[0].first, "format");
    EXPECT_EQ(h.metadata[0].second, "pt");
    ASSERT_NE(h.find("b"), nullptr);
    EXPECT_EQ(f[h.find("b")->offset], 12 % 251);
    EXPECT_EQ(h.find("zz"), nullptr);
}

TEST(SafetensorsHeader, EveryDtypeSpellingIsAccepted) {
    const char* names[] = {"BF16", "F16", "F32",  "F64",     "I8",      "U8",     "I16",
                           "I32",  "I64", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0"};
    std::string hdr = "{";
    uint64_t off = 0;
    for (size_t i = 0; i < std::size(names); ++i) {
        uint64_t sz = dtype_size(*dtype_from_name(names[i])) * 3;
        hdr += strfmt(R"(%s"t%zu":{"dtype":"%s","shape":[3],"data_offsets":[%llu,%llu]})", i ? "," : "", i,
                      names[i], (unsigned long long)off, (unsigned long long)(off + sz));
        off += sz;
    }
    hdr += "}";
    SafetensorsHeader h = parse(st_file(hdr, off));
    ASSERT_EQ(h.tensors.size(), std::size(names));
    for (const auto& t : h.tensors) EXPECT_EQ(t.nbytes, 3 * dtype_size(t.dtype)) << t.name;
}

TEST(SafetensorsHeader, UnknownTensorFieldsAreSkipped) {
    auto h = parse(st_file(
        R"({"a":{"extra":{"x":[1,{"y":null}],"z":"s"},"dtype":"U8","more":[[]],"shape":[2],"data_offsets":[0,2],"n":1.5}})",
        2));
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.tensors[0].nbytes, 2u);
}

TEST(SafetensorsHeader, DeepNestingNeitherRecursesNorFails) {
    // The SAX reader skips a 200k-deep unknown value without recursion; the index parser refuses it.
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    auto h =
        parse(st_file(R"({"a":{"x":)" + deep + R"(,"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
    EXPECT_EQ(h.tensors.size(), 1u);
    expect_header_error(R"({"a":)" + deep + "}", 0, {"header entry 'a' must be an object, found an array"});
    expect_error([&] { parse_safetensors_index(R"({"weight_map":{},"m":)" + deep + "}", "i.json"); },
                 {"nested deeper than 32 levels"});
}

TEST(SafetensorsHeader, EmptyHeaderObjectIsAnEmptyFile) {
    auto h = parse(st_file("{}", 0));
    EXPECT_TRUE(h.tensors.empty());
    EXPECT_EQ(h.data_end, h.data_begin);
}

TEST(SafetensorsHeader, FileShorterThanLengthPrefix) {
    std::vector<uint8_t> f = {1, 0, 0};
    expect_error([&] { parse(f); }, {"t.safetensors", "file is 3 bytes", "truncated"});
}

TEST(SafetensorsHeader, HeaderLengthBeyondFile) {
    auto f = st_file("{}", 0, /*len_field=*/1000);
    expect_error([&] { parse(f); },
                 {"t.safetensors", "header length 1000 runs past the end of the file (10 bytes"});
}

TEST(SafetensorsHeader, HeaderLengthOverLimit) {
    auto f = st_file("{}", 0, (100ull << 20) + 1);
    // Even when the file would be long enough.
    expect_error([&] { parse_safetensors_header(f.data(), f.size(), 1ull << 40, "t.safetensors"); },
                 {"t.safetensors", "header length 104857601 exceeds", "100 MiB"});
    auto g = st_file("{}", 0, std::numeric_limits<uint64_t>::max());
    expect_error([&] { parse(g); }, {"header length 18446744073709551615 exceeds"});
}

TEST(SafetensorsHeader, TruncatedRead) {
    auto f = st_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
    expect_error([&] { parse_safetensors_header(f.data(), 20, f.size(), "t.safetensors"); },
                 {"t.safetensors", "only 12 are available"});
    expect_error([&] { parse_safetensors_header(f.data(), 5, f.size(), "t.safetensors"); }, {"only 5 bytes"});
}

TEST(SafetensorsHeader, InvalidJson) {
    expect_header_error(R"({"a":{"dtype":"U8",)", 0, {"t.safetensors", "not valid JSON"});
    expect_header_error("", 0, {"not valid JSON"});
    expect_header_error(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x)", 1, {"not valid JSON"});
    // Binary garbage is quoted printably.
    std::string junk = "{\"a\":\x01\x02\xff}";
    try {
        parse(st_file(junk, 0));
        FAIL();
    } catch (const CheckpointError& e) {
        for (const char* p = e.what(); *p; ++p) EXPECT_GE(static_cast<unsigned char>(*p), 0x0a) << e.what();
        EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
    }
}

TEST(SafetensorsHeader, NonObjects) {
    expect_header_error("[1,2]", 0, {"t.safetensors", "header must be a JSON object, found an array"});
    expect_header_error("7", 0, {"header must be a JSON object, found a number"});
    expect_header_error(R"({"a":[1]})", 0, {"header entry 'a' must be an object, found an array"});
    expect_header_error(R"({"a":"x"})", 0, {"header entry 'a' must be an object, found a string"});
    expect_header_error(R"({"__metadata__":{"k":1}})", 0, {"'__metadata__' entry 'k' must be a string"});
    expect_header_error(R"({"__metadata__":[]})", 0, {"header entry '__metadata__' must be an object"});
    expect_header_error(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1,
                        {"tensor 'a': field 'dtype' must be a string, found a number"});
    expect_header_error(R"({"a":{"dtype":"U8","shape":{"x":1},"data_offsets":[0,1]}})", 1,
                        {"tensor 'a': field 'shape' must be an array of integers, found an object"});
}

TEST(SafetensorsHeader, BadDtype) {
    expect_header_error(R"({"w":{"dtype":"F8_E4M3FN","shape":[1],"data_offsets":[0,1]}})", 1,
                        {"t.safetensors", "tensor 'w' has unknown dtype 'F8_E4M3FN'"});
    expect_header_error(R"({"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2,
                        {"unknown dtype 'bf16'"});
}

TEST(SafetensorsHeader, BadShape) {
    expect_header_error(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", 0,
                        {"tensor 'w': shape must hold non-negative integers, found a negative number (-1)"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,0]}})", 0,
                        {"shape must hold non-negative integers, found a non-integer number"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,0]}})", 0,
                        {"shape must hold non-negative integers, found a string"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0,
                        {"tensor 'w': shape dimension 18446744073709551615 is too large"});
    // Each dim fits int64, the product times the element size does not fit 64 bits.
    expect_header_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
                        {"tensor 'w': shape [4294967296, 4294967296] x 4 bytes overflows 64 bits"});
    expect_header_error(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
                        {"overflows 64 bits"});
    // 2^62 x 2 bytes = 2^63 still fits: then it is the size check that fails.
    expect_header_error(R"({"w":{"dtype":"BF16","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
                        {"span 0 bytes, expected 9223372036854775808"});
    std::string many = "[";
    for (int i = 0; i < 65; ++i) many += i ? ",1" : "1";
    many += "]";
    expect_header_error(R"({"w":{"dtype":"U8","shape":)" + many + R"(,"data_offsets":[0,1]}})", 1,
                        {"more than 64 dimensions"});
}

TEST(SafetensorsHeader, BadOffsets) {
    expect_header_error(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[5,4]}})", 8,
                        {"tensor 'w': data_offsets [5, 4] has begin > end"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 8,
                        {"data_offsets must be [begin, end], found 1 number(s)"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 8,
                        {"found more than 2 numbers"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 8,
                        {"data_offsets must hold non-negative integers, found a negative number"});
    expect_header_error(R"({"w":{"dtype":"U8","shape":[1]}})", 8,
                        {"tensor 'w' needs dtype, shape and data_offsets; 'data_offsets' is missing"});
    expect_header_error(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 8,
                        {"field 'dtype' appears twice"});
}

TEST(SafetensorsHeader, EndBeyondDataIsATruncatedFile) {
    const std::string hdr =
        R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}})";
    auto f = st_file(hdr, 10);
    expect_error([&] { parse(f); }, {"t.safetensors",
                                     strfmt("file is %zu bytes but its header says data ends at byte %zu",
                                            f.size(), 8 + hdr.size() + 20),
                                     "tensor 'w'", "truncated shard?"});
    // Offsets near 2^64 do not wrap around.
    expect_header_error(
        R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", 4,
        {"data ends at byte 18446744073709551615"});
}

TEST(SafetensorsHeader, SizeMustEqualNumelTimesDtypeSize) {
    expect_header_error(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 16,
                        {"tensor 'w': data_offsets [0, 8] span 8 bytes, expected 12 (BF16 [2, 3])"});
}

TEST(SafetensorsHeader, OverlappingTensors) {
    expect_header_error(
        R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})",
        16, {"tensors 'a' (bytes [0, 8)) and 'b' (bytes [6, 10)) overlap"});
    // Same range twice.
    expect_header_error(
        R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
        4, {"overlap"});
    // A tensor inside a larger one that starts earlier, behind a third one.
    expect_header_error(
        R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
        R"("c":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}})",
        10, {"'a'", "'b'", "overlap"});
    // Empty tensors and touching neighbours are fine.
    auto h = parse(st_file(
        R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
        8));
    EXPECT_EQ(h.tensors.size(), 3u);
}

TEST(SafetensorsHeader, DuplicateNamesAndMetadata) {
    expect_header_error(
        R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
        2, {"tensor 'a' appears twice in the header"});
    expect_header_error(R"({"__metadata__":{},"__metadata__":{}})", 0, {"'__metadata__' appears twice"});
}

TEST(SafetensorsHeader, ReadFromFileAndTruncatedFile) {
    const std::string dir = test::temp_dir("st");
    const std::string hdr = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
    auto bytes = st_file(hdr, 12);
    std::string p = write_temp(dir, "ok.safetensors", bytes);
    SafetensorsHeader h = read_safetensors_header(p);
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.file_size, bytes.size());
    EXPECT_EQ(h.tensors[0].offset, 8 + hdr.size());

    bytes.resize(bytes.size() - 1);
    std::string q = write_temp(dir, "short.safetensors", bytes);
    expect_error([&] { read_safetensors_header(q); }, {"short.safetensors", "truncated shard?"});
    bytes.resize(30);
    std::string r = write_temp(dir, "cut.safetensors", bytes);
    expect_error([&] { read_safetensors_header(r); },
                 {"cut.safetensors", "runs past the end of the file (30 bytes"});
    expect_error([&] { read_safetensors_header(dir + "/absent.safetensors"); },
                 {"absent.safetensors", "cannot open"});
}

TEST(SafetensorsHeader, PrintableName) {
    EXPECT_EQ(printable_name("layers.0.w"), "layers.0.w");
    EXPECT_EQ(printable_name(std::string("a\nb\x01\xff", 5)), "a\\x0ab\\x01\\xff");
    std::string longname(300, 'x');
    std::string p = printable_name(longname);
    EXPECT_EQ(p.substr(0, 200), std::string(200, 'x'));
    EXPECT_NE(p.find("(300 bytes)"), std::string::npos);
}

// --- model.safetensors.index.json ---------------------------------------------------------------

TEST(SafetensorsIndex, ValidIndexIsSortedWithTotalSize) {
    auto idx = parse_safetensors_index(
        R"({"metadata":{"total_size":1234,"other":"x"},"weight_map":{"b.w":"s2.safetensors","a.w":"s1.safetensors"},"extra":[1]})",
        "i.json");
    ASSERT_EQ(idx.weight_map.size(), 2u);
    EXPECT_EQ(idx.weight_map[0], (std::pair<std::string, std::string>{"a.w", "s1.safetensors"}));
    EXPECT_EQ(idx.weight_map[1], (std::pair<std::string, std::string>{"b.w", "s2.safetensors"}));
    ASSERT_TRUE(idx.total_size.has_value());
    EXPECT_EQ(*idx.total_size, 1234u);
    auto no_meta = parse_safetensors_index(R"({"weight_map":{}})", "i.json");
    EXPECT_FALSE(no_meta.total_size.has_value());
    EXPECT_TRUE(no_meta.weight_map.empty());
    EXPECT_EQ(
        *parse_safetensors_index(R"({"metadata":{"total_size":1.5e3},"weight_map":{}})", "i.json").total_size,
        1500u);
}

TEST(SafetensorsIndex, Malformed) {
    auto bad = [](const std::string& text, std::initializer_list<std::string> parts) {
        expect_error([&] { parse_safetensors_index(text, "dir/model.safetensors.index.json"); }, parts);
    };
    bad("{", {"dir/model.safetensors.index.json", "not valid JSON"});
    bad("[]", {"must be a JSON object, found array"});
    bad(R"({"metadata":{}})", {"no 'weight_map' object"});
    bad(R"({"weight_map":[]})", {"'weight_map' must be an object, found array"});
    bad(R"({"weight_map":{"a":3}})", {"weight_map['a'] must be a shard file name (string), found number"});
    bad(R"({"weight_map":{"a":"../etc/passwd"}})",
        {"weight_map['a'] = '../etc/passwd' is not a plain file name"});
    bad(R"({"weight_map":{"a":""}})", {"is not a plain file name"});
    bad(R"({"weight_map":{"a":".."}})", {"is not a plain file name"});
    bad(R"({"weight_map":{"a":"x.safetensors","a":"y.safetensors"}})",
        {"tensor 'a' is listed twice in weight_map"});
    bad(R"({"metadata":{"total_size":-4},"weight_map":{}})",
        {"metadata.total_size must be a non-negative integer"});
    bad(R"({"metadata":{"total_size":"4"},"weight_map":{}})",
        {"metadata.total_size must be a non-negative integer"});
    bad(R"({"metadata":[],"weight_map":{}})", {"'metadata' must be an object"});
    bad(std::string(100, '[') + std::string(100, ']'), {"nested deeper than 32 levels"});
}

TEST(SafetensorsIndex, ReadFromFile) {
    const std::string dir = test::temp_dir("idx");
    std::string text = R"({"weight_map":{"x":"model.safetensors"}})";
    std::string p =
        write_temp(dir, "model.safetensors.index.json", std::vector<uint8_t>(text.begin(), text.end()));
    auto idx = read_safetensors_index(p);
    ASSERT_EQ(idx.weight_map.size(), 1u);
    EXPECT_EQ(idx.path, p);
    expect_error([&] { read_safetensors_index(dir + "/none.json"); }, {"none.json", "cannot open"});
}
