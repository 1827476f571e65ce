// (b) tensor-core GEMM, bf16/fp16 in, fp32 accumulate: C[M, N] = epilogue(A[M, K] @ W[N, K]^T).
//
// Block tile BM x BN x BK split over WM x WN warps; each warp owns (BM/WM) x (BN/WN) as
// m16n8k16 mma.sync tiles. A and W tiles stream through a STAGES-deep cp.async ring in dynamic
// shared memory, each row of BK elements stored in 16-byte chunks XOR-swizzled within 128-byte
// lines, so the cp.async stores and the ldmatrix reads of 8 rows hit distinct banks. Rows past
// M/N and chunks past K are zero-filled by cp.async (src size 0); K must be a multiple of 8 so
// every 16-byte chunk is aligned and either fully inside or fully outside K. Blocks are ordered
// in groups of 8 block rows so that consecutive blocks share A and W tiles in L2.
//
// Main loop, in the order of CUTLASS's sm80 multistage kernels: the fragments of k-step kk + 1
// are loaded into a second register set while the mma of step kk are issued, so the tensor cores
// do not wait on ldmatrix latency; across k-tiles too, as the one barrier per k-tile comes before
// the last step's mma. The copies of the tile STAGES - 1 ahead are spread over the other steps,
// after their mma, into the stage every warp finished reading before the previous barrier.
//
// Epilogue through shared memory (the stages are free after the k-loop): each lane applies bias and
// activation (or SwiGLU) to its accumulators and stages them, rounded to the output type (fp32 when
// a residual is still to be added); then each thread writes 16 contiguous bytes of a row of C, so a
// warp writes whole 128-byte lines. Stored straight from the mma layout, a warp's store instruction
// wrote 4 to 8 bytes into each of 8 rows (8x the store instructions and half-used 32-byte sectors).

// XOR key of a row's chunks: rows sharing a 128-byte line get distinct keys, so the 8 rows an
// ldmatrix (or a 16-byte store per row) touches cover all 32 banks. It repeats every 8 rows.
template <int BK>
__device__ __forceinline__ int swizzle_key(int row) {
    constexpr int kChunks = BK / 8;                    // 16-byte chunks per row
    constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
    return (row / kRowsPerLine) % kChunks;
}

// One thread's share of the cp.async copies of a ROWS x BK tile of a row-major [num_rows, K]
// matrix: chunk c of rows r + i * kRowStep (r = thread / kChunks, c = thread % kChunks). The row
// bound, the pointer and the swizzled destination are set up once; a k-tile only moves k by BK.
template <class T, int ROWS, int BK, int THREADS>
struct TileLoader {
    static constexpr int kChunks = BK / 8, kRowStep = THREADS / kChunks, kCopies = ROWS / kRowStep;
    static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "even cp.async split");
    static_assert(kRowStep % 8 == 0, "copy i shares row r's swizzle key");
    const T* src;   // row r, chunk c of the next tile to copy
    int dst;        // row r, chunk c in a stage (elements); copy i is kRowStep rows further
    int k;          // the first k of chunk c in the next tile
    int rows_left;  // rows from row r to the end of the matrix

    __device__ __forceinline__ TileLoader(const T* base, int row0, int num_rows, int K) {
        const int row = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
        k = chunk * 8;
        rows_left = num_rows - row0 - row;
        src = base + size_t(row0 + row) * K + k;
        dst = row * BK + (chunk ^ swizzle_key<BK>(row)) * 8;
    }
    // Copy i of the next tile; outside the matrix it reads nothing (the base pointer stands in).
    __device__ __forceinline__ void copy(T* stage, int i, const T* base, int K) const {
        const bool ok = i * kRowStep < rows_left && k < K;
        cp_async_16(stage + dst + i * kRowStep * BK, ok ? src + size_t(i * kRowStep) * K : base, ok ? 16 : 0);
    }
    __device__ __forceinline__ void advance() { src += BK; k += BK; }
};

// Type selection without <type_traits> (the rendered source includes no headers).
template <bool C, class A, class B> struct Pick { using type = A; };
template <class A, class B> struct Pick<false, A, B> { using type = B; };

// The epilogue's compile-time flags (common.cuh's Epilogue keeps them as template arguments).
template <class E> struct EpiFlags;
template <class O, bool B, int A, bool R, bool S, bool SC> struct EpiFlags<Epilogue<O, B, A, R, S, SC>> {
    static constexpr bool bias = B, residual = R, scale = SC;
};

