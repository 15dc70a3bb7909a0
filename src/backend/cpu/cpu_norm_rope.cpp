// CPU RMSNorm and RoPE (docs/MODEL.md 4.0, 8.2, 8.3).
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
    // x, y BF16 [M, N] (may alias), w BF16 [N]:
    //   var = mean(x^2) (fp32: exact sum of the exact squares rounded once, then * fp32(1/N) as
    //         CUDA torch.mean does, cpuref::mean_from_sum); r = 1/sqrt(var + eps) exactly rounded
    //         (CUDA: rsqrtf, docs/MODEL.md 8.2); y = bf16(w * (x * r)), products in fp32.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::rms_norm(x, w, y);
    const auto M = dims.M;
    const auto N = dims.N;
    const uint16_t* xp = x.ptr<uint16_t>();
    const uint16_t* wp = w.ptr<uint16_t>();
    uint16_t* yp = y.ptr<uint16_t>();
    parallel_for(M, static_cast<double>(N), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const uint16_t* xr = xp + r * N;
            uint16_t* yr = yp + r * N;
            const float var = cpuref::mean_from_sum(cpuref::sum_sq_bf16_f32(xr, N), N);
            const float rs = cpuref::rsqrt_f32(var + eps);
            for (int64_t i = 0; i < N; ++i)
                yr[i] = f32_to_bf16(bf16_to_f32(wp[i]) * (bf16_to_f32(xr[i]) * rs));
        }
    });
}

void CpuBackend::rope_table(double base, double factor, int64_t yarn_orig, double beta_fast, double beta_slow,
                            int64_t rd, const Tensor& table) {
    // table F32 [n_pos, rd/2, 2]: (cos, sin) of fp32(pos) * f_i (docs/MODEL.md 4.0; cpuref::rope_inv_freqs
    // says which evaluation the golden tables follow).
    opcheck::rope_table(base, factor, rd, table);
    const int64_t half = rd / 2, n_pos = table.dim(0);
    std::vector<float> f(static_cast<size_t>(half));
    cpuref::rope_inv_freqs(base, factor, yarn_orig, beta_fast, beta_slow, rd, f.data());
    float* t = table.ptr<float>();
    parallel_for(n_pos, static_cast<double>(half) * 40.0, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
            for (int64_t i = 0; i < half; ++i)
                cpuref::rope_cos_sin(p, f[static_cast<size_t>(i)], &t[(p * half + i) * 2],
                                     &t[(p * half + i) * 2 + 1]);
    });
}

void CpuBackend::rope_inplace(const Tensor& x, int64_t heads, int64_t width, int64_t rd, const Tensor& pos,
                              const Tensor& table, bool inverse) {
    // x BF16 [M, heads * width]: the last rd dims of each head, as interleaved pairs (x[2i], x[2i+1]),
    // times (c + i s) (or its conjugate): re = a*c - b*s, im = a*s + b*c, each product rounded in
    // fp32, then one rounding to bf16 (docs/MODEL.md 4.0, 8.3). pos I32 [M]; table F32 [n_pos, rd/2, 2].
    const int64_t M = opcheck::rope_inplace(x, heads, width, rd, pos, table);
    const int64_t n_pos = table.dim(0), half = rd / 2;
    const int32_t* pp = pos.ptr<int32_t>();
    for (int64_t r = 0; r < M; ++r)
        DS4R_CHECK(pp[r] >= 0 && pp[r] < n_pos,
                   "cpu rope_inplace: pos[%lld] = %d outside the table's %lld rows", (long long)r, pp[r],
                   (long long)n_pos);
    uint16_t* xp = x.ptr<uint16_t>();
    const float* t = table.ptr<float>();
    parallel_for(M, static_cast<double>(heads * rd), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const float* tr = t + static_cast<int64_t>(pp[r]) * half * 2;
            for (int64_t h = 0; h < heads; ++h) {
                uint16_t* v = xp + r * heads * width + h * width + (width - rd);
                for (int64_t i = 0; i < half; ++i) {
                    const float a = bf16_to_f32(v[2 * i]), b = bf16_to_f32(v[2 * i + 1]);
                    const float c = tr[2 * i];
                    const float s = inverse ? -tr[2 * i + 1] : tr[2 * i + 1];
                    const float re = a * c - b * s;
                    const float im = a * s + b * c;
                    v[2 * i] = f32_to_bf16(re);
                    v[2 * i + 1] = f32_to_bf16(im);
                }
            }
        }
    });
}

}  // namespace ds4r
