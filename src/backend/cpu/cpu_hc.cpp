// CPU hyper-connection ops (docs/MODEL.md 4.5, 5.5, 8.2).
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"

namespace ds4r {

void CpuBackend::hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base,
                          float norm_eps, float hc_eps, int iters, const Tensor& pre, const Tensor& post,
                          const Tensor& comb) {
    // X BF16 [M, hc, D]; fn F32 [mix, hc*D]; scale F32 [3]; base F32 [mix]
    // -> pre F32 [M, hc], post F32 [M, hc], comb F32 [M, hc, hc].
    // z = fp32(X) flattened; r = rsqrt(mean(z^2) + norm_eps): ONE statistic over all copies, eps =
    // norm_eps (docs/MODEL.md 4.5); mixes = fp32(z . fn_i) * r (the norm after the projection; the dot
    // accumulated in double, rounded once); then hc_split_sinkhorn (5.5).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::hc_mixes(X, fn, scale, base, iters, pre, post, comb);
    const auto M = dims.M;
    const auto hc = dims.hc;
    const auto D = dims.D;
    const int64_t mix = (2 + hc) * hc;
    const uint16_t* xp = X.ptr<uint16_t>();
    const float* F = fn.ptr<float>();
    parallel_for(M, static_cast<double>(mix * hc * D), [&](int64_t r0, int64_t r1) {
        std::vector<double> z(static_cast<size_t>(hc * D));
        std::vector<float> mixes(static_cast<size_t>(mix));
        for (int64_t r = r0; r < r1; ++r) {
            const uint16_t* xr = xp + r * hc * D;
            for (int64_t c = 0; c < hc * D; ++c) z[static_cast<size_t>(c)] = bf16_to_f32(xr[c]);
            const float ms = cpuref::mean_from_sum(cpuref::sum_sq_bf16_f32(xr, hc * D), hc * D);
            const float rs = cpuref::rsqrt_f32(ms + norm_eps);
            for (int64_t i = 0; i < mix; ++i) {
                const float* fi = F + i * hc * D;
                double s = 0.0;
                for (int64_t c = 0; c < hc * D; ++c)
                    s += z[static_cast<size_t>(c)] * static_cast<double>(fi[c]);
                mixes[static_cast<size_t>(i)] = static_cast<float>(s) * rs;
            }
            cpuref::hc_split_sinkhorn(mixes.data(), scale.ptr<float>(), base.ptr<float>(),
                                      static_cast<int>(hc), iters, hc_eps, pre.ptr<float>() + r * hc,
                                      post.ptr<float>() + r * hc, comb.ptr<float>() + r * hc * hc);
        }
    });
}

void CpuBackend::hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) {
    // y BF16 [M, D] = bf16(sum_k mix_k * X_k), products in fp32, summed sequentially from 0
    // (((0 + m0*X0) + m1*X1) + m2*X2) + m3*X3 as torch.sum does on CUDA (docs/MODEL.md 8.2).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::hc_pre(X, mix, y);
    const auto M = dims.M;
    const auto hc = dims.hc;
    const auto D = dims.D;
    const uint16_t* xp = X.ptr<uint16_t>();
    const float* mp = mix.ptr<float>();
    uint16_t* yp = y.ptr<uint16_t>();
    parallel_for(M, static_cast<double>(hc * D), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t d = 0; d < D; ++d) {
                float acc = 0.0f;
                for (int64_t k = 0; k < hc; ++k)
                    acc += mp[r * hc + k] * bf16_to_f32(xp[(r * hc + k) * D + d]);
                yp[r * D + d] = f32_to_bf16(acc);
            }
    });
}

void CpuBackend::hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                         const Tensor& out) {
    // out BF16 [M, hc, D]: out_k = bf16(post_k * x + S_k), S_k = sum_j comb[j][k] * R_j summed
    // sequentially from 0 (docs/MODEL.md 4.5, 8.2: the output copy is comb's COLUMN). x BF16 [M, D];
    // R BF16 [M, hc, D] (may alias out); post F32 [M, hc]; comb F32 [M, hc, hc].
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::hc_post(x, R, post, comb, out);
    const auto M = dims.M;
    const auto hc = dims.hc;
    const auto D = dims.D;
    const uint16_t* xp = x.ptr<uint16_t>();
    const uint16_t* rp = R.ptr<uint16_t>();
    const float* pp = post.ptr<float>();
    const float* cp = comb.ptr<float>();
    uint16_t* op_ = out.ptr<uint16_t>();
    parallel_for(M, static_cast<double>(hc * hc * D), [&](int64_t r0, int64_t r1) {
        std::vector<float> res(static_cast<size_t>(hc)), o(static_cast<size_t>(hc));
        for (int64_t r = r0; r < r1; ++r) {
            const float* c = cp + r * hc * hc;
            for (int64_t d = 0; d < D; ++d) {
                for (int64_t j = 0; j < hc; ++j)
                    res[static_cast<size_t>(j)] = bf16_to_f32(rp[(r * hc + j) * D + d]);
                const float xv = bf16_to_f32(xp[r * D + d]);
                for (int64_t k = 0; k < hc; ++k) {
                    float s = 0.0f;
                    for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k] * res[static_cast<size_t>(j)];
                    o[static_cast<size_t>(k)] = pp[r * hc + k] * xv + s;
                }
                // all reads of this d are done before the writes: out may alias R
                for (int64_t k = 0; k < hc; ++k)
                    op_[(r * hc + k) * D + d] = f32_to_bf16(o[static_cast<size_t>(k)]);
            }
        }
    });
}

}  // namespace ds4r
