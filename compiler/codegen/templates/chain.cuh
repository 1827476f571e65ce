// Elementwise chains (infc.cpu.ElementwiseChain, compiler/lower_fuse.py) as one kernel: every thread
// takes elements i, i + stride, ... of the output, reads each input once at its broadcast offset,
// runs the chain's ops in registers (the generated body) and writes the output once.
//
// `layout` (int64, device): the output's dims[rank], then per input strides[rank] in elements, 0 on
// broadcast axes. Offsets are computed from the flat index, last axis fastest; an input with the
// output's shape has offset i, so the common case reads and writes coalesced.

template <int NUM_IN>
__device__ __forceinline__ void chain_offsets(long long i, const long long* __restrict__ layout, int rank,
                                              long long (&offset)[NUM_IN]) {
    #pragma unroll
    for (int k = 0; k < NUM_IN; ++k) offset[k] = 0;
    long long rest = i;
    for (int d = rank - 1; d >= 0; --d) {
        const long long dim = layout[d];
        const long long coord = rest % dim;
        rest /= dim;
        #pragma unroll
        for (int k = 0; k < NUM_IN; ++k) offset[k] += coord * layout[rank * (1 + k) + d];
    }
}

__device__ __forceinline__ float chain_clip(float v, float lo, float hi) { return fminf(fmaxf(v, lo), hi); }
