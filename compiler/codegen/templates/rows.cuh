// Row kernels: one block per row of a contiguous (rows, K) float32 array, for the ops that are several
// passes over memory as array ops (a softmax is max, subtract, exp, sum, divide; a LayerNorm twice
// that). Each row is read once into registers (ROW_CACHE values per thread; longer rows re-read the
// tail from global memory, where it is still in L1/L2) and written once.
//
// Reductions go through shared memory with __syncthreads only (no warp shuffles), so the CPU emulator
// runs these kernels as they are. Rows are short (a few KB), so the reductions are not what costs.

#define ROW_CACHE 8

// y[r, t] = softmax over t of (scale * x[r, t]); y may be x (in place: every thread reads its own elements
// before it writes them, and all reads of other threads' elements end at the reductions). With causal_len S > 0, row r is query
// position s = r % S of T keys and t > s + T - S takes `filler` instead (MultiHeadAttention's
// unidirectional band, filled as onnxruntime fills it). A row whose values are all -inf becomes zeros,
// as the CPU kernel has it.
#define SOFTMAX_BLOCK 128

extern "C" __global__ void __launch_bounds__(SOFTMAX_BLOCK)
infc_softmax_rows(const float* x, float* y, long long rows, int T, float scale, int causal_len, float filler) {
    __shared__ float red[SOFTMAX_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = x + r * T;
        float* out = y + r * T;
        const long long last = causal_len > 0 ? r % causal_len + (T - causal_len) : (long long)T - 1;
        float v[ROW_CACHE];
        float peak = -INFINITY;
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            const int t = threadIdx.x + j * SOFTMAX_BLOCK;
            v[j] = -INFINITY;
            if (t < T) v[j] = t <= last ? row[t] * scale : filler;
            peak = fmaxf(peak, v[j]);
        }
        for (int t = threadIdx.x + ROW_CACHE * SOFTMAX_BLOCK; t < T; t += SOFTMAX_BLOCK)
            peak = fmaxf(peak, t <= last ? row[t] * scale : filler);
        peak = block_reduce<SOFTMAX_BLOCK>(peak, red, MaxOp());
        if (peak == -INFINITY) peak = 0.0f;
        float sum = 0.0f;
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            v[j] = expf(v[j] - peak);  // -inf (past the row's end) gives 0
            sum += v[j];
        }
        for (int t = threadIdx.x + ROW_CACHE * SOFTMAX_BLOCK; t < T; t += SOFTMAX_BLOCK)
            sum += expf((t <= last ? row[t] * scale : filler) - peak);
        sum = block_reduce<SOFTMAX_BLOCK>(sum, red, SumOp());
        if (sum == 0.0f) sum = 1.0f;
        for (int t = threadIdx.x + ROW_CACHE * SOFTMAX_BLOCK; t < T; t += SOFTMAX_BLOCK)
            out[t] = expf((t <= last ? row[t] * scale : filler) - peak) / sum;
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            const int t = threadIdx.x + j * SOFTMAX_BLOCK;
            if (t < T) out[t] = v[j] / sum;
        }
    }
}

// Normalization over rows of K: v = x (+ skip) (+ bias); y = (v - mean) * inv_std * gamma (+ beta), with
// inv_std = 1 / sqrt(mean((v - mean)^2) + eps) and mean = 0 for the RMS forms. Optionally writes v
// (SkipLayerNormalization's fourth output) and the per-row mean and inv_std. Absent operands are
// flagged off; their pointers are never read.
#define NORM_BLOCK 256
#define NORM_SKIP 1
#define NORM_BIAS 2
#define NORM_BETA 4
#define NORM_CENTER 8
#define NORM_TOTAL 16
#define NORM_STATS 32

extern "C" __global__ void __launch_bounds__(NORM_BLOCK)
infc_norm_rows(const float* __restrict__ x, const float* __restrict__ skip, const float* __restrict__ bias,
               const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ y,
               float* __restrict__ total, float* __restrict__ mean_out, float* __restrict__ inv_std_out,
               long long rows, int K, float eps, int flags) {
    __shared__ float red[NORM_BLOCK];
    const bool has_skip = flags & NORM_SKIP, has_bias = flags & NORM_BIAS;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long base = r * K;
        float v[ROW_CACHE];
        float sum = 0.0f;
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            const int k = threadIdx.x + j * NORM_BLOCK;
            v[j] = 0.0f;
            if (k < K) {
                v[j] = x[base + k];
                if (has_skip) v[j] += skip[base + k];
                if (has_bias) v[j] += bias[k];
            }
            sum += v[j];
        }
        for (int k = threadIdx.x + ROW_CACHE * NORM_BLOCK; k < K; k += NORM_BLOCK)
            sum += x[base + k] + (has_skip ? skip[base + k] : 0.0f) + (has_bias ? bias[k] : 0.0f);
        const float mean = (flags & NORM_CENTER) ? block_reduce<NORM_BLOCK>(sum, red, SumOp()) / K : 0.0f;
        float squares = 0.0f;
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            const int k = threadIdx.x + j * NORM_BLOCK;
            if (k < K) squares += (v[j] - mean) * (v[j] - mean);
        }
        for (int k = threadIdx.x + ROW_CACHE * NORM_BLOCK; k < K; k += NORM_BLOCK) {
            const float d = x[base + k] + (has_skip ? skip[base + k] : 0.0f) + (has_bias ? bias[k] : 0.0f) - mean;
            squares += d * d;
        }
        const float inv_std = 1.0f / sqrtf(block_reduce<NORM_BLOCK>(squares, red, SumOp()) / K + eps);
        #pragma unroll
        for (int j = 0; j < ROW_CACHE; ++j) {
            const int k = threadIdx.x + j * NORM_BLOCK;
            if (k < K) {
                if (flags & NORM_TOTAL) total[base + k] = v[j];
                y[base + k] = (v[j] - mean) * inv_std * gamma[k] + ((flags & NORM_BETA) ? beta[k] : 0.0f);
            }
        }
        for (int k = threadIdx.x + ROW_CACHE * NORM_BLOCK; k < K; k += NORM_BLOCK) {
            const float value = x[base + k] + (has_skip ? skip[base + k] : 0.0f) + (has_bias ? bias[k] : 0.0f);
            if (flags & NORM_TOTAL) total[base + k] = value;
            y[base + k] = (value - mean) * inv_std * gamma[k] + ((flags & NORM_BETA) ? beta[k] : 0.0f);
        }
        if ((flags & NORM_STATS) && threadIdx.x == 0) {
            mean_out[r] = mean;
            inv_std_out[r] = inv_std;
        }
    }
}
