// infc.PagedAttention on the device: attention of each query row over its sequence's K/V, read in place
// from the paged pools through the block table (no gathered copy of the context).
//
// One block per (query row t, query head n). The row's query sits in shared memory; keys are taken a tile
// of PAGED_BLOCK at a time, one key per thread (its dot product over the head in order), and an online
// softmax carries the running max and sum from tile to tile; each thread then owns output dimensions
// d = threadIdx.x (+ PAGED_BLOCK) and adds the tile's weighted values in key order. Every sum has a fixed
// order that depends on the row's own keys only, so a row's result does not depend on the batch around it.
// Reductions: block_reduce.cuh (shared memory and __syncthreads only: the CPU emulator runs it as compiled).
//
// Visible keys of row t: k <= pos[t] (its position), and k > pos[t] - window when window > 0. Scores are
// scale * q.k, then softcap * tanh(score / softcap) when softcap > 0, then + slopes[n] * (k - pos[t]) when
// has_slopes (ALiBi), as the CPU kernel (runtime/kernels/paged_attention.py).

#define PAGED_BLOCK 128
#define PAGED_MAX_HEAD 256  // head sizes up to this: two output dimensions per thread

// q and out: [T, num_heads * H]; pools: [num_blocks, kv_heads, block_size, H]; tables: [num_seqs, max_blocks];
// row_seq, row_pos: [T] (the row's sequence and position); slopes: [num_heads], read when has_slopes.
extern "C" __global__ void __launch_bounds__(PAGED_BLOCK)
infc_paged_attention(const float* __restrict__ q, const float* __restrict__ k_pool, const float* __restrict__ v_pool,
                     const int* __restrict__ tables, const int* __restrict__ row_seq, const int* __restrict__ row_pos,
                     const float* __restrict__ slopes, float* __restrict__ out, int num_heads, int kv_heads,
                     int head_size, int block_size, int max_blocks, int window, float scale, float softcap,
                     int has_slopes) {
    __shared__ float q_row[PAGED_MAX_HEAD];
    __shared__ float weights[PAGED_BLOCK];
    __shared__ float red[PAGED_BLOCK];
    const long long t = blockIdx.x / num_heads;
    const int n = blockIdx.x % num_heads;
    const int kv_head = n / (num_heads / kv_heads);
    const int* table = tables + (long long)row_seq[t] * max_blocks;
    const int pos = row_pos[t];
    const int first = window > 0 ? max(0, pos - window + 1) : 0;
    const long long row_offset = (t * num_heads + n) * head_size;
    for (int d = threadIdx.x; d < head_size; d += PAGED_BLOCK) q_row[d] = q[row_offset + d];
    __syncthreads();

    float running_max = -INFINITY, running_sum = 0.0f;
    float acc[PAGED_MAX_HEAD / PAGED_BLOCK] = {0.0f, 0.0f};
    for (int tile = first; tile <= pos; tile += PAGED_BLOCK) {
        const int k = tile + threadIdx.x;
        float score = -INFINITY;
        if (k <= pos) {
            const float* key = k_pool + (((long long)table[k / block_size] * kv_heads + kv_head) * block_size
                                         + k % block_size) * head_size;
            float dot = 0.0f;
            for (int d = 0; d < head_size; ++d) dot += q_row[d] * key[d];
            score = dot * scale;
            if (softcap > 0.0f) score = softcap * tanhf(score / softcap);
            if (has_slopes) score += slopes[n] * (float)(k - pos);
        }
        const float tile_max = block_reduce<PAGED_BLOCK>(score, red, MaxOp());
        const float new_max = fmaxf(running_max, tile_max);
        const float p = k <= pos ? expf(score - new_max) : 0.0f;
        weights[threadIdx.x] = p;
        const float tile_sum = block_reduce<PAGED_BLOCK>(p, red, SumOp());  // its barrier also publishes weights[]
        const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
        running_sum = running_sum * rescale + tile_sum;
        running_max = new_max;
        const int count = min(PAGED_BLOCK, pos - tile + 1);
        #pragma unroll
        for (int i = 0; i < PAGED_MAX_HEAD / PAGED_BLOCK; ++i) {
            const int d = threadIdx.x + i * PAGED_BLOCK;
            if (d >= head_size) continue;
            float sum = acc[i] * rescale;
            for (int j = 0; j < count; ++j) {
                const int key_pos = tile + j;
                const float* value = v_pool + (((long long)table[key_pos / block_size] * kv_heads + kv_head) * block_size
                                               + key_pos % block_size) * head_size;
                sum += weights[j] * value[d];
            }
            acc[i] = sum;
        }
        __syncthreads();  // weights[] is rewritten by the next tile
    }
    #pragma unroll
    for (int i = 0; i < PAGED_MAX_HEAD / PAGED_BLOCK; ++i) {
        const int d = threadIdx.x + i * PAGED_BLOCK;
        if (d < head_size) out[row_offset + d] = acc[i] / running_sum;
    }
}
