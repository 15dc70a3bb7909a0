// The GPU kernel flags of `score` / `bench` end to end on the CPU backend (issue 13): --kernels,
// --prepared-experts and --fp16-weights never change a result (the CPU backend has none of those kernels
// and ignores them: the same bytes), and bad values are usage errors (exit 2). Their effect on the GPU
// kernels is tested by the CUDA suite (CudaGemmSm90, CudaMoe: the same bytes on and off).
#include <gtest/gtest.h>

#include <string>

#include "cli_run_util.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

TEST(GpuFlagsCli, CpuBackendGivesTheSameBytesWithEveryChoice) {
    const std::string dir = temp_dir("gpu-flags-cli");
    const std::string input = dir + "/in.jsonl";
    std::string head;
    const auto lines = split_lines(slurp(data_dir() + "/tiny-a/tokens.jsonl"));
    for (size_t i = 0; i < 6 && i < lines.size(); ++i) head += lines[i] + "\n";
    write_text(input, head);
    auto score = [&](const std::string& name, const std::string& flags) {
        const std::string out = dir + "/" + name + ".jsonl";
        std::string log;
        const int rc =
            run_ds4replay("score --model " + golden_model_dir() + " --backend cpu --progress none --input " +
                              input + " --output " + out + " " + flags,
                          &log);
        EXPECT_EQ(rc, 0) << flags << "\n" << log;
        return slurp(out);
    };
    const std::string want = score("default", "");
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(score("off", "--kernels portable --prepared-experts off --fp16-weights off"), want);
    EXPECT_EQ(score("auto", "--kernels auto --prepared-experts auto --fp16-weights auto"), want);
    EXPECT_EQ(score("e5m2", "--kernels auto --prepared-experts e5m2"), want);
    EXPECT_EQ(score("fp16", "--kernels auto --prepared-experts fp16"), want);
}

TEST(GpuFlagsCli, BadValuesAreUsageErrors) {
    const std::string dir = temp_dir("gpu-flags-cli-bad");
    for (const char* cmd : {"score", "bench"}) {
        for (const char* bad : {"--fp16-weights maybe", "--prepared-experts on", "--kernels fast"}) {
            const std::string args = std::string(cmd) == "score"
                                         ? " --backend cpu --input " + data_dir() + "/tiny-a/tokens.jsonl" +
                                               " --output " + dir + "/o.jsonl "
                                         : " --backend cpu --workloads kernels ";
            std::string log;
            const int rc =
                run_ds4replay(std::string(cmd) + " --model " + golden_model_dir() + args + bad, &log);
            EXPECT_EQ(rc, 2) << cmd << " " << bad << "\n" << log;
        }
    }
}
