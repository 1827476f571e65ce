// (c) decode-shaped GEMM and (e) its weight-only int8 form: C[M, N] = epilogue(x[M, K] @ W[N, K]^T)
// for M <= 8 * MT, bf16/fp16 activations, fp32 accumulation on mma.sync m16n8k16.
//
// Operands swapped: the mma computes C^T = W x^T, the weight as A (16 columns n per n16 tile) and
// the activations as B (8 rows m per tile), so a decode step of up to 8 rows wastes no mma rows
// on padding beyond 8, and each lane reads activations of one row only.
//
// Weights are read once, so they set the speed: the build pre-packs W into the order the lanes
// read it (prepack.pack_skinny), [N / (16 NW)][K / 32][NW][VPL][32 lanes][16 bytes] with VPL = 2
// loads per lane for 16-bit weights and 1 for int8. Lane (g, t) of n16 tile j covers rows
// 16 j + g and 16 j + g + 8 and k = 8 t .. 8 t + 7 of each 32-k step; k16 half s of the step
// takes 8 t + 4 s + (0, 1) into the mma slots 2t, 2t+1 and 8 t + 4 s + (2, 3) into 2t+8, 2t+9.
// (Which k a slot holds is free as long as A and B agree.) So a lane's A fragment is one 16-byte
// load (16-bit) or half of one (int8) with no register moves, and its B fragments for the whole
// 32-k step are one 16-byte load of its activation row, x[8 i + g][32 kb + 8 t .. + 7].
//
// int8 weights are stored + 128, each word's bytes ordered (row g k0, row g+8 k0, row g k1,
// row g+8 k1): bytes 0 and 2 are one A register's pair, already in the two 16-bit halves, bytes 1
// and 3 the next one, one shift away. A pair becomes two exact 16-bit values in three ALU ops:
// fp16 1024 + u minus 1152; bf16 128 + (u & 127) plus -256, or -128 when u >= 128. The
// per-channel scale is applied in the epilogue.
//
// Rounds: a warp loads KU steps of its NW tiles (weights and its activation runs), then computes
// them, with later rounds' loads issued before the current round's math: ST = 0 keeps one round in
// a second register buffer, ST >= 2 streams the weights through an ST-deep cp.async ring in shared
// memory (ST - 1 rounds in flight).
//
// Split-K, deterministic: block (group, split) covers 16 NW columns and a K range; its warps
// take interleaved rounds of that range and are summed through shared memory in warp order. With
// num_splits > 1 each block writes its partial to the workspace, and the last block of a column
// group to arrive (a counter per group, reset by that block) sums the partials in split order
// and runs the epilogue: the result does not depend on which block finishes last. The split
// count comes from N and K only, so a row's result does not depend on M (batch invariance).
// K must be a multiple of 8 (16-byte activation loads).

template <bool INT8> struct SkinnyWeights {
    static constexpr int kStep = 32;          // k per step
    static constexpr int kLoads = INT8 ? 1 : 2;  // 16-byte loads per lane, step and n16 tile (VPL)
};

