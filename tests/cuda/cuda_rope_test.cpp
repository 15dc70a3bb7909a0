// CUDA RoPE: the tables bit for bit against the golden tables and the CPU backend (glibc cosf /
// sinf, docs/MODEL.md 8.3; kernels/libm_sincosf.cuh), and the in-place rotation vs the CPU backend
// (docs/MODEL.md 4.0) with batch invariance, determinism and the untouched non-rotated dims.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_misc_helpers.h"
#include "cuda_test_util.h"
#include "ds4r/config.h"
#include "ds4r/npy.h"
#include "ds4r/numeric.h"
#include "test_util.h"

#ifdef DS4R_HAVE_CUDA
#include "testkit/rope_libdevice.h"
#endif

using namespace ds4r;
using namespace ds4r::test;
using namespace ds4r::test::misc;

namespace {

struct TableArgs {
    double base, factor;
    int64_t orig;
    double beta_fast, beta_slow;
    int64_t rd;
};

std::vector<float> table_on(Backend& be, const TableArgs& a, int64_t n_pos) {
    Tensor t = be.alloc(DType::F32, {n_pos, a.rd / 2, 2});
    be.fill(t, 0xFF);  // NaN poison: every entry must be written
    be.rope_table(a.base, a.factor, a.orig, a.beta_fast, a.beta_slow, a.rd, t);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t, 0, t.nbytes());
    return v;
}

// Ordered-integer distance of two floats (ulps apart; 0 = identical bits).
int64_t f32_ulp_distance(float a, float b) {
    auto key = [](float f) {
        const int32_t i = static_cast<int32_t>(f32_bits(f));
        return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
    };
    const int64_t d = key(a) - key(b);
    return d < 0 ? -d : d;
}

// Bitwise table comparison; prints the mismatch count, the worst ulp distance and the first few.
size_t compare_tables(const std::vector<float>& want, const std::vector<float>& got, int64_t half,
                      const std::string& what, bool expect_equal) {
    EXPECT_EQ(want.size(), got.size()) << what;
    size_t bad = 0;
    int64_t worst = 0;
    for (size_t e = 0; e < std::min(want.size(), got.size()); ++e) {
        if (f32_bits(want[e]) == f32_bits(got[e])) continue;
        const int64_t d = f32_ulp_distance(want[e], got[e]);
        worst = std::max(worst, d);
        if (expect_equal && bad < 5) {
            const size_t pair = e / 2;
            ADD_FAILURE() << what << ": pos " << pair / static_cast<size_t>(half) << " pair "
                          << pair % static_cast<size_t>(half) << (e % 2 ? " sin " : " cos ") << "want "
                          << want[e] << " got " << got[e] << " (" << d << " ulp)";
        }
        ++bad;
    }
    std::printf("[stats] %s: %zu of %zu entries differ, max %lld fp32 ulp\n", what.c_str(), bad, want.size(),
                (long long)worst);
    if (expect_equal) {
        EXPECT_EQ(bad, 0u) << what;
    }
    return bad;
}

std::vector<float> load_golden_table(const std::string& name) {
    const NpyArray a = load_npy(data_dir() + "/tiny-a/" + name);
    EXPECT_EQ(a.descr, "<f4") << name;
    EXPECT_EQ(a.shape.size(), 3u) << name;
    return a.to_vector<float>();
}

void golden_table_case(const std::string& file, const TableArgs& args) {
    const std::vector<float> golden = load_golden_table(file);
    const int64_t half = args.rd / 2;
    ASSERT_EQ(golden.size() % static_cast<size_t>(half * 2), 0u);
    const int64_t n_pos = static_cast<int64_t>(golden.size()) / (half * 2);
    const std::vector<float> got = table_on(*cuda(), args, n_pos);
    compare_tables(golden, got, half, "cuda rope_table vs " + file, true);
    compare_tables(golden, table_on(cpu(), args, n_pos), half, "cpu rope_table vs " + file, true);
#ifdef DS4R_HAVE_CUDA
    // Diagnostic: CUDA's own libdevice cosf / sinf on the same angles (what docs/MODEL.md 8.3 proposed).
    auto* be = dynamic_cast<CudaBackend*>(cuda());
    ASSERT_NE(be, nullptr);
    Tensor t = be->alloc(DType::F32, {n_pos, half, 2});
    cuda_rope_table_libdevice(*be, args.base, args.factor, args.orig, args.beta_fast, args.beta_slow, args.rd,
                              t);
    std::vector<float> lib(static_cast<size_t>(t.numel()));
    be->download(lib.data(), t, 0, t.nbytes());
    const size_t lib_bad = compare_tables(golden, lib, half, "libdevice cosf/sinf table vs " + file, false);
    std::printf("[info] %s: libdevice cosf/sinf would miss %zu of %zu golden entries (the glibc port: 0)\n",
                file.c_str(), lib_bad, golden.size());
#endif
}

}  // namespace

