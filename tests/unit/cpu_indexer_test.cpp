// CPU indexer ops and CUDA torch.topk's tie rule (docs/MODEL.md 4.6.2 steps 4-7, 8.1, 8.2).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {
const float kInf = std::numeric_limits<float>::infinity();
std::vector<int64_t> topk(const std::vector<float>& v, int64_t k) {
    return cpuref::select_topk_cuda_rule(v.data(), static_cast<int64_t>(v.size()), k);
}
}  // namespace

TEST(CpuTopk, CudaRuleTakesGreaterThenTiesInAscendingIndexOrder) {
    EXPECT_EQ(topk({1, 3, 3, 2, 3}, 2), (std::vector<int64_t>{1, 2}));
    // k-th largest is 2: the three 3s (ascending), then the 2.
    EXPECT_EQ(topk({1, 3, 3, 2, 3}, 4), (std::vector<int64_t>{1, 2, 4, 3}));
    // All equal: the lowest indices.
    EXPECT_EQ(topk({5, 5, 5, 5, 5, 5}, 3), (std::vector<int64_t>{0, 1, 2}));
    // Strictly greater values come first even at higher indices.
    EXPECT_EQ(topk({0, 0, 0, 7, 0, 9}, 3), (std::vector<int64_t>{3, 5, 0}));
    // -inf ties (masked positions) are taken in ascending order too.
    EXPECT_EQ(topk({-kInf, 2, -kInf, -kInf}, 3), (std::vector<int64_t>{1, 0, 2}));
    // The radix key orders -0 below +0 and NaN above everything.
    EXPECT_EQ(topk({-0.0f, 0.0f}, 1), (std::vector<int64_t>{1}));
    EXPECT_EQ(topk({kInf, NAN, 1.0f}, 1), (std::vector<int64_t>{1}));
    EXPECT_TRUE(topk({1, 2}, 0).empty());
    // Sorted variant (the router): descending, ties by ascending index.
    const std::vector<float> v = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f};
    EXPECT_EQ(cpuref::topk_sorted_desc_cuda_rule(v.data(), 5, 3), (std::vector<int64_t>{1, 3, 2}));
}

TEST(CpuIndexTopk, TiesMaskedTailsAndOffsetMapping) {
    CpuBackend be(2);
    const int64_t T = 12, K = 5, offset = 100;
    // row 0: all scores equal and all visible -> the 5 lowest positions
    // row 1: qpos 5 at ratio 2 -> n_t = 3 visible; 2 real picks, then -inf ties -> -1 at the tail
    // row 2: distinct scores, some large ones masked by the caller already (-inf)
    std::vector<float> sv(size_t(3 * T), 1.0f);
    for (int64_t j = 0; j < T; ++j) {
        sv[size_t(T + j)] = j < 3 ? float(j) : -kInf;
        sv[size_t(2 * T + j)] = j < 10 ? float((j * 7) % 10) : -kInf;
    }
    sv[size_t(T + 0)] = 5.0f;  // row 1: positions 0 (5), 2 (2), 1 (1) are the only finite ones
    Tensor score = bf16_from(be, {3, T}, sv);
    Tensor qpos = i32_from(be, {3}, {2 * int32_t(T) - 1, 5, 2 * 10 - 1});
    Tensor idx = make(be, DType::I32, {3, K});
    be.index_topk(score, qpos, 2, offset, idx);
    const std::vector<int32_t> want = {100, 101, 102, 103, 104, 100, 101, 102, -1,
                                       -1,  // 0, 1, 2 visible; -inf ties at 3, 4 -> -1
                                       // row 2 values (j*7)%10: j=1 ->7, 4 ->8, 7 ->9, 8 ->6, 5 ->5
                                       101, 104, 105, 107, 108};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(idx.ptr<int32_t>()[i], want[i]) << i;
}

TEST(CpuIndexScores, FormulaHeadSumInFp32AndCausalMask) {
    CpuBackend be(2);
    Rng rng(14);
    const int64_t m = 3, nh = 4, ihd = 32, T = 6;
    Tensor q = random_bf16(be, {m, nh, ihd}, rng);
    Tensor k = random_bf16(be, {T, ihd}, rng);
    Tensor w = random_bf16(be, {m, nh}, rng, 0.1f);
    Tensor qpos = i32_from(be, {m}, {11, 4, 7});  // ratio 2: n_t = 6, 2, 4
    Tensor score = make(be, DType::BF16, {m, T});
    be.index_scores(q, k, w, qpos, 2, score);
    for (int64_t r = 0; r < m; ++r) {
        const int64_t n_t = (qpos.ptr<int32_t>()[r] + 1) / 2;
        for (int64_t j = 0; j < T; ++j) {
            const float got = bf16_to_f32(score.ptr<uint16_t>()[r * T + j]);
            if (j >= n_t) {
                EXPECT_EQ(got, -kInf);
                continue;
            }
            float acc = 0.0f;
            for (int64_t h = 0; h < nh; ++h) {
                double dot = 0;
                for (int64_t d = 0; d < ihd; ++d)
                    dot += double(bf16_to_f32(q.ptr<uint16_t>()[(r * nh + h) * ihd + d])) *
                           bf16_to_f32(k.ptr<uint16_t>()[j * ihd + d]);
                const float S = std::max(round_bf16(static_cast<float>(dot)), 0.0f);
                acc += round_bf16(S * bf16_to_f32(w.ptr<uint16_t>()[r * nh + h]));
            }
            EXPECT_EQ(score.ptr<uint16_t>()[r * T + j], f32_to_bf16(acc)) << r << " " << j;
        }
    }
    // Summing the heads in fp32 (256 + 0.75 + 0.75 = 257.5 -> bf16 258) differs from a bf16
    // accumulation (256 + 0.75 -> 256, + 0.75 -> 256); a negative S is cut by the relu.
    Tensor q2 = bf16_from(be, {1, 4, 1}, {1, 1, 1, -1});
    Tensor k2 = bf16_from(be, {1, 1}, {1});
    Tensor w2 = bf16_from(be, {1, 4}, {256, 0.75f, 0.75f, 100});
    Tensor s2 = make(be, DType::BF16, {1, 1});
    be.index_scores(q2, k2, w2, i32_from(be, {1}, {0}), 1, s2);
    EXPECT_EQ(bf16_to_f32(s2.ptr<uint16_t>()[0]), 258.0f);
}

