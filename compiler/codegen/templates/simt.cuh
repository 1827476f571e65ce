// (a) SIMT fp32 GEMM: C[M, N] = epilogue(A[M, K] @ W[N, K]^T), both operands K-contiguous.
//
// Block tile BM x BN, k-tile BK; each thread owns TM x TN outputs as (TM/4) x (TN/4) blocks of
// 4x4 spaced BM/(TM/4) rows and BN/(TN/4) columns apart, so its fragments are 16-byte shared loads
// that neighbouring threads broadcast. Tiles are loaded as float4 along K into registers, stored
// transposed (k-major) into the other of two shared buffers while the current one is consumed:
// one barrier per k-tile. Rows/columns past M/N and k past K load as zeros; when K % 4 != 0 the
// loads fall back to scalars (rows are then not 16-byte aligned).

template <int BM, int BN, int BK, int TM, int TN>
struct SimtTile {
    static constexpr int kThreads = (BM / TM) * (BN / TN);
    static constexpr int kVecA = BM * BK / 4 / kThreads;  // float4 loads per thread per k-tile
    static constexpr int kVecB = BN * BK / 4 / kThreads;
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "4-wide fragments");
    static_assert(kVecA * kThreads * 4 == BM * BK && kVecB * kThreads * 4 == BN * BK, "even loads");

    // Loads rows [row0, row0 + ROWS) x [k0, k0 + BK) of a K-contiguous matrix into registers.
    template <int ROWS, int VEC>
    static __device__ __forceinline__ void load(f32x4 (&r)[VEC], const float* __restrict__ src, int row0,
                                                int num_rows, int k0, int K, bool is_vec_ok) {
        #pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const int v = threadIdx.x + i * kThreads;
            const int row = row0 + v / (BK / 4), k = k0 + (v % (BK / 4)) * 4;
            const float* p = src + size_t(row) * K + k;
            if (is_vec_ok) {
                r[i] = (row < num_rows && k < K) ? *reinterpret_cast<const f32x4*>(p) : f32x4{0.f, 0.f, 0.f, 0.f};
            } else {
                const bool ok = row < num_rows;
                r[i].x = ok && k + 0 < K ? p[0] : 0.f;
                r[i].y = ok && k + 1 < K ? p[1] : 0.f;
                r[i].z = ok && k + 2 < K ? p[2] : 0.f;
                r[i].w = ok && k + 3 < K ? p[3] : 0.f;
            }
        }
    }

    template <int ROWS, int VEC>
    static __device__ __forceinline__ void store(float (*dst)[ROWS], const f32x4 (&r)[VEC]) {
        #pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const int v = threadIdx.x + i * kThreads;
            const int row = v / (BK / 4), k = (v % (BK / 4)) * 4;
            dst[k + 0][row] = r[i].x;
            dst[k + 1][row] = r[i].y;
            dst[k + 2][row] = r[i].z;
            dst[k + 3][row] = r[i].w;
        }
    }
};

template <int BM, int BN, int BK, int TM, int TN, class Epi>
__device__ __forceinline__ void gemm_simt(const float* __restrict__ A, const float* __restrict__ W,
                                          typename Epi::Out* __restrict__ C, const float* __restrict__ bias,
                                          const typename Epi::Out* __restrict__ residual, int M, int N, int K) {
    using Tile = SimtTile<BM, BN, BK, TM, TN>;
    constexpr int CM = TM / 4, CN = TN / 4;      // 4x4 blocks per thread
    constexpr int SM = BM / CM, SN = BN / CN;    // their spacing
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];

    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const bool is_vec_ok = (K % 4) == 0;
    const int num_k_tiles = (K + BK - 1) / BK;

    float acc[TM][TN];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    f32x4 ra[Tile::kVecA], rb[Tile::kVecB];
    Tile::template load<BM>(ra, A, m0, M, 0, K, is_vec_ok);
    Tile::template load<BN>(rb, W, n0, N, 0, K, is_vec_ok);
    Tile::template store<BM>(As[0], ra);
    Tile::template store<BN>(Bs[0], rb);
    __syncthreads();

    for (int kt = 0; kt < num_k_tiles; ++kt) {
        const int cur = kt & 1;
        const bool has_next = kt + 1 < num_k_tiles;
        if (has_next) {  // global loads in flight during the arithmetic below
            Tile::template load<BM>(ra, A, m0, M, (kt + 1) * BK, K, is_vec_ok);
            Tile::template load<BN>(rb, W, n0, N, (kt + 1) * BK, K, is_vec_ok);
        }
        #pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
            #pragma unroll
            for (int c = 0; c < CM; ++c) {
                const f32x4 v = *reinterpret_cast<const f32x4*>(&As[cur][k][c * SM + ty * 4]);
                a[c * 4 + 0] = v.x; a[c * 4 + 1] = v.y; a[c * 4 + 2] = v.z; a[c * 4 + 3] = v.w;
            }
            #pragma unroll
            for (int c = 0; c < CN; ++c) {
                const f32x4 v = *reinterpret_cast<const f32x4*>(&Bs[cur][k][c * SN + tx * 4]);
                b[c * 4 + 0] = v.x; b[c * 4 + 1] = v.y; b[c * 4 + 2] = v.z; b[c * 4 + 3] = v.w;
            }
            #pragma unroll
            for (int i = 0; i < TM; ++i)
                #pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (has_next) {  // the other buffer was last read before the previous barrier
            Tile::template store<BM>(As[cur ^ 1], ra);
            Tile::template store<BN>(Bs[cur ^ 1], rb);
        }
        __syncthreads();
    }

    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * SM + ty * 4 + i % 4;
        #pragma unroll
        for (int j = 0; j < TN; j += 2) {
            const int n = n0 + (j / 4) * SN + tx * 4 + j % 4;
            Epi::store_pair(C, bias, nullptr, residual, m, n, acc[i][j], acc[i][j + 1], M, N);
        }
    }
}
