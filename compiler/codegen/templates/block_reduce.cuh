// Shared by the row kernels (rows.cuh, paged_attention.cuh; codegen/row_kernels.py puts it first): a block-wide
// reduction through shared memory with __syncthreads only (no warp shuffles), so the CPU emulator runs the
// kernels as they are compiled.

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

struct SumOp { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };

// every thread of the block gets op over all threads' v; red holds BLOCK floats and is free again on return
template <int BLOCK, class Op>
__device__ __forceinline__ float block_reduce(float v, float* red, Op op) {
    red[threadIdx.x] = v;
    __syncthreads();
    #pragma unroll
    for (int half = BLOCK / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) red[threadIdx.x] = op(red[threadIdx.x], red[threadIdx.x + half]);
        __syncthreads();
    }
    const float result = red[0];
    __syncthreads();  // red is reused by the next reduction
    return result;
}