TEST(CpuCandidateBlocks, PinsTheNewestBlockKeepsTheBestAndDropsUnreachable) {
    CpuBackend be(1);
    const int64_t T = 10, block = 4;  // 3 blocks: [0..3], [4..7], [8, 9 + 2 pad]
    std::vector<float> sv = {
        // row 0: qpos 9 (ratio 1) -> n_t 10, newest block 2 pinned; best other: block 0 (9) over 1 (3)
        9, 0, 0, 0, 3, 0, 0, 0, -5, -5,
        // row 1: qpos 4 -> n_t 5: block 1 (pos 4) pinned, block 2 unreachable (-inf)
        1, 2, 3, 4, 0, -kInf, -kInf, -kInf, -kInf, -kInf,
        // row 2: qpos 1 at ratio 2 -> n_t = 1: block 0 pinned (also the only reachable one)
        7, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
    Tensor score = bf16_from(be, {3, T}, sv);
    Tensor mask = make(be, DType::I32, {3, 1});
    be.candidate_blocks(score, i32_from(be, {3}, {9, 4, 1}), 1, block, 2, mask);
    EXPECT_EQ(mask.ptr<uint32_t>()[0], 0b101u);
    EXPECT_EQ(mask.ptr<uint32_t>()[1], 0b011u);
    // row 2 at ratio 1 would see 2 positions; at ratio 2 (n_t = 1) only block 0, and the -inf pick is dropped
    Tensor mask2 = make(be, DType::I32, {3, 1});
    be.candidate_blocks(score, i32_from(be, {3}, {9, 4, 1}), 2, block, 2, mask2);
    EXPECT_EQ(mask2.ptr<uint32_t>()[2], 0b001u);
    // n_t = 0 (qpos 0 at ratio 2): (0 - 1) // 4 = -1 matches no block, so nothing is pinned (the
    // reference compares arange(nb) == last); every block is -inf and dropped.
    Tensor s0 = bf16_from(be, {1, T}, std::vector<float>(T, -kInf));
    Tensor m0 = make(be, DType::I32, {1, 1});
    be.candidate_blocks(s0, i32_from(be, {1}, {0}), 2, block, 2, m0);
    EXPECT_EQ(m0.ptr<uint32_t>()[0], 0u);
    // topk_blocks >= n_blocks keeps every reachable block.
    Tensor m3 = make(be, DType::I32, {3, 1});
    be.candidate_blocks(score, i32_from(be, {3}, {9, 4, 1}), 1, block, 50, m3);
    EXPECT_EQ(m3.ptr<uint32_t>()[0], 0b111u);
    EXPECT_EQ(m3.ptr<uint32_t>()[1], 0b011u);

    // apply_candidate_mask: positions of unkept blocks become -inf.
    Tensor s = clone(be, score);
    be.apply_candidate_mask(s, mask, block);
    for (int64_t j = 0; j < T; ++j) {
        const bool kept = (0b101u >> (j / block)) & 1u;
        EXPECT_EQ(s.ptr<uint16_t>()[j], kept ? score.ptr<uint16_t>()[j] : f32_to_bf16(-kInf)) << j;
    }
}

TEST(CpuCandidateBlocks, ManyBlocksUseMultipleMaskWords) {
    CpuBackend be(2);
    Rng rng(40);
    const int64_t T = 300, block = 4, nb = 75;  // 3 words per row
    Tensor score = random_bf16(be, {2, T}, rng);
    Tensor mask = make(be, DType::I32, {2, 3});
    be.candidate_blocks(score, i32_from(be, {2}, {299, 100}), 1, block, 10, mask);
    for (int64_t r = 0; r < 2; ++r) {
        int bits = 0;
        for (int w = 0; w < 3; ++w) bits += __builtin_popcount(mask.ptr<uint32_t>()[r * 3 + w]);
        EXPECT_EQ(bits, 10);
    }
    const int64_t pinned0 = 299 / block, pinned1 = 100 / block;
    EXPECT_TRUE((mask.ptr<uint32_t>()[pinned0 / 32] >> (pinned0 % 32)) & 1u);
    EXPECT_TRUE((mask.ptr<uint32_t>()[3 + pinned1 / 32] >> (pinned1 % 32)) & 1u);
    EXPECT_LT(pinned0, nb);
}
