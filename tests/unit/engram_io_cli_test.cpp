// The I/O flags end to end (issue 14, issue 12): `score` gives identical bytes with every Engram engine and
// scale mode and with either weight I/O mode; bad values are usage errors; `make-tiny --engram-rows` writes
// dense random tables that score; `inspect --pass-tokens` predicts the disk traffic of a pass.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run_util.h"
#include "ds4r/checkpoint.h"
#include "ds4r/inspect.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

std::string score_with(const std::string& model, const std::string& dir, const std::string& name,
                       const std::string& flags, const std::string& input) {
    const std::string out = dir + "/" + name + ".jsonl";
    std::string log;
    const int rc = run_ds4replay("score --model " + model + " --backend cpu --progress none --input " +
                                     input + " --output " + out + " " + flags,
                                 &log);
    EXPECT_EQ(rc, 0) << flags << "\n" << log;
    return slurp(out);
}

}  // namespace

TEST(EngramIoCli, EveryEngineGivesTheSameBytes) {
    const std::string dir = temp_dir("engram-io-cli");
    // The first golden sequences (n-grams of every size; the whole input 10 times costs minutes).
    const std::string input = dir + "/in.jsonl";
    std::string head;
    const auto lines = split_lines(slurp(data_dir() + "/tiny-a/tokens.jsonl"));
    for (size_t i = 0; i < 6 && i < lines.size(); ++i) head += lines[i] + "\n";
    write_text(input, head);
    const std::string want = score_with(golden_model_dir(), dir, "default", "", input);
    ASSERT_FALSE(want.empty());
    int n = 0;
    for (const char* io : {"auto", "uring", "pread", "mmap"}) {
        // Scales in memory and per row alternate over the engines.
        const std::string flags = std::string("--engram-io ") + io + " --engram-scales " +
                                  (n % 2 ? "memory" : "disk") + " --engram-queue-depth " +
                                  (n % 2 ? "3" : "200");
        EXPECT_EQ(score_with(golden_model_dir(), dir, "e" + std::to_string(n++), flags, input), want)
            << flags;
    }
    EXPECT_EQ(score_with(golden_model_dir(), dir, "buffered",
                         "--io buffered --read-threads 2 --read-request-mb 1", input),
              want);
}

TEST(EngramIoCli, BadValuesAreUsageErrors) {
    const std::string dir = temp_dir("engram-io-cli-bad");
    for (const char* bad : {"--engram-io fast", "--io cached", "--read-threads 0", "--read-request-mb 5000",
                            "--engram-queue-depth 0", "--engram-scales some", "--engram-next-pass maybe"}) {
        std::string log;
        const int rc =
            run_ds4replay("score --model " + golden_model_dir() + " --backend cpu --input " + data_dir() +
                              "/tiny-a/tokens.jsonl --output " + dir + "/o.jsonl " + bad,
                          &log);
        EXPECT_EQ(rc, 2) << bad << "\n" << log;
    }
}

// Dense random tables: real data in every row (no zero or NaN code), the requested row count, and a
// checkpoint that validates and scores identically with every engine.
TEST(EngramIoCli, MakeTinyDenseTablesScore) {
    const std::string dir = temp_dir("engram-dense");
    const std::string model = dir + "/model";
    std::string log;
    ASSERT_EQ(run_ds4replay("make-tiny " + model + " --layers 3 --engram-rows 30000 --seed 3", &log), 0)
        << log;
    Checkpoint ck = Checkpoint::open(model);
    ASSERT_FALSE(ck.config().engram_layer_ids.empty());
    for (int L : ck.config().engram_layer_ids) {
        const TensorLocation& w = ck.at(layer_tensor_name(L, "engram.embed.weight"));
        EXPECT_NEAR(static_cast<double>(w.shape[0]), 30000.0, 30000.0 * 0.02) << "layer " << L;
        std::vector<uint8_t> bytes(static_cast<size_t>(w.nbytes));
        ck.read(w, bytes.data());
        size_t zero = 0, nan = 0;
        for (uint8_t b : bytes) zero += (b & 0x7f) == 0, nan += (b & 0x7f) == 0x7f;
        EXPECT_EQ(zero, 0u);
        EXPECT_EQ(nan, 0u);
    }
    const std::string input = dir + "/in.jsonl";
    write_text(input,
               "{\"id\": \"a\", \"tokens\": [5, 300, 17, 17, 17, 99, 5, 300]}\n{\"id\": \"b\", \"tokens\": "
               "[7, 8]}\n");
    const std::string a = score_with(model, dir, "auto", "--engram-io auto --engram-scales disk", input);
    EXPECT_NE(a.find("\"logprob\""), std::string::npos);
    EXPECT_EQ(score_with(model, dir, "mmap", "--engram-io mmap --engram-scales memory", input), a);
    EXPECT_EQ(score_with(model, dir, "pread", "--engram-io pread", input), a);
}

