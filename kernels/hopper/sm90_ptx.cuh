// PTX wrappers of the Hopper (sm_90a) instructions the wgmma GEMMs use: mbarriers, cp.async into
// 128-byte-swizzled tiles, the async-proxy fence, wgmma shared-memory descriptors and the wgmma
// instructions themselves. Device code only; included by kernels/hopper/gemm_sm90_stage.cuh (and so
// gemm_sm90.cu), which is compiled for sm_90a alone (CMakeLists.txt).
#pragma once

#include <stdint.h>

#include "../gemm_tile.cuh"

namespace ds4r::kern::sm90 {

// The copies shared with the portable kernels: smem_u32, cp_async16 (16 bytes, zero-filled past
// src_bytes), cp_async_commit, cp_async_wait<N> (gemm_tile.cuh).
using gemm::cp_async16;
using gemm::cp_async_commit;
using gemm::cp_async_wait;
using gemm::smem_u32;

// ------------------------------------------------------------------ mbarriers (CTA scope)
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (one thread standing for a warpgroup).
__device__ __forceinline__ void mbar_arrive_count(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
        "p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}
// Waits until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

// ------------------------------------------------------------------ copies and fences
// Orders this thread's earlier shared-memory writes (plain stores, completed cp.async copies) before
// later reads by the async proxy (wgmma operands), once published through a barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ------------------------------------------------------------------ 128-byte swizzle
// Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte rows stored in wgmma's
// 128-byte swizzle (8-row x 128-byte atoms; the chunk index XORed with the row inside the atom).
// The tile base must be 1024-byte aligned.
__device__ __forceinline__ uint32_t swz128(int r, int c) {
    return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}
// wgmma shared-memory matrix descriptor of a K-major operand in that layout, starting at `addr` (a
// tile base plus a K offset of a multiple of 16 bytes inside the 128-byte row): start address >> 4
// (bits 0-13), leading-dimension offset (unused by swizzled K-major layouts; 1), stride between
// 8-row groups 1024 bytes >> 4 (bits 32-45), swizzle mode 1 = 128 bytes (bits 62-63).
__host__ __device__ __forceinline__ constexpr uint64_t desc_k128(uint32_t addr) {
    uint64_t d = static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);
    d |= static_cast<uint64_t>(1u) << 16;
    d |= static_cast<uint64_t>(1024u >> 4) << 32;
    d |= static_cast<uint64_t>(1u) << 62;
    return d;
}

// The descriptor of the operand tile `bytes` (a multiple of 16) past desc's: its start address field
// (bits 0-13, 16-byte units) plus bytes / 16 in the low word alone. Shared addresses lie below 228 KB, so
// the field never carries into the fields above it (desc_k128(addr + bytes) == desc_add(desc_k128(addr),
// bytes)); the stage loops add compile-time offsets to one descriptor per stage this way.
__host__ __device__ __forceinline__ constexpr uint64_t desc_add(uint64_t desc, uint32_t bytes) {
    const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | lo;
}
// desc_add against desc_k128 over the shared window's 16-byte-aligned addresses (227 KB) and the stage
// offsets the consumers add (B halves of up to 256 rows, blocks at 0 / 32 / 64 / 96 bytes)
constexpr bool desc_add_matches_desc_k128() {
    for (uint32_t a = 0; a < 227u * 1024u; a += 1008u)  // (a multiple of 16, not of 1024: every phase)
        for (uint32_t b : {0u, 32u, 64u, 96u, 16384u, 32768u + 96u})
            if (a + b < 227u * 1024u && desc_add(desc_k128(a & ~15u), b) != desc_k128((a & ~15u) + b))
                return false;
    return true;
}
static_assert(desc_add_matches_desc_k128(), "wgmma descriptors: desc_add must equal desc_k128 of the sum");

// ------------------------------------------------------------------ wgmma
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kN>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kN) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across wgmma fences / waits.
// Register budgets of warp-specialized kernels (sm_90a): producers give registers up, consumers take them.
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A . B^T for one warpgroup: A 64 x K-step from descriptor da, B N x K-step from db (both
// K-major); scale_d == 0: d = A . B (a fresh sum), else d += A . B. Accumulator fragment: thread t of
// the warpgroup holds d[i] at row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (t % 4) + i % 2.
// The accumulator operands of an m64nN wgmma (N / 2 fp32 registers per thread): the PTX register
// list and the asm constraints, written once for the wrappers below.
#define DS4R_WGMMA_D64_LIST                                                            \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DS4R_WGMMA_D64_OUT                                                                          \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define DS4R_WGMMA_D128_LIST                                                                       \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define DS4R_WGMMA_D128_OUT                                                                               \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),        \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),        \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),        \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),        \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),        \
        "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),        \
        "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),        \
        "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),        \
        "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),        \
        "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),  \
        "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), \
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), \
        "+f"(d[127])
