// (b) tensor-core GEMM, bf16/fp16 in, fp32 accumulate: C[M, N] = epilogue(A[M, K] @ W[N, K]^T).
//
// Block tile BM x BN x BK split over WM x WN warps; each warp owns (BM/WM) x (BN/WN) as
// m16n8k16 mma.sync tiles. A and W tiles stream through a STAGES-deep cp.async ring in dynamic
// shared memory, each row of BK elements stored in 16-byte chunks XOR-swizzled within 128-byte
// lines, so the cp.async stores and the ldmatrix reads of 8 rows hit distinct banks. Rows past
// M/N and chunks past K are zero-filled by cp.async (src size 0); K must be a multiple of 8 so
// every 16-byte chunk is aligned and either fully inside or fully outside K. Blocks are ordered
// in groups of 8 block rows so that consecutive blocks share A and W tiles in L2.

template <int BK>
__device__ __forceinline__ int swizzled(int row, int chunk) {
    constexpr int kChunks = BK / 8;                    // 16-byte chunks per row
    constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
    return row * BK + ((chunk ^ ((row / kRowsPerLine) % kChunks)) * 8);
}

template <class T, int ROWS, int BK, int THREADS>
__device__ __forceinline__ void load_tile_async(T* dst, const T* __restrict__ src, int row0, int num_rows,
                                                int k0, int K) {
    constexpr int kChunks = BK / 8;
    static_assert((ROWS * kChunks) % THREADS == 0, "even cp.async split");
    #pragma unroll
    for (int i = 0; i < ROWS * kChunks / THREADS; ++i) {
        const int c = threadIdx.x + i * THREADS;
        const int row = c / kChunks, chunk = c % kChunks;
        const int gr = row0 + row, gk = k0 + chunk * 8;
        const bool ok = gr < num_rows && gk < K;
        cp_async_16(dst + swizzled<BK>(row, chunk), ok ? src + size_t(gr) * K + gk : src, ok ? 16 : 0);
    }
}

template <class T, int BM, int BN, int BK, int WM, int WN, int STAGES, class Epi>
__device__ __forceinline__ void gemm_mma(const T* __restrict__ A, const T* __restrict__ W,
                                         typename Epi::Out* __restrict__ C, const float* __restrict__ bias,
                                         const typename Epi::Out* __restrict__ residual, int M, int N, int K) {
    constexpr int kThreads = WM * WN * 32;
    constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
    constexpr int MI = WTM / 16, NI = WTN / 8;   // mma tiles per warp
    constexpr int kStageElems = (BM + BN) * BK;
    constexpr int kGroupM = 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % 16 == 0, "mma tiling");
    DYNAMIC_SMEM(T, smem);

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = warp / WN, wn = warp % WN;

    // Grouped block order: kGroupM block rows sweep all block columns before the next group.
    const int num_bm = (M + BM - 1) / BM, num_bn = (N + BN - 1) / BN;
    const int group = blockIdx.x / (kGroupM * num_bn), first_bm = group * kGroupM;
    const int group_rows = min(num_bm - first_bm, kGroupM);
    const int in_group = blockIdx.x % (kGroupM * num_bn);
    const int m0 = (first_bm + in_group % group_rows) * BM, n0 = (in_group / group_rows) * BN;
    const int num_k_tiles = (K + BK - 1) / BK;

    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    auto load_stage = [&](int stage, int kt) {
        T* As = smem + stage * kStageElems;
        load_tile_async<T, BM, BK, kThreads>(As, A, m0, M, kt * BK, K);
        load_tile_async<T, BN, BK, kThreads>(As + BM * BK, W, n0, N, kt * BK, K);
    };

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < num_k_tiles) load_stage(s, s);
        cp_async_commit();  // empty groups keep the wait count uniform
    }

    for (int kt = 0; kt < num_k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread) ...
        __syncthreads();              // ... for all threads; stage (kt - 1) % STAGES is free again
        const int next = kt + STAGES - 1;
        if (next < num_k_tiles) load_stage(next % STAGES, next);
        cp_async_commit();

        const T* As = smem + (kt % STAGES) * kStageElems;
        const T* Bs = As + BM * BK;
        #pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            unsigned a[MI][4], b[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; ++i) {  // lanes 0-15: rows at k, lanes 16-31: rows at k + 8
                const int row = wm * WTM + i * 16 + lane % 16;
                ldmatrix_x4(a[i], As + swizzled<BK>(row, kk * 2 + lane / 16));
            }
            #pragma unroll
            for (int j = 0; j < NI; j += 2) {  // matrices: (n0-7, k), (n0-7, k+8), (n8-15, k), (n8-15, k+8)
                const int row = wn * WTN + j * 8 + (lane / 16) * 8 + lane % 8;
                unsigned r[4];
                ldmatrix_x4(r, Bs + swizzled<BK>(row, kk * 2 + (lane / 8) % 2));
                b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
            }
            #pragma unroll
            for (int i = 0; i < MI; ++i)
                #pragma unroll
                for (int j = 0; j < NI; ++j) mma_16816<T>(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    cp_async_wait<0>();

    // Accumulator layout: lane holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 tile.
    const int g = lane / 4, t = lane % 4;
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int m = m0 + wm * WTM + i * 16 + g, n = n0 + wn * WTN + j * 8 + 2 * t;
            Epi::store_pair(C, bias, nullptr, residual, m, n, acc[i][j][0], acc[i][j][1], M, N);
            Epi::store_pair(C, bias, nullptr, residual, m + 8, n, acc[i][j][2], acc[i][j][3], M, N);
        }
}