__device__ __forceinline__ unsigned word_of(const u32x4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The dequantization's constants live in constant memory: ptxas cannot fold them (the host could
// rewrite them), so each (p & mask) | magic below stays one LOP3 with the mask as its immediate
// and the magic as a constant-bank operand, instead of two LOP3s.
__constant__ unsigned kInt8Magic[3] = {0x64006400u, 0x43004300u, 0xC380C380u};

// Two biased int8 codes in bits 0-7 and 16-23 of p -> their values (u - 128) as a 16-bit pair.
template <class T> __device__ __forceinline__ unsigned int8_pair(unsigned p);
template <> __device__ __forceinline__ unsigned int8_pair<f16>(unsigned p) {
    return add_f16x2((p & 0x00FF00FFu) | kInt8Magic[0], 0xE480E480u);       // (1024 + u) - 1152
}
template <> __device__ __forceinline__ unsigned int8_pair<bf16>(unsigned p) {
    return add_bf16x2((p & 0x007F007Fu) | kInt8Magic[1],                     // 128 + (u & 127)
                      (p & 0x00800080u) ^ kInt8Magic[2]);                    // -256, or -128 if u >= 128
}

// A fragment of k16 half s of a step: rows g, g + 8 x slots (2t, 2t+1), (2t+8, 2t+9).
template <class T, bool INT8>
__device__ __forceinline__ void weight_fragment(const u32x4 (&v)[SkinnyWeights<INT8>::kLoads], int s,
                                                unsigned (&a)[4]) {
    if constexpr (INT8) {
        const unsigned lo = word_of(v[0], 2 * s), hi = word_of(v[0], 2 * s + 1);
        a[0] = int8_pair<T>(lo); a[1] = int8_pair<T>(lo >> 8); a[2] = int8_pair<T>(hi); a[3] = int8_pair<T>(hi >> 8);
    } else {
        a[0] = v[s].x; a[1] = v[s].y; a[2] = v[s].z; a[3] = v[s].w;
    }
}

// One round: KU consecutive steps of the warp's NW tiles, weights and activation runs. Steps past
// kb_end load zeros (weights and activations, so their mma add nothing).
template <class T, bool INT8, int NW, int MT, int KU>
struct SkinnyRound {
    static constexpr int kStep = SkinnyWeights<INT8>::kStep, kLoads = SkinnyWeights<INT8>::kLoads;
    static constexpr int kChunks = KU * NW * kLoads;  // 16-byte weight loads per lane
    u32x4 w[KU][NW][kLoads];
    u32x4 x[KU][MT];  // row 8 i + g, k .. k + 7 of step kb0 + u (zeros past M or K)

    __device__ __forceinline__ void load_weights(const u32x4* __restrict__ wg, int kb0, int kb_end) {
        const u32x4* p = wg + size_t(kb0) * NW * kLoads * 32;  // constant offsets from here on
        #pragma unroll
        for (int c = 0; c < kChunks; ++c)
            chunk(c) = kb0 + c / (NW * kLoads) < kb_end ? ld_stream_16(p + c * 32) : u32x4{0u, 0u, 0u, 0u};
    }

    __device__ __forceinline__ void load_activations(const T* const (&xrow)[MT], int kb0, int kb_end, int t, int K) {
        const int k0 = kb0 * kStep + 8 * t;
        #pragma unroll
        for (int u = 0; u < KU; ++u)
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                x[u][i] = xrow[i] != nullptr && kb0 + u < kb_end && k0 + u * kStep < K
                              ? ld_nc_16(reinterpret_cast<const u32x4*>(xrow[i] + k0) + u * (kStep / 8))
                              : u32x4{0u, 0u, 0u, 0u};
    }

    // Weight load c of the round, in the packed order (step u, tile j, load v).
    __device__ __forceinline__ u32x4& chunk(int c) { return w[c / (NW * kLoads)][(c / kLoads) % NW][c % kLoads]; }

    // The mma of both k16 halves of every step, in step order.
    __device__ __forceinline__ void compute(float (&acc)[MT][NW][4]) const {
        #pragma unroll
        for (int u = 0; u < KU; ++u)
            #pragma unroll
            for (int s = 0; s < 2; ++s)
                #pragma unroll
                for (int j = 0; j < NW; ++j) {
                    unsigned a[4];
                    weight_fragment<T, INT8>(w[u][j], s, a);
                    #pragma unroll
                    for (int i = 0; i < MT; ++i)
                        mma_16816<T>(acc[i][j], a, word_of(x[u][i], 2 * s), word_of(x[u][i], 2 * s + 1));
                }
    }
};

// ST = 0: the next round's loads go to a second register buffer before the current round's math
// (two rounds per trip, so the buffers swap without copies).
template <class T, bool INT8, int NW, int MT, int KU>
__device__ __forceinline__ void skinny_rounds_in_registers(float (&acc)[MT][NW][4], const u32x4* __restrict__ wg,
                                                           const T* const (&xrow)[MT], int kb0, int kb_end,
                                                           int stride, int t, int K) {
    SkinnyRound<T, INT8, NW, MT, KU> ra, rb;
    if (kb0 < kb_end) { ra.load_weights(wg, kb0, kb_end); ra.load_activations(xrow, kb0, kb_end, t, K); }
    while (kb0 < kb_end) {
        const int kb1 = kb0 + stride;
        if (kb1 < kb_end) { rb.load_weights(wg, kb1, kb_end); rb.load_activations(xrow, kb1, kb_end, t, K); }
        ra.compute(acc);
        if (kb1 >= kb_end) break;
        const int kb2 = kb1 + stride;
        if (kb2 < kb_end) { ra.load_weights(wg, kb2, kb_end); ra.load_activations(xrow, kb2, kb_end, t, K); }
        rb.compute(acc);
        kb0 = kb2;
    }
}

// ST >= 2: the weights stream through an ST-deep cp.async ring in shared memory, ST - 1 rounds in
// flight per warp without holding them in registers (the int8 GEMV was short of bytes in flight:
// its register buffers carry as many activation bytes as weight bytes). Each lane copies and later
// reads only its own 16-byte slots, so a lane's own cp.async wait is the only synchronisation. The
// activations (L2 hits) stay one round ahead in registers.
template <class T, bool INT8, int NW, int MT, int KU, int ST>
__device__ __forceinline__ void skinny_rounds_in_shared(float (&acc)[MT][NW][4], const u32x4* __restrict__ wg,
                                                        const T* const (&xrow)[MT], u32x4* ring, int kb0, int kb_end,
                                                        int stride, int t, int K) {
    using Round = SkinnyRound<T, INT8, NW, MT, KU>;
    constexpr int kChunks = Round::kChunks, kPerStep = NW * Round::kLoads;
    auto issue = [&](int stage, int kb) {  // round kb's weights -> ring slot `stage`
        const u32x4* p = wg + size_t(kb) * kPerStep * 32;
        #pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const bool ok = kb + c / kPerStep < kb_end;
            cp_async_16(ring + (stage * kChunks + c) * 32, ok ? p + c * 32 : wg, ok ? 16 : 0);
        }
    };
    #pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        if (kb0 + s * stride < kb_end) issue(s, kb0 + s * stride);
        cp_async_commit();  // empty groups keep the wait count uniform
    }
    Round ra, rb;
    auto step = [&](Round& cur, Round& next, int kb, int r) {
        cp_async_wait<ST - 2>();  // round r's weights have landed (this lane's copies)
        if (kb + (ST - 1) * stride < kb_end) issue((r + ST - 1) % ST, kb + (ST - 1) * stride);  // slot of round r - 1
        cp_async_commit();
        if (kb + stride < kb_end) next.load_activations(xrow, kb + stride, kb_end, t, K);
        const u32x4* slot = ring + (r % ST) * kChunks * 32;
        #pragma unroll
        for (int c = 0; c < kChunks; ++c) cur.chunk(c) = slot[c * 32];
        cur.compute(acc);
    };
    if (kb0 < kb_end) ra.load_activations(xrow, kb0, kb_end, t, K);
    for (int r = 0; kb0 < kb_end; kb0 += 2 * stride, r += 2) {
        step(ra, rb, kb0, r);
        if (kb0 + stride >= kb_end) break;
        step(rb, ra, kb0 + stride, r + 1);
    }
    cp_async_wait<0>();  // no copy may still be writing when the block moves on
}