// name(d, da, db, scale_d): one wgmma of `types` (e.g. "m64n128k32.f32.e4m3.e4m3") with n accumulators;
// ops: the PTX operand numbers of da, db, scale_d ("%64", "%65", "%66" for n = 64); extra: the
// transpose immediates of 16-bit types (", 0, 0": both K-major), none for fp8.
#define DS4R_WGMMA(name, types, n, op_da, op_db, op_sd, extra)                                       \
    __device__ __forceinline__ void name(float(&d)[n], uint64_t da, uint64_t db, uint32_t scale_d) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " op_sd                                       \
                     ", 0;\n"                                                                        \
                     "wgmma.mma_async.sync.aligned." types " {" DS4R_WGMMA_D##n##_LIST               \
                     "}, " op_da ", " op_db ", p, 1, 1" extra ";\n}\n"                               \
                     : DS4R_WGMMA_D##n##_OUT                                                         \
                     : "l"(da), "l"(db), "r"(scale_d));                                              \
    }
DS4R_WGMMA(wgmma_m64n128k32_e4m3, "m64n128k32.f32.e4m3.e4m3", 64, "%64", "%65", "%66", "")
DS4R_WGMMA(wgmma_m64n128k16_bf16, "m64n128k16.f32.bf16.bf16", 64, "%64", "%65", "%66", ", 0, 0")
DS4R_WGMMA(wgmma_m64n128k16_f16, "m64n128k16.f32.f16.f16", 64, "%64", "%65", "%66", ", 0, 0")
DS4R_WGMMA(wgmma_m64n256k16_bf16, "m64n256k16.f32.bf16.bf16", 128, "%128", "%129", "%130", ", 0, 0")

// As wgmma_m64n128k16_f16 with A from registers: a[4] is the thread's fp16x2 fragment of the warp's 16
// rows (the mma.sync m16n8k16 A fragment: rows g = (t % 32) / 4 and g + 8 of warp t / 32's slice,
// k = 2 (t % 4) (+1) and + 8: a[0] (g, k), a[1] (g + 8, k), a[2] (g, k + 8), a[3] (g + 8, k + 8)).
// The registers must stay unchanged until a wait retires the wgmma.
__device__ __forceinline__ void wgmma_m64n128k16_f16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                                        uint32_t scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" DS4R_WGMMA_D64_LIST
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : DS4R_WGMMA_D64_OUT
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
// Keeps the compiler from moving the fragment registers' writes across wgmma fences / waits.
__device__ __forceinline__ void fence_regs_u32(uint32_t (&a)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
// ldmatrix .x4 (four 8 x 16-byte matrices; lane l gives the address of matrix l / 8's row l % 8; r[j]:
// the 4 bytes at row (lane / 4), bytes 4 (lane % 4) of matrix j) from a shared-memory address.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// cp.async completion on an mbarrier: one arrival when this thread's earlier cp.async copies have
// landed (.noinc: the barrier's expected count already includes it).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 4-byte async copy (cp.async.ca: 4-byte aligned source and destination).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}
// ------------------------------------------------------------------ TMA (bulk tensor copies)
// One arrival on the barrier that also expects `bytes` more transaction bytes (the TMA copies below
// complete them), for this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Copies the box at element coordinates (c0: innermost, c1, c2) of the tensor map at generic address
// `map` (a __grid_constant__ kernel parameter) into shared memory at dst (1024-byte aligned for the
// 128-byte swizzle), completing its bytes on `bar`. Boxes reaching past the tensor are zero-filled.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4}], [%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

// Named barrier for `threads` threads (a multiple of 32) of the CTA.
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ds4r::kern::sm90
