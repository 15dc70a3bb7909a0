#include "cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "ds4r/error.h"
#include "ds4r/numeric.h"

#ifdef DS4R_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ds4r::test {

namespace {
struct Backends {
    std::unique_ptr<Backend> c, g;
    std::string why;
    Backends() {
        c = make_cpu_backend();
        g = make_cuda_backend(0, &why, 0, test_kernels());
    }
};
Backends& bk() {
    static Backends b;
    return b;
}
}  // namespace

Backend& cpu() {
    return *bk().c;
}
Backend* cuda() {
    return bk().g.get();
}
const std::string& cuda_why() {
    return bk().why;
}
const std::string& cuda_skip_message() {
#ifdef DS4R_HAVE_CUDA
    static const std::string m = [] {
        // "no GPU found[: detail]" from make_cuda_backend -> "no GPU found: CUDA tests skipped (detail)"
        const std::string head = "no GPU found";
        std::string w = cuda_why();
        if (w.rfind(head, 0) == 0) w = w.substr(w.rfind(head + ": ", 0) == 0 ? head.size() + 2 : head.size());
        return "no GPU found: CUDA tests skipped" + (w.empty() ? std::string() : " (" + w + ")");
    }();
#else
    static const std::string m = "built without CUDA: CUDA tests skipped (" + cuda_why() + ")";
#endif
    return m;
}

namespace {
// fn(impl) on the backend's implementation type.
template <class Fn>
void on_impl(Backend& be, const char* op, Fn&& fn) {
    if (auto* c = dynamic_cast<CpuBackend*>(&be)) return fn(*c);
#ifdef DS4R_HAVE_CUDA
    if (auto* g = dynamic_cast<CudaBackend*>(&be)) return fn(*g);
#endif
    throw RuntimeError(std::string(op) + ": backend " + be.name() + " has no such op");
}
}  // namespace

void act_quant_fp8(Backend& be, const Tensor& x, const Tensor& q, const Tensor& s) {
    on_impl(be, "act_quant_fp8", [&](auto& impl) { impl.act_quant_fp8(x, q, s); });
}
void linear_fp4(Backend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y) {
    on_impl(be, "linear_fp4", [&](auto& impl) { impl.linear_fp4(x, w, y); });
}
void window_indices(Backend& be, const Tensor& qpos, int64_t window, const Tensor& idx) {
    on_impl(be, "window_indices", [&](auto& impl) { impl.window_indices(qpos, window, idx); });
}

Pair make_pair(DType t, const Shape& shape, const void* host) {
    Pair p{cpu().alloc(t, shape), cuda()->alloc(t, shape)};
    const size_t n = p.c.nbytes();
    if (n) {
        cpu().upload(p.c, 0, host, n);
        cuda()->upload(p.g, 0, host, n);
    }
    return p;
}

Pair make_output(DType t, const Shape& shape) {
    Pair p{cpu().alloc(t, shape), cuda()->alloc(t, shape)};
    cpu().fill(p.c, 0);
    cuda()->fill(p.g, 0xFF);
    return p;
}

Pair random_bf16(const Shape& shape, float scale, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<uint16_t> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& x : v) x = f32_to_bf16(nd(rng));
    return make_pair(DType::BF16, shape, v.data());
}

Pair random_f32(const Shape& shape, float scale, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& x : v) x = nd(rng);
    return make_pair(DType::F32, shape, v.data());
}

Pair random_bytes(DType t, const Shape& shape, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> v(static_cast<size_t>(shape_numel(shape)) * dtype_size(t));
    for (auto& x : v) x = static_cast<uint8_t>(rng());
    return make_pair(t, shape, v.data());
}

namespace {
void fill_fp8_weights(int64_t n, int64_t k, uint64_t seed, std::vector<uint8_t>& w, std::vector<uint8_t>& s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    w.resize(static_cast<size_t>(n * k));
    for (auto& b : w) b = f32_to_e4m3(nd(rng) * 64.0f);  // spread over the e4m3 range
    const int64_t sn = (n + 31) / 32, sk = (k + 31) / 32;
    s.resize(static_cast<size_t>(sn * sk));
    // scales around 2^-10 keep products well inside fp32 / bf16
    for (auto& b : s) b = static_cast<uint8_t>(127 - 13 + static_cast<int>(rng() % 6));
}
}  // namespace

Fp8Linear random_fp8_linear(Backend& be, int64_t n, int64_t k, uint64_t seed, std::vector<uint8_t>* wh,
                            std::vector<uint8_t>* sh) {
    std::vector<uint8_t> w, s;
    fill_fp8_weights(n, k, seed, w, s);
    Fp8Linear l{be.alloc(DType::F8_E4M3, {n, k}), be.alloc(DType::F8_E8M0, {(n + 31) / 32, (k + 31) / 32})};
    be.upload(l.w, 0, w.data(), w.size());
    be.upload(l.s, 0, s.data(), s.size());
    if (wh) *wh = w;
    if (sh) *sh = s;
    return l;
}

