// score --devices on the GPU (issue 16): `--devices 0,0` (two workers sharing one card: the whole
// multi-device path, each worker with its own CUDA backend, stream and weight copies, fed by one
// reader) and `--devices 0,0,0` give the bytes of `--device 0`, results JSONL and hidden .npy files,
// over several passes; with two or more GPUs, `--devices 0,1` too. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cuda_test_util.h"
#include "ds4r/backend.h"
#include "ds4r/score.h"
#include "test_util.h"

namespace ds4r {
namespace {

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct Outputs {
    std::string out, hidden_dir;
};

Outputs score_on(const std::vector<int>& devices, const std::string& tag) {
    const std::string dir = test::temp_dir(tag);
    ScoreOptions o;
    o.model_dir = test::golden_model_dir();
    o.input = test::data_dir() + "/tiny-a/tokens.jsonl";
    o.output = dir + "/out.jsonl";
    o.backend = "cuda";
    o.progress = "none";
    o.pass_tokens = 300;  // several passes
    o.capture_layers = {2, 6};
    o.hidden_dir = dir + "/hidden";
    if (devices.empty())
        o.device = 0;
    else
        o.devices = devices;
    const ScoreSummary s = run_score(o);
    EXPECT_GE(s.passes, 2) << tag;
    return {o.output, o.hidden_dir};
}

void expect_same(const Outputs& want, const Outputs& got, const std::string& what) {
    const std::string a = read_all(want.out), b = read_all(got.out);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << what << ": results differ from --device 0";
    for (const char* f : {"hidden_L2.npy", "hidden_L6.npy"})
        EXPECT_TRUE(read_all(want.hidden_dir + "/" + f) == read_all(got.hidden_dir + "/" + f))
            << what << ": " << f;
}

TEST(CudaDevices, WorkersSharingOneGpuGiveTheOneDeviceBytes) {
    DS4R_REQUIRE_CUDA();
    const Outputs one = score_on({}, "cuda-dev1");
    expect_same(one, score_on({0, 0}, "cuda-dev00"), "--devices 0,0");
    expect_same(one, score_on({0, 0, 0}, "cuda-dev000"), "--devices 0,0,0");
}

TEST(CudaDevices, TwoGpusGiveTheOneDeviceBytes) {
    DS4R_REQUIRE_CUDA();
    if (cuda_device_count() < 2) GTEST_SKIP() << "one GPU visible";
    expect_same(score_on({}, "cuda-dev1b"), score_on({0, 1}, "cuda-dev01"), "--devices 0,1");
}

}  // namespace
}  // namespace ds4r