// A value staged in shared memory: fp32, or already rounded to the 16-bit output type.
template <class S> struct Staged {
    static __device__ __forceinline__ void put(S* p, float v) { *p = Elem<S>::from_f32(v); }
    static __device__ __forceinline__ void put2(S* p, float v0, float v1) {
        *reinterpret_cast<unsigned*>(p) = Elem<S>::pack2(v0, v1);
    }
};
template <> struct Staged<float> {
    static __device__ __forceinline__ void put(float* p, float v) { *p = v; }
    static __device__ __forceinline__ void put2(float* p, float v0, float v1) {
        *reinterpret_cast<f32x2*>(p) = f32x2{v0, v1};
    }
};

// 16 bytes of C: kVec fp32 values plus a residual read as 16 bytes, converted and stored as 16 bytes.
template <class Out> struct Vec16 {  // bf16, f16: eight values, in pairs per 32-bit word (low half first)
    static constexpr int kVec = 8;
    static __device__ __forceinline__ void add(float (&v)[8], const Out* p) {
        const u32x4 r = *reinterpret_cast<const u32x4*>(p);
        const unsigned words[4] = {r.x, r.y, r.z, r.w};
        #pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] += Elem<Out>::to_f32(Out{static_cast<unsigned short>(words[e / 2] >> (e % 2 * 16))});
    }
    static __device__ __forceinline__ void store(Out* p, const float (&v)[8]) {
        *reinterpret_cast<u32x4*>(p) = u32x4{Elem<Out>::pack2(v[0], v[1]), Elem<Out>::pack2(v[2], v[3]),
                                             Elem<Out>::pack2(v[4], v[5]), Elem<Out>::pack2(v[6], v[7])};
    }
};
template <> struct Vec16<float> {
    static constexpr int kVec = 4;
    static __device__ __forceinline__ void add(float (&v)[4], const float* p) {
        const f32x4 r = *reinterpret_cast<const f32x4*>(p);
        v[0] += r.x; v[1] += r.y; v[2] += r.z; v[3] += r.w;
    }
    static __device__ __forceinline__ void store(float* p, const float (&v)[4]) {
        *reinterpret_cast<f32x4*>(p) = f32x4{v[0], v[1], v[2], v[3]};
    }
};

// C and the residual may be views at any element offset (the executor's arena).
__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<unsigned long long>(p) % 16 == 0; }