std::pair<Fp8Linear, Fp8Linear> random_fp8_linear_pair(int64_t n, int64_t k, uint64_t seed) {
    return {random_fp8_linear(cpu(), n, k, seed), random_fp8_linear(*cuda(), n, k, seed)};
}

std::pair<Fp4Linear, Fp4Linear> random_fp4_linear_pair(int64_t n, int64_t k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> w(static_cast<size_t>(n * k / 2)), s(static_cast<size_t>(n * ((k + 31) / 32)));
    for (auto& b : w) b = static_cast<uint8_t>(rng());  // every e2m1 code pair is valid
    for (auto& b : s) b = static_cast<uint8_t>(127 - 6 + static_cast<int>(rng() % 4));
    auto mk = [&](Backend& be) {
        Fp4Linear l{be.alloc(DType::I8, {n, k / 2}), be.alloc(DType::F8_E8M0, {n, (k + 31) / 32})};
        be.upload(l.w, 0, w.data(), w.size());
        be.upload(l.s, 0, s.data(), s.size());
        return l;
    };
    return {mk(cpu()), mk(*cuda())};
}

std::vector<uint8_t> to_host(Backend& be, const Tensor& t) {
    std::vector<uint8_t> v(t.nbytes());
    if (!v.empty()) be.download(v.data(), t, 0, v.size());
    return v;
}

void expect_bitwise_equal(const Pair& p, const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t es = dtype_size(p.c.dtype);
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i += es)
        if (std::memcmp(&a[i], &b[i], es) != 0) {
            if (bad < 5) ADD_FAILURE() << what << ": element " << i / es << " differs (cpu vs cuda bytes)";
            ++bad;
        }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() / es << " elements differ";
}

void expect_bf16_close(const Pair& p, double max_ulps, double min_equal, const std::string& what) {
    expect_bf16_close(p, max_ulps, min_equal, what, 0.0);
}

void expect_bf16_close(const Pair& p, double max_ulps, double min_equal, const std::string& what,
                       double magnitude_floor) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t n = a.size() / 2;
    size_t equal = 0, bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
        uint16_t x, y;
        std::memcpy(&x, &a[2 * i], 2);
        std::memcpy(&y, &b[2 * i], 2);
        if (x == y) {
            ++equal;
            continue;
        }
        float fx = bf16_to_f32(x), fy = bf16_to_f32(y);
        double ulps;
        if (std::isnan(fx) || std::isnan(fy)) {
            ulps = INFINITY;
        } else {
            // distance in bf16 ulps of the larger magnitude
            float m = std::max({std::fabs(fx), std::fabs(fy), static_cast<float>(magnitude_floor)});
            int e;
            std::frexp(m, &e);
            double ulp = std::ldexp(1.0, e - 8);
            ulps = std::fabs(static_cast<double>(fx) - fy) / ulp;
        }
        worst = std::max(worst, ulps);
        if (ulps > max_ulps) {
            if (bad < 5)
                ADD_FAILURE() << what << ": element " << i << " cpu " << fx << " cuda " << fy << " (" << ulps
                              << " ulps)";
            ++bad;
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements beyond " << max_ulps << " ulps (worst " << worst
                       << ")";
    const double frac = n ? static_cast<double>(equal) / n : 1.0;
    EXPECT_GE(frac, min_equal) << what << ": only " << frac * 100 << "% bitwise equal";
}

namespace {
template <class T>
void close_impl(const Pair& p, double rel, double abs_tol, const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t n = a.size() / sizeof(T);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
        T x, y;
        std::memcpy(&x, &a[i * sizeof(T)], sizeof(T));
        std::memcpy(&y, &b[i * sizeof(T)], sizeof(T));
        const bool ok =
            (std::isnan(x) && std::isnan(y)) || x == y ||
            std::fabs(static_cast<double>(x) - y) <= abs_tol + rel * std::fabs(static_cast<double>(x));
        if (!ok) {
            if (bad < 5) ADD_FAILURE() << what << ": element " << i << " cpu " << x << " cuda " << y;
            ++bad;
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements outside tolerance";
}
}  // namespace

void expect_f32_close(const Pair& p, double rel, double abs_tol, const std::string& what) {
    close_impl<float>(p, rel, abs_tol, what);
}
void expect_f64_close(const Pair& p, double rel, double abs_tol, const std::string& what) {
    close_impl<double>(p, rel, abs_tol, what);
}

}  // namespace ds4r::test
