// (c) decode-shaped GEMM and (e) its weight-only int8 form: C[M, N] = epilogue(x[M, K] @ W[N, K]^T)
// for M <= 16 * MT, bf16/fp16 activations, fp32 accumulation on mma.sync m16n8k16.
//
// Weights are read once, so they set the speed: the build pre-packs W into the order the lanes
// read it (prepack.pack_skinny), [N / (8 NW)][K / KSTEP][NW][32 lanes][16 bytes], where each
// lane's 16 bytes are its B fragments for KSTEP consecutive k (32 for 16-bit weights, 64 for
// int8). A warp reads NW * 512 contiguous bytes per step with no shared memory and no shuffles,
// KU steps in flight at once. int8 weights are stored +128 (biased) and dequantized in registers
// exactly (8388608 + u as fp32, minus 8388736), the per-channel scale applied in the epilogue.
//
// Split-K, deterministic: block (group, split) covers NW*8 columns and a K range; its warps
// take interleaved steps of that range and are summed through shared memory in warp order. With
// num_splits > 1 each block writes its partial to the workspace, and the last block of a column
// group to arrive (a counter per group, reset by that block) sums the partials in split order
// and runs the epilogue: the result does not depend on which block finishes last. The split
// count comes from N and K only, so a row's result does not depend on M (batch invariance).

template <bool INT8> struct SkinnyWeights {
    static constexpr int kStep = INT8 ? 64 : 32;  // k per 16-byte lane load
};

__device__ __forceinline__ unsigned word_of(const u32x4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float dequant_byte(unsigned q, int byte) {
    return bits_to_f32(0x4B000000u | ((q >> (8 * byte)) & 0xFFu)) - 8388736.0f;
}

// B fragment (b0: k 2t, 2t+1; b1: k 8+2t, 9+2t of n = g) of k16 step s from a lane's 16 bytes.
template <class T, bool INT8>
__device__ __forceinline__ void weight_fragment(const u32x4& v, int s, unsigned& b0, unsigned& b1) {
    if (INT8) {
        const unsigned q = word_of(v, s);
        b0 = Elem<T>::pack2(dequant_byte(q, 0), dequant_byte(q, 1));
        b1 = Elem<T>::pack2(dequant_byte(q, 2), dequant_byte(q, 3));
    } else {
        b0 = word_of(v, 2 * s);
        b1 = word_of(v, 2 * s + 1);
    }
}

template <class T>
__device__ __forceinline__ unsigned load_x_pair(const T* __restrict__ x, int row, int k, int M, int K) {
    return (row < M && k < K) ? *reinterpret_cast<const unsigned*>(x + size_t(row) * K + k) : 0u;
}

template <class T, bool INT8, int NW, int MT, int WARPS, int KU, class Epi>
__device__ __forceinline__ void gemm_skinny(const T* __restrict__ x, const u32x4* __restrict__ Wp,
                                            typename Epi::Out* __restrict__ C, const float* __restrict__ bias,
                                            const float* __restrict__ scale,
                                            const typename Epi::Out* __restrict__ residual,
                                            float* __restrict__ ws, unsigned* __restrict__ counters,
                                            int M, int N, int K, int num_splits) {
    constexpr int kStep = SkinnyWeights<INT8>::kStep, kSteps16 = kStep / 16;
    constexpr int ROWS = MT * 16, COLS = NW * 8, kThreads = WARPS * 32;
    static_assert(WARPS * ROWS * COLS * 4 <= 48 * 1024, "reduction buffer fits static shared memory");
    __shared__ __align__(16) float red[WARPS][ROWS][COLS];
    __shared__ int is_last_block;

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int group = blockIdx.x, split = blockIdx.y;
    const int num_kb = (K + kStep - 1) / kStep;
    const int per_split = (num_kb + num_splits - 1) / num_splits;
    const int kb_begin = split * per_split, kb_end = min(num_kb, kb_begin + per_split);

    float acc[MT][NW][4];
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NW; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const u32x4* wg = Wp + size_t(group) * num_kb * NW * 32 + lane;
    for (int kb0 = kb_begin + warp * KU; kb0 < kb_end; kb0 += WARPS * KU) {
        u32x4 w[KU][NW];
        #pragma unroll
        for (int u = 0; u < KU; ++u)
            #pragma unroll
            for (int j = 0; j < NW; ++j)
                w[u][j] = kb0 + u < kb_end ? ld_stream_16(wg + (size_t(kb0 + u) * NW + j) * 32) : u32x4{0u, 0u, 0u, 0u};
        #pragma unroll
        for (int u = 0; u < KU; ++u) {
            if (kb0 + u >= kb_end) break;  // warp-uniform
            #pragma unroll
            for (int s = 0; s < kSteps16; ++s) {
                const int k = (kb0 + u) * kStep + s * 16 + 2 * t;
                unsigned a[MT][4];
                #pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const int row = i * 16 + g;
                    a[i][0] = load_x_pair(x, row, k, M, K);
                    a[i][1] = load_x_pair(x, row + 8, k, M, K);
                    a[i][2] = load_x_pair(x, row, k + 8, M, K);
                    a[i][3] = load_x_pair(x, row + 8, k + 8, M, K);
                }
                #pragma unroll
                for (int j = 0; j < NW; ++j) {
                    unsigned b0, b1;
                    weight_fragment<T, INT8>(w[u][j], s, b0, b1);
                    #pragma unroll
                    for (int i = 0; i < MT; ++i) mma_16816<T>(acc[i][j], a[i], b0, b1);
                }
            }
        }
    }

    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NW; ++j)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                red[warp][i * 16 + g + 8 * h][j * 8 + 2 * t] = acc[i][j][2 * h];
                red[warp][i * 16 + g + 8 * h][j * 8 + 2 * t + 1] = acc[i][j][2 * h + 1];
            }
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