TEST(EngramIoCli, InspectPredictsThePassTraffic) {
    Checkpoint ck = Checkpoint::open(golden_model_dir());
    const ModelConfig& c = ck.config();
    const PassIoPrediction p = predict_pass_io(ck, 1000, 2000, 50000, /*scales_in_memory=*/true);
    uint64_t layers = 0;
    for (const LayerRole& r : ck.roles()) layers += ck.layer_read_bytes(r.layer);
    EXPECT_GT(p.layer_bytes, layers);  // + the head
    EXPECT_EQ(p.engram_lookups,
              static_cast<uint64_t>(1000 * c.engram_hash_cols() * c.engram_layer_ids.size()));
    EXPECT_GT(p.engram_rows, 0);
    EXPECT_LE(p.engram_rows, static_cast<double>(p.engram_lookups));
    EXPECT_LE(p.engram_requests, p.engram_rows);
    EXPECT_NEAR(p.layer_s, p.layer_bytes / 1e6 / 2000, 1e-9);
    EXPECT_NEAR(p.engram_s, p.engram_requests / 50000, 1e-9);
    EXPECT_NEAR(p.pass_s, p.layer_s + p.engram_s, 1e-9);
    // Scales per row: more random reads.
    EXPECT_GT(predict_pass_io(ck, 1000, 2000, 50000, false).engram_requests, p.engram_requests);

    std::string out;
    ASSERT_EQ(run_ds4replay("inspect --model " + golden_model_dir() +
                                " --pass-tokens 1000 --disk-seq-mbps 2000 "
                                "--disk-iops 50000",
                            &out),
              0)
        << out;
    EXPECT_NE(out.find("pass of 1000 tokens"), std::string::npos) << out;
    EXPECT_NE(out.find("predicted pass"), std::string::npos) << out;
    ASSERT_EQ(run_ds4replay("inspect --json --model " + golden_model_dir() + " --pass-tokens 1000", &out), 0)
        << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("pass_prediction").at("pass_tokens"), 1000);
    EXPECT_TRUE(j.at("ok").get<bool>());
}

// bench compares the Engram layers' wall with the non-Engram layers of the same compress ratio (window
// layers and compressed ones differ by themselves) and prints the gather's stall as a share of it, and
// how long their chunk loops waited for the host's dequantization of the rows.
TEST(EngramIoCli, BenchComparesEngramLayersWithTheirOwnRatio) {
    const std::string dir = temp_dir("engram-bench-ratio");
    const std::string model = dir + "/model";
    std::string log;
    ASSERT_EQ(run_ds4replay("make-tiny " + model + " --preset tiny --layers 6 --seed 2 -q", &log), 0) << log;
    ASSERT_EQ(run_ds4replay("bench --model " + model +
                                " --backend cpu --workloads b --b-sequences 3 --b-tokens 64 --disk-seconds 0.1 "
                                "--csv " + dir + "/bench.csv",
                            &log),
              0)
        << log;
    EXPECT_NE(log.find("Engram layers:"), std::string::npos) << log;
    EXPECT_NE(log.find("non-Engram layers of the same compress ratio"), std::string::npos) << log;
    EXPECT_NE(log.find("the gather's stall"), std::string::npos) << log;
    EXPECT_NE(log.find("waited"), std::string::npos) << log;
    const std::string csv = slurp(dir + "/bench.csv");
    EXPECT_NE(csv.find("engram_layer_wall_ratio"), std::string::npos);
    EXPECT_NE(csv.find("engram_stall_share"), std::string::npos);
    EXPECT_NE(csv.find("engram_dequant_wait_s"), std::string::npos);
    // per FLOP: the Engram layers compute more (Engram's wkv); wall ratio = FLOP ratio x per-FLOP ratio
    EXPECT_NE(log.find("Engram layers per FLOP"), std::string::npos) << log;
    auto value = [&](const std::string& name) {
        for (const std::string& line : split_lines(csv)) {
            const std::vector<std::string> f = split_csv_line(line);
            if (f.size() == 10 && f[1] == name) return std::stod(f[7]);
        }
        ADD_FAILURE() << "no CSV row " << name;
        return 0.0;
    };
    const double wall = value("engram_layer_wall_ratio"), flop = value("engram_layer_flop_ratio"),
                 per_flop = value("engram_layer_wall_per_flop_ratio");
    EXPECT_GT(flop, 1.0);
    EXPECT_NEAR(flop * per_flop, wall, 1e-4 * wall);
    // every row has the header's 10 fields (RFC 4180 quoting where a field holds a comma)
    const std::vector<std::string> lines = split_lines(csv);
    ASSERT_GT(lines.size(), 10u);
    for (const std::string& line : lines) EXPECT_EQ(split_csv_line(line).size(), 10u) << line;
}