TEST(CudaRope, TablePlainMatchesGoldenBitExact) {
    DS4R_REQUIRE_CUDA();
    const ModelConfig c = load_model_config(data_dir() + "/tiny-a/model/config.json");
    // ratio-0 layers: base rope_theta, no YaRN (the model passes factor 1, orig 0).
    golden_table_case("rope_plain.npy", {c.rope_theta, 1.0, 0, c.beta_fast, c.beta_slow, c.rope_head_dim});
}

TEST(CudaRope, TableYarnMatchesGoldenBitExact) {
    DS4R_REQUIRE_CUDA();
    const ModelConfig c = load_model_config(data_dir() + "/tiny-a/model/config.json");
    ASSERT_GT(c.original_seq_len, 0);
    golden_table_case("rope_yarn.npy", {c.compress_rope_theta, c.rope_factor, c.original_seq_len, c.beta_fast,
                                        c.beta_slow, c.rope_head_dim});
}

// The V4.1 tables (rd 64; YaRN band 15..25) at model sizes, bit for bit against the CPU backend (its
// glibc cosf / sinf), including angles past 105615 rad (the large-argument reduction), and
// deterministic.
TEST(CudaRope, TablesMatchCpuAtModelSizes) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    const TableArgs plain{10000.0, 1.0, 0, 32, 1, 64};
    const TableArgs yarn{160000.0, 16.0, 65536, 32, 1, 64};
    const TableArgs tiny_rd{160000.0, 16.0, 32, 32, 1, 16};
    const int64_t n_plain = small ? 2048 : (int64_t{1} << 17);
    const int64_t n_yarn = small ? 2048 : (int64_t{1} << 20);
    compare_tables(table_on(cpu(), plain, n_plain), table_on(*cuda(), plain, n_plain), 32,
                   "plain rd 64 cuda vs cpu", true);
    const std::vector<float> y1 = table_on(*cuda(), yarn, n_yarn);
    compare_tables(table_on(cpu(), yarn, n_yarn), y1, 32, "yarn rd 64 cuda vs cpu", true);
    compare_tables(table_on(cpu(), tiny_rd, 4096), table_on(*cuda(), tiny_rd, 4096), 8,
                   "yarn rd 16 cuda vs cpu", true);
    const std::vector<float> y2 = table_on(*cuda(), yarn, n_yarn);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0)
        << "rope_table not deterministic";
}

// ---------------------------------------------------------------------------- rope_inplace

namespace {

struct RotCase {
    const char* name;
    int64_t M, heads, width, rd;
    bool inverse;
    float scale;
};

constexpr int64_t kRotPositions = 4096;

// The same table bytes on both sides (the op is tested in isolation from the table).
Pair shared_table(int64_t rd) {
    Tensor t = cpu().alloc(DType::F32, {kRotPositions, rd / 2, 2});
    cpu().rope_table(160000.0, 16.0, 65536, 32, 1, rd, t);
    return make_pair(DType::F32, t.shape, t.data);
}

std::vector<int32_t> random_positions(int64_t M, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(M));
    for (auto& x : p) x = static_cast<int32_t>(rng() % kRotPositions);
    if (M > 0) p[0] = 0;
    if (M > 1) p[static_cast<size_t>(M - 1)] = kRotPositions - 1;
    return p;
}