template <class T, bool INT8, int NW, int MT, int WARPS, int KU, int ST, class Epi>
__device__ __forceinline__ void gemm_skinny(const T* __restrict__ x, const u32x4* __restrict__ Wp,
                                            typename Epi::Out* __restrict__ C, const float* __restrict__ bias,
                                            const float* __restrict__ scale,
                                            const typename Epi::Out* __restrict__ residual,
                                            float* __restrict__ ws, unsigned* __restrict__ counters,
                                            int M, int N, int K, int num_splits) {
    constexpr int kStep = SkinnyWeights<INT8>::kStep, kLoads = SkinnyWeights<INT8>::kLoads;
    constexpr int ROWS = MT * 8, COLS = NW * 16, kThreads = WARPS * 32;
    static_assert(WARPS * ROWS * COLS * 4 <= 48 * 1024, "reduction buffer fits static shared memory");
    static_assert(ST == 0 || ST >= 2, "ST: 0 (register prefetch) or a ring of at least 2 stages");
    __shared__ __align__(16) float red[WARPS][ROWS][COLS];
    __shared__ int is_last_block;

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int group = blockIdx.x, split = blockIdx.y;
    const int num_kb = (K + kStep - 1) / kStep;
    const int per_split = (num_kb + num_splits - 1) / num_splits;
    const int kb_begin = split * per_split, kb_end = min(num_kb, kb_begin + per_split);

    float acc[MT][NW][4];
    const T* xrow[MT];
    #pragma unroll
    for (int i = 0; i < MT; ++i) {
        xrow[i] = 8 * i + g < M ? x + size_t(8 * i + g) * K : nullptr;
        #pragma unroll
        for (int j = 0; j < NW; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    }

    // Each warp takes rounds kb0, kb0 + WARPS * KU, ... of KU consecutive steps, in order.
    const u32x4* wg = Wp + size_t(group) * num_kb * NW * kLoads * 32 + lane;
    const int stride = WARPS * KU, kb0 = kb_begin + warp * KU;
    if constexpr (ST == 0) {
        skinny_rounds_in_registers<T, INT8, NW, MT, KU>(acc, wg, xrow, kb0, kb_end, stride, t, K);
    } else {
        DYNAMIC_SMEM(u32x4, ring);  // [WARPS][ST][KU * NW * kLoads][32 lanes]
        u32x4* mine = ring + size_t(warp) * ST * KU * NW * kLoads * 32 + lane;
        skinny_rounds_in_shared<T, INT8, NW, MT, KU, ST>(acc, wg, xrow, mine, kb0, kb_end, stride, t, K);
    }

    // D = C^T tile: lane holds (n = g, m = 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NW; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e)
                red[warp][8 * i + 2 * t + e % 2][16 * j + g + 8 * (e / 2)] = acc[i][j][e];
    __syncthreads();

    const int n0 = group * COLS, padded_n = gridDim.x * COLS;
    for (int p = threadIdx.x; p < M * (COLS / 2); p += kThreads) {
        const int row = p / (COLS / 2), col = (p % (COLS / 2)) * 2;
        float v0 = 0.f, v1 = 0.f;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) { v0 += red[w][row][col]; v1 += red[w][row][col + 1]; }
        if (num_splits == 1)
            Epi::store_pair(C, bias, scale, residual, row, n0 + col, v0, v1, M, N);
        else
            *reinterpret_cast<f32x2*>(ws + (size_t(split) * M + row) * padded_n + n0 + col) = f32x2{v0, v1};
    }
    if (num_splits == 1) return;

    __threadfence();  // partials visible device-wide before this block is counted
    __syncthreads();
    if (threadIdx.x == 0) is_last_block = atomicAdd(&counters[group], 1u) == unsigned(num_splits - 1);
    __syncthreads();
    if (!is_last_block) return;
    __threadfence();
    for (int p = threadIdx.x; p < M * (COLS / 2); p += kThreads) {
        const int row = p / (COLS / 2), col = (p % (COLS / 2)) * 2;
        float v0 = 0.f, v1 = 0.f;
        for (int s = 0; s < num_splits; ++s) {
            const f32x2 v = ld_cg_f32x2(reinterpret_cast<const f32x2*>(ws + (size_t(s) * M + row) * padded_n + n0 + col));
            v0 += v.x; v1 += v.y;
        }
        Epi::store_pair(C, bias, scale, residual, row, n0 + col, v0, v1, M, N);
    }
    if (threadIdx.x == 0) counters[group] = 0u;  // ready for the next launch
}