template <class T, int BM, int BN, int BK, int WM, int WN, int STAGES, class Epi>
__device__ __forceinline__ void gemm_mma(const T* __restrict__ A, const T* __restrict__ W,
                                         typename Epi::Out* __restrict__ C, const float* __restrict__ bias,
                                         const typename Epi::Out* __restrict__ residual, int M, int N, int K) {
    constexpr int kThreads = WM * WN * 32;
    constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
    constexpr int MI = WTM / 16, NI = WTN / 8;   // mma tiles per warp
    constexpr int KK = BK / 16;                  // k-steps per k-tile
    constexpr int kStageElems = (BM + BN) * BK;
    constexpr int kGroupM = 8;
    // An even KK keeps each step's fragment set the same across k-tiles (registers, not local memory);
    // KK >= 2 leaves a step to spread the copies over and keeps the wait count below; BK <= 64 keeps
    // the swizzle key periodic in 8 rows.
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % 32 == 0 && BK <= 64, "mma tiling");
    static_assert(STAGES >= 2, "cp.async ring");
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

    TileLoader<T, BM, BK, kThreads> load_a(A, m0, M, K);
    TileLoader<T, BN, BK, kThreads> load_w(W, n0, N, K);
    // Part `part` of `parts` of the next tile's copies (parts > 1 spreads them over the k-steps).
    auto copy_part = [&](T* stage, int part, int parts) {
        #pragma unroll
        for (int i = 0; i < load_a.kCopies; ++i)
            if (i * parts / load_a.kCopies == part) load_a.copy(stage, i, A, K);
        #pragma unroll
        for (int i = 0; i < load_w.kCopies; ++i)
            if (i * parts / load_w.kCopies == part) load_w.copy(stage + BM * BK, i, W, K);
    };

    // ldmatrix rows of this lane: A rows wm WTM + lane % 16 (+16 per mma row), at k + 8 for lanes
    // 16-31; W matrices (n0-7, k), (n0-7, k+8), (n8-15, k), (n8-15, k+8) (+16 rows per pair of
    // n8 tiles). 16-row steps keep the swizzle key.
    const int a_row = wm * WTM + lane % 16, b_row = wn * WTN + (lane / 16) * 8 + lane % 8;
    const int a_key = swizzle_key<BK>(a_row) ^ (lane / 16), b_key = swizzle_key<BK>(b_row) ^ ((lane / 8) % 2);
    unsigned a[2][MI][4], b[2][NI / 2][4];  // two fragment sets: step kk + 1 loads while kk computes
    auto load_fragments = [&](int set, const T* stage, int kk) {
        const T* As = stage + a_row * BK + ((2 * kk) ^ a_key) * 8;
        const T* Bs = stage + (BM + b_row) * BK + ((2 * kk) ^ b_key) * 8;
        #pragma unroll
        for (int i = 0; i < MI; ++i) ldmatrix_x4(a[set][i], As + i * 16 * BK);
        #pragma unroll
        for (int j = 0; j < NI / 2; ++j) ldmatrix_x4(b[set][j], Bs + j * 16 * BK);
    };
    // Serpentine order: consecutive mma share an A or a B fragment (operand reuse).
    auto mma_all = [&](int set) {
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int jj = 0; jj < NI; ++jj) {
                const int j = i % 2 ? NI - 1 - jj : jj;
                mma_16816<T>(acc[i][j], a[set][i], b[set][j / 2][(j % 2) * 2], b[set][j / 2][(j % 2) * 2 + 1]);
            }
    };

    // Tiles past K are copied too, zero-filled and never used: no branch, a uniform wait count.
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        copy_part(smem + s * kStageElems, 0, 1);
        load_a.advance(); load_w.advance();
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();  // tile 0 has landed (for this thread) ...
    __syncthreads();              // ... for all threads
    int read = 0, write = STAGES - 1;  // stages of tiles kt and kt + STAGES - 1
    load_fragments(0, smem, 0);

    for (int kt = 0; kt < num_k_tiles; ++kt) {
        #pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            if (kk == KK - 1) {
                // Tile kt + 1 has landed, and every warp has loaded its last fragments of tile kt - 1,
                // whose stage is the next `write`. Its first fragments load below, before this step's mma.
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                read = read == STAGES - 1 ? 0 : read + 1;
            }
            load_fragments((kk + 1) % 2, smem + read * kStageElems, (kk + 1) % KK);
            mma_all(kk % 2);
            if (kk < KK - 1) {  // tile kt + STAGES - 1 into the stage of tile kt - 1
                copy_part(smem + write * kStageElems, kk, KK - 1);
                if (kk == KK - 2) {
                    load_a.advance(); load_w.advance();
                    cp_async_commit();
                    write = write == STAGES - 1 ? 0 : write + 1;
                }
            }
        }
    }
    cp_async_wait<0>();  // no copy may land in shared memory after this ...
    __syncthreads();     // ... and every warp is done with the stages: the staged tile may overwrite them

    using Out = typename Epi::Out;
    constexpr bool kSwiglu = Epi::has_swiglu, kResidual = EpiFlags<Epi>::residual;
    static_assert(!EpiFlags<Epi>::scale, "per-channel scales are for int8 weights (skinny)");
    using S = typename Pick<kResidual, float, Out>::type;  // the residual is added in fp32, then rounded
    constexpr int kCols = kSwiglu ? BN / 2 : BN;            // staged (output) columns
    constexpr int kE = 16 / sizeof(S), kChunks = kCols / kE;  // values per 16-byte chunk, chunks per row
    static_assert(BM * kCols * sizeof(S) <= STAGES * kStageElems * sizeof(T), "staged tile fits the stages");
    S* staged = reinterpret_cast<S*>(smem);
    // Chunks of a staged row are XOR-swizzled: the key takes 8 values over 8 consecutive rows, 4 over 4
    // in its upper bits, so a warp's fragment stores (8 rows x 16 bytes, or 4 rows x 32 bytes per
    // half-warp) and its 16-byte loads (8 consecutive chunks of a row per quarter-warp) hit distinct banks.
    // The key moves bits 0-1 of the row to bits 1-2 and bit 2 to bit 0: XOR-linear in the row's bits, so
    // a row that is a multiple of 8 plus r has the key of r, and disjoint bits add keys by XOR.
    auto key_of = [](int row) { return ((row & 3) * 2 + (row >> 2 & 1)) & (kChunks - 1); };
    auto stage_at = [](int row, int key, int col) { return row * kCols + ((col / kE) ^ key) * kE + col % kE; };

    // Accumulator layout: lane holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 tile.
    const int g = lane / 4, t = lane % 4, key = key_of(g);  // the key of rows g + 8 r
    #pragma unroll
    for (int j = 0; j < NI; ++j) {
        const int col = wn * WTN + j * 8 + 2 * t, n = n0 + col;  // GEMM columns n, n + 1 (gate, up for SwiGLU)
        float b0 = 0.f, b1 = 0.f;
        if (EpiFlags<Epi>::bias) {
            if (n < N) b0 = bias[n];
            if (n + 1 < N) b1 = bias[n + 1];
        }
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm * WTM + i * 16 + g + 8 * h;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (EpiFlags<Epi>::bias) { v0 += b0; v1 += b1; }  // (x + 0 is not x for x = -0: no dead adds)
                if constexpr (kSwiglu) Staged<S>::put(staged + stage_at(row, key, col / 2), silu_f(v0) * v1);
                else Staged<S>::put2(staged + stage_at(row, key, col), Epi::activate(v0), Epi::activate(v1));
            }
    }
    __syncthreads();

    // Each thread takes kVec output columns of a row (16 bytes of C); consecutive threads, consecutive
    // columns. When C's rows are not made of aligned 16-byte pieces (ldc % kVec, or an unaligned view),
    // values are written one by one; else a piece that starts inside a row ends inside it.
    constexpr int kVec = Vec16<Out>::kVec, kVecsPerRow = kCols / kVec, kRowsPerPass = kThreads / kVecsPerRow;
    static_assert(kThreads % kVecsPerRow == 0 && BM % kRowsPerPass == 0, "whole rows per pass");
    const int ldc = kSwiglu ? N / 2 : N, col = threadIdx.x % kVecsPerRow * kVec, n = (kSwiglu ? n0 / 2 : n0) + col;
    const bool whole = ldc % kVec == 0 && aligned16(C) && (!kResidual || aligned16(residual));
    const int row0 = threadIdx.x / kVecsPerRow;  // + pass * kRowsPerPass: disjoint bits (powers of 2)
    if (whole) {
        #pragma unroll
        for (int pass = 0; pass < BM / kRowsPerPass; ++pass) {
            const int row = row0 + pass * kRowsPerPass, m = m0 + row, key = key_of(row0) ^ key_of(pass * kRowsPerPass);
            // The offset is formed for every pass (0 outside C), so the compiler predicates each pass's
            // loads and store instead of branching around them, and several passes' loads are in flight.
            const bool in = m < M && n < ldc;
            const size_t at = in ? size_t(m) * ldc + n : 0;
            if constexpr (!kResidual) {  // staged in the output type: a copy
                const u32x4 bits = *reinterpret_cast<const u32x4*>(staged + stage_at(row, key, col));
                if (in) *reinterpret_cast<u32x4*>(C + at) = bits;
            } else {
                float v[kVec];
                #pragma unroll
                for (int q = 0; q < kVec; q += 4) {
                    const f32x4 x = *reinterpret_cast<const f32x4*>(staged + stage_at(row, key, col + q));
                    v[q] = x.x; v[q + 1] = x.y; v[q + 2] = x.z; v[q + 3] = x.w;
                }
                if (in) {
                    Vec16<Out>::add(v, residual + at);
                    Vec16<Out>::store(C + at, v);
                }
            }
        }
    } else {
        #pragma unroll 1
        for (int pass = 0; pass < BM / kRowsPerPass; ++pass) {
            const int row = row0 + pass * kRowsPerPass, m = m0 + row, key = key_of(row);
            if (m >= M) break;
            const size_t at = size_t(m) * ldc + n;
            for (int e = 0; e < kVec && n + e < ldc; ++e) {
                if constexpr (!kResidual) C[at + e] = staged[stage_at(row, key, col + e)];
                else C[at + e] = Elem<Out>::from_f32(staged[stage_at(row, key, col + e)] + Elem<Out>::to_f32(residual[at + e]));
            }
        }
    }
}