void run_rot_case(const RotCase& c) {
    SCOPED_TRACE(c.name);
    const Pair table = shared_table(c.rd);
    const std::vector<int32_t> pos = random_positions(c.M, 11 + c.M);
    const Pair p = make_pair(DType::I32, {c.M}, pos.data());
    Pair x = random_bf16({c.M, c.heads * c.width}, c.scale, 1000 + c.M * 7 + c.heads);
    const std::vector<uint8_t> input = to_host(cpu(), x.c);
    cpu().rope_inplace(x.c, c.heads, c.width, c.rd, p.c, table.c, c.inverse);
    cuda()->rope_inplace(x.g, c.heads, c.width, c.rd, p.g, table.g, c.inverse);
    bf16_stats(x, std::string("rope_inplace ") + c.name);
    // re/im: one rounding each; CUDA fuses the first product (kernels/norm_rope.cu): <= 1 bf16 ulp.
    // re = a*c - b*s cancels; fused or not, its rounding is compared in ulps of the operands (~scale).
    expect_bf16_close(x, 1.0, 0.99, std::string("rope_inplace ") + c.name, c.scale);
    // The non-rotated dims of every head are untouched.
    const std::vector<uint8_t> out = to_host(*cuda(), x.g);
    size_t changed = 0;
    for (int64_t r = 0; r < c.M; ++r)
        for (int64_t h = 0; h < c.heads; ++h)
            for (int64_t d = 0; d < c.width - c.rd; ++d) {
                const size_t off = static_cast<size_t>(((r * c.heads + h) * c.width + d) * 2);
                changed += std::memcmp(&out[off], &input[off], 2) != 0;
            }
    EXPECT_EQ(changed, 0u) << c.name << ": non-rotated dims changed";
    // Determinism: the same input again gives the same bits.
    Tensor again = cuda_tensor(DType::BF16, x.g.shape, input.data());
    cuda()->rope_inplace(again, c.heads, c.width, c.rd, p.g, table.g, c.inverse);
    expect_bytes_equal(out, to_host(*cuda(), again), 2, std::string("rope_inplace determinism ") + c.name);
    // Batch invariance: a row alone gives the bits it got inside the batch.
    const size_t rb = static_cast<size_t>(c.heads * c.width * 2);
    for (int64_t r : {int64_t{0}, c.M / 2, c.M - 1}) {
        Tensor one = cuda_tensor(DType::BF16, {1, c.heads * c.width}, &input[static_cast<size_t>(r) * rb]);
        Tensor pos1 = cuda_tensor(DType::I32, {1}, &pos[static_cast<size_t>(r)]);
        cuda()->rope_inplace(one, c.heads, c.width, c.rd, pos1, table.g, c.inverse);
        expect_bytes_equal(
            row_bytes(out, rb, r, r + 1), to_host(*cuda(), one), 2,
            std::string("rope_inplace batch invariance row ") + std::to_string(r) + " " + c.name);
    }
}

}  // namespace

TEST(CudaRope, InplaceMatchesCpuRealShapes) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    const int64_t H = small ? 4 : 64;
    const RotCase cases[] = {
        {"q 64x512 rd64 M130", 130, H, 512, 64, false, 1.0f},
        {"q 64x512 rd64 M17 inverse (output de-rotation)", 17, H, 512, 64, true, 1.0f},
        {"window kv 1x512 rd64 M130", 130, 1, 512, 64, false, 4.0f},
        {"indexer q 64x128 rd64 M3", 3, H, 128, 64, false, 1.0f},
        {"index k 1x128 rd64 M1", 1, 1, 128, 64, false, 1.0f},
        {"tiny 4x64 rd16 M5", 5, 4, 64, 16, false, 1.0f},
        {"odd 3x70 rd6 M17 inverse", 17, 3, 70, 6, true, 30.0f},
    };
    for (const RotCase& c : cases) run_rot_case(c);
}

// Out-of-table positions cannot be checked on the host (pos lives on the GPU): the rotated dims of
// such a row become NaN, the rest of the row and the other rows are untouched / rotated normally.
TEST(CudaRope, InplaceOutOfTablePositionGivesNaN) {
    DS4R_REQUIRE_CUDA();
    const int64_t heads = 2, width = 32, rd = 8, M = 3;
    const Pair table = shared_table(rd);
    const std::vector<int32_t> pos = {5, static_cast<int32_t>(kRotPositions), -1};
    const Pair p = make_pair(DType::I32, {M}, pos.data());
    Pair x = random_bf16({M, heads * width}, 1.0f, 77);
    const std::vector<uint8_t> input = to_host(cpu(), x.c);
    cuda()->rope_inplace(x.g, heads, width, rd, p.g, table.g, false);
    const std::vector<uint8_t> out = to_host(*cuda(), x.g);
    // row 0: rotated like the CPU
    Tensor row0 = cpu().alloc(DType::BF16, {1, heads * width});
    cpu().upload(row0, 0, input.data(), row0.nbytes());
    Tensor pos0 = cpu().alloc(DType::I32, {1});
    cpu().upload(pos0, 0, pos.data(), 4);
    cpu().rope_inplace(row0, heads, width, rd, pos0, table.c, false);
    const uint16_t* c0 = row0.ptr<uint16_t>();
    for (int64_t r = 0; r < M; ++r)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < width; ++d) {
                const size_t e = static_cast<size_t>((r * heads + h) * width + d);
                uint16_t got, in;
                std::memcpy(&got, &out[2 * e], 2);
                std::memcpy(&in, &input[2 * e], 2);
                if (d < width - rd) {
                    EXPECT_EQ(got, in) << "row " << r << " head " << h << " dim " << d << " changed";
                } else if (r == 0) {
                    const float want = bf16_to_f32(c0[h * width + d]), g = bf16_to_f32(got);
                    EXPECT_LE(std::fabs(want - g), std::ldexp(std::fabs(want), -7)) << "row 0 dim " << d;
                } else {
                    EXPECT_TRUE(std::isnan(bf16_to_f32(got)))
                        << "row " << r << " (pos " << pos[static_cast<size_t>(r)] << ") dim " << d
                        << " not NaN";
                }
            }
}
