// `ds4replay inspect`: the report on the golden checkpoint, and exit code 3 naming the shard on
// corrupted copies (run through the built binary).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ds4r/inspect.h"
#include "test_util.h"

using namespace ds4r;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int inspect(const std::string& dir, std::string* out, const std::string& extra = "") {
    return test::run_command(test::binary_path() + " inspect --model '" + dir + "'" + extra, out);
}

}  // namespace

TEST(FormatBytes, DecimalAndBinaryUnits) {
    EXPECT_EQ(format_bytes(0), "0 B");
    EXPECT_EQ(format_bytes(999), "999 B");
    EXPECT_EQ(format_bytes(1000), "1.00 KB (1000 B)");
    EXPECT_EQ(format_bytes(9073080), "9.07 MB (8.65 MiB)");
    // docs/MODEL.md 3.5: a plain layer is 7,389,500,888 B = 6.88 GiB; the whole release 510.29 GB (475.24
    // GiB).
    EXPECT_EQ(format_bytes(7389500888ull), "7.39 GB (6.88 GiB)");
    EXPECT_EQ(format_bytes(510286023000ull), "510.29 GB (475.24 GiB)");
}

TEST(InspectCli, GoldenReportHasConfigRoleTableBytesAndVerdict) {
    std::string out;
    ASSERT_EQ(inspect(test::golden_model_dir(), &out), 0) << out;
    for (const char* want : {"vocab 512, dim 256, 6 layers", "experts: 16 routed (top-6", "window 16",
                             "Engram: layers [0, 1], table rows [660, 864] x 64", "window only + Engram",
                             "KV+index source (ratio 2) + Engram", "consumer of 1/1",
                             "KV+index source (ratio 1) + candidate source", "consumer of 3/3",
                             "reindex (keys of 3, candidates)",
                             "Engram tables:", "globals:", "unused (prefill):", "in 783 tensors, 7 shards",
                             "9.07 MB (8.65 MiB)", "checkpoint OK"})
        EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
    // One table row per layer.
    for (int l = 0; l < 6; ++l)
        EXPECT_NE(out.find(strfmt("\n  %5d %5d  ", l, l == 0 ? 0 : l <= 2 ? 2 : 1)), std::string::npos) << l;
}

TEST(InspectCli, JsonReportHasTheSameFacts) {
    std::string out;
    ASSERT_EQ(inspect(test::golden_model_dir(), &out, " --json"), 0) << out;
    json j = json::parse(out);
    EXPECT_TRUE(j["ok"].get<bool>());
    EXPECT_EQ(j["config"]["vocab_size"], 512);
    EXPECT_EQ(j["config"]["engram_num_embeddings"], json({660, 864}));
    ASSERT_EQ(j["layers"].size(), 6u);
    EXPECT_EQ(j["layers"][5]["role"], "reindex (keys of 3, candidates)");
    EXPECT_TRUE(j["layers"][3]["candidate_source"].get<bool>());
    EXPECT_EQ(j["shards"].size(), 7u);
    EXPECT_EQ(j["tensors"]["total"], 783);
    EXPECT_EQ(j["tensors"]["engram_table"], 4);
    // Every byte is accounted for, and the index's total agrees.
    const auto& b = j["bytes"];
    EXPECT_EQ(b["streamed"].get<uint64_t>() + b["globals"].get<uint64_t>() +
                  b["engram_tables"].get<uint64_t>() + b["unused"].get<uint64_t>() +
                  b["unknown"].get<uint64_t>(),
              b["total"].get<uint64_t>());
    json index = json::parse(std::ifstream(test::golden_model_dir() + "/model.safetensors.index.json"));
    EXPECT_EQ(b["total"], index["metadata"]["total_size"]);
    uint64_t per_layer = 0;
    for (const auto& l : j["layers"]) per_layer += l["stream_bytes"].get<uint64_t>();
    EXPECT_EQ(per_layer, b["streamed"].get<uint64_t>());
}

TEST(InspectCli, TruncatedShardExitsThreeNamingIt) {
    std::string d = test::copy_golden_model("insp-trunc");
    fs::resize_file(d + "/model-00003-of-00007.safetensors", 50000);
    std::string out;
    EXPECT_EQ(inspect(d, &out), 3) << out;
    EXPECT_NE(out.find("model-00003-of-00007.safetensors: file is 50000 bytes"), std::string::npos) << out;
    EXPECT_EQ(out.find("checkpoint OK"), std::string::npos);
}

TEST(InspectCli, CorruptHeaderLengthExitsThreeNamingIt) {
    std::string d = test::copy_golden_model("insp-hlen");
    std::fstream f(d + "/model-00002-of-00007.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put(static_cast<char>(0x40));
    f.close();
    std::string out;
    EXPECT_EQ(inspect(d, &out), 3) << out;
    EXPECT_NE(out.find("model-00002-of-00007.safetensors: header length"), std::string::npos) << out;
}

TEST(InspectCli, MissingShardExitsThreeNamingIt) {
    std::string d = test::copy_golden_model("insp-miss");
    fs::remove(d + "/model-00006-of-00007.safetensors");
    std::string out;
    EXPECT_EQ(inspect(d, &out), 3) << out;
    EXPECT_NE(
        out.find("model-00006-of-00007.safetensors: missing (listed in model.safetensors.index.json for "
                 "'layers.0.engram.embed.scale'"),
        std::string::npos)
        << out;
    // JSON mode: one error object on stdout (stderr carries the message too), same exit code.
    std::string jout;
    EXPECT_EQ(test::run_command(
                  "(" + test::binary_path() + " inspect --json --model '" + d + "' 2>/dev/null)", &jout),
              3);
    json j = json::parse(jout);
    EXPECT_FALSE(j["ok"].get<bool>());
    EXPECT_EQ(j["exit_code"], 3);
    EXPECT_NE(j["error"].get<std::string>().find("model-00006-of-00007.safetensors"), std::string::npos);
}
