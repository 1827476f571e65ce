// CPU emulation of the CUDA subset the generated GEMM kernels use, for tests without a GPU.
//
// One block at a time, one std::thread per CUDA thread: __syncthreads is a block barrier, and the
// warp-collective instructions (ldmatrix, mma.sync) exchange operands through a per-warp buffer
// between two warp barriers, following the PTX ISA fragment layouts. __shared__ variables become
// function statics (one block runs at a time); dynamic shared memory starts each block as NaNs.
// cp.async either copies at once (eager) or is queued per thread and performed only when
// cp.async.wait_group retires its group (deferred): the deferred mode catches a missing wait, the
// eager mode a stage overwritten while in use.
// What this cannot show: timing, memory-model races between blocks, bank conflicts.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __constant__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(emu::dyn_smem)

using std::min;
using std::max;

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };

namespace emu {
struct Warp {
    std::barrier<>* bar;
    const void* ptr[32];
    unsigned a[32][4], b[32][2];
};
struct Copy { void* dst; const void* src; int bytes; };
inline thread_local emu_dim3 thread_idx, block_idx;
inline thread_local int lane_id, warp_id;
inline thread_local std::deque<std::vector<Copy>> copy_groups;  // committed, oldest first
inline thread_local std::vector<Copy> copy_open;                  // not yet committed
inline emu_dim3 grid_dim, block_dim;
inline std::barrier<>* block_barrier;
inline Warp* warps;
inline bool cp_async_eager = true;
alignas(16) inline unsigned char dyn_smem[228 * 1024];

inline void do_copy(const Copy& c) {
    std::memcpy(c.dst, c.src, c.bytes);
    std::memset(static_cast<char*>(c.dst) + c.bytes, 0, 16 - c.bytes);
}
inline void warp_sync() { warps[warp_id].bar->arrive_and_wait(); }
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __expf(float v) { return std::exp(v); }

inline float bits_to_f32(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __uint_as_float(unsigned u) { return bits_to_f32(u); }
inline unsigned short f32_to_bf16_bits(float v) {
    unsigned u; std::memcpy(&u, &v, 4);
    return static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline unsigned short f32_to_f16_bits(float v) {
    _Float16 h = static_cast<_Float16>(v); unsigned short r; std::memcpy(&r, &h, 2); return r;
}
inline float f16_bits_to_f32(unsigned short b) { _Float16 h; std::memcpy(&h, &b, 2); return static_cast<float>(h); }
inline unsigned pack_bf16x2(float lo, float hi) { return f32_to_bf16_bits(lo) | (unsigned(f32_to_bf16_bits(hi)) << 16); }
inline unsigned pack_f16x2(float lo, float hi) { return f32_to_f16_bits(lo) | (unsigned(f32_to_f16_bits(hi)) << 16); }

// Vector types (u32x4, f32x2) come later, from common.cuh: templates defer the lookup.
template <class V> inline V ld_stream_16(const V* p) { return *p; }
template <class V> inline V ld_cg_f32x2(const V* p) { return *p; }
template <class V> inline V ld_nc_16(const V* p) { return *p; }

// add.rn.bf16x2 / add.rn.f16x2: each half added in fp32 and rounded to nearest even, as the GPU does.
inline unsigned add_bf16x2(unsigned a, unsigned b) {
    auto half = [](unsigned r, int hi) { return bits_to_f32((hi ? r >> 16 : r & 0xFFFFu) << 16); };
    return pack_bf16x2(half(a, 0) + half(b, 0), half(a, 1) + half(b, 1));
}
inline unsigned add_f16x2(unsigned a, unsigned b) {
    auto half = [](unsigned r, int hi) { return f16_bits_to_f32(static_cast<unsigned short>(hi ? r >> 16 : r & 0xFFFFu)); };
    return pack_f16x2(half(a, 0) + half(b, 0), half(a, 1) + half(b, 1));
}

inline void cp_async_16(void* dst, const void* src, int src_bytes) {
    emu::Copy c{dst, src, src_bytes};
    if (emu::cp_async_eager) emu::do_copy(c); else emu::copy_open.push_back(c);
}
inline void cp_async_commit() { emu::copy_groups.push_back(std::move(emu::copy_open)); emu::copy_open.clear(); }
template <int N> inline void cp_async_wait() {
    while (emu::copy_groups.size() > size_t(N)) {
        for (const auto& c : emu::copy_groups.front()) emu::do_copy(c);
        emu::copy_groups.pop_front();
    }
}

// ldmatrix .x4: lane l receives, from matrix i, row l / 4 (the address of lane 8 i + l / 4),
// 16-bit columns 2 (l % 4) and 2 (l % 4) + 1.
inline void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    emu::Warp& w = emu::warps[emu::warp_id];
    w.ptr[emu::lane_id] = p;
    emu::warp_sync();
    for (int i = 0; i < 4; ++i)
        std::memcpy(&r[i], static_cast<const char*>(w.ptr[i * 8 + emu::lane_id / 4]) + 4 * (emu::lane_id % 4), 4);
    emu::warp_sync();
}

struct f16;
template <class T> inline float emu_half(unsigned reg, int which) {
    const unsigned short b = static_cast<unsigned short>(which ? reg >> 16 : reg & 0xFFFFu);
    if constexpr (std::is_same_v<T, f16>) return f16_bits_to_f32(b);
    return bits_to_f32(unsigned(b) << 16);
}

// mma.m16n8k16 row.col: A(r, k) is in lane 4 (r % 8) + (k % 8) / 2, register r / 8 + 2 (k / 8),
// half k % 2; B(k, n) in lane 4 n + (k % 8) / 2, register k / 8, half k % 2; lane l holds
// D(l / 4 + 8 i, 2 (l % 4) + j) in d[2 i + j].
template <class T> inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    emu::Warp& w = emu::warps[emu::warp_id];
    const int l = emu::lane_id;
    std::memcpy(w.a[l], a, sizeof(w.a[l]));
    w.b[l][0] = b0; w.b[l][1] = b1;
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) {
        const int r = l / 4 + 8 * (e / 2), n = 2 * (l % 4) + e % 2;
        float sum = d[e];
        for (int k = 0; k < 16; ++k) {
            const float av = emu_half<T>(w.a[4 * (r % 8) + (k % 8) / 2][r / 8 + 2 * (k / 8)], k % 2);
            const float bv = emu_half<T>(w.b[4 * n + (k % 8) / 2][k / 8], k % 2);
            sum += av * bv;
        }
        d[e] = sum;
    }
    emu::warp_sync();
}

namespace emu {
// Runs body() as every thread of every block, blocks one after another.
template <class F> void launch(emu_dim3 grid, emu_dim3 block, bool eager, F body) {
    const unsigned num_threads = block.x * block.y * block.z, num_warps = (num_threads + 31) / 32;
    grid_dim = grid; block_dim = block; cp_async_eager = eager;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar(num_threads);
                std::deque<std::barrier<>> warp_bars;
                std::vector<Warp> ws(num_warps);
                for (unsigned w = 0; w < num_warps; ++w) {
                    warp_bars.emplace_back(std::min(32u, num_threads - 32 * w));
                    ws[w].bar = &warp_bars[w];
                }
                block_barrier = &bar; warps = ws.data();
                std::memset(dyn_smem, 0xFF, sizeof(dyn_smem));  // undefined at block start: NaN patterns
                std::vector<std::thread> threads;
                for (unsigned t = 0; t < num_threads; ++t)
                    threads.emplace_back([&, t] {
                        thread_idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        block_idx = {bx, by, bz};
                        lane_id = int(t % 32); warp_id = int(t / 32);
                        body();
                        copy_groups.clear(); copy_open.clear();
                        warps[warp_id].bar->arrive_and_drop();
                        block_barrier->arrive_and_drop();
                    });
                for (auto& th : threads) th.join();
            }
}
}  // namespace emu
