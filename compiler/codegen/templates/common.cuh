// Shared device helpers for the generated GEMM kernels.
//
// Self-contained on purpose: no CUDA headers, so the rendered source compiles the same way with
// nvcc, NVRTC (which finds no headers by itself) and the CPU emulator used by the tests
// (tests/codegen/emu/cuda_emu.h, selected by INFC_EMU). Every PTX instruction sits in one small
// function below; the emulator provides the same functions in plain C++.

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
struct __align__(16) u32x4 { unsigned x, y, z, w; };
struct __align__(16) f32x4 { float x, y, z, w; };
struct __align__(8) f32x2 { float x, y; };

#ifndef INFC_EMU
#define DYNAMIC_SMEM(T, name) \
    extern __shared__ __align__(16) unsigned char name##_raw[]; T* name = reinterpret_cast<T*>(name##_raw)

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float v) {
    unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v)); return r;
}
__device__ __forceinline__ unsigned short f32_to_f16_bits(float v) {
    unsigned short r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(v)); return r;
}
__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h)); return r;
}
// Packs two floats into one register, `lo` in the low half (the lower k or n index).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16-byte global -> shared copy; `src_bytes` < 16 zero-fills the rest (0 reads nothing).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
// Four 8x8 16-bit matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
template <class T> __device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                                             unsigned b0, unsigned b1);
template <> __device__ __forceinline__ void mma_16816<bf16>(float (&d)[4], const unsigned (&a)[4],
                                                            unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma_16816<f16>(float (&d)[4], const unsigned (&a)[4],
                                                           unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Streaming 16-byte load of data read once (weights): skips L1.
__device__ __forceinline__ u32x4 ld_stream_16(const u32x4* p) {
    u32x4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
// Load through L2 only: partial sums written by other blocks of the same launch.
__device__ __forceinline__ f32x2 ld_cg_f32x2(const f32x2* p) {
    f32x2 r; asm volatile("ld.global.cg.v2.f32 {%0,%1}, [%2];\n" : "=f"(r.x), "=f"(r.y) : "l"(p));
    return r;
}
// Read-only 16-byte load through L1 (activations, which several warps and blocks read). Volatile
// like ld_stream_16, so the compiler keeps it where the source issues it, ahead of its use.
__device__ __forceinline__ u32x4 ld_nc_16(const u32x4* p) {
    u32x4 r;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
// Packed 16-bit adds (one instruction for two values).
__device__ __forceinline__ unsigned add_bf16x2(unsigned a, unsigned b) {
    unsigned r; asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
}
__device__ __forceinline__ unsigned add_f16x2(unsigned a, unsigned b) {
    unsigned r; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
}
__device__ __forceinline__ float bits_to_f32(unsigned u) { return __uint_as_float(u); }
#endif  // INFC_EMU

// ---- element types: conversion to and from fp32 -------------------------------------------------
template <class T> struct Elem;
template <> struct Elem<float> {
    static __device__ __forceinline__ float to_f32(float v) { return v; }
    static __device__ __forceinline__ float from_f32(float v) { return v; }
};
template <> struct Elem<bf16> {
    static __device__ __forceinline__ float to_f32(bf16 v) { return bits_to_f32(unsigned(v.bits) << 16); }
    static __device__ __forceinline__ bf16 from_f32(float v) { return bf16{f32_to_bf16_bits(v)}; }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
};
template <> struct Elem<f16> {
    static __device__ __forceinline__ float to_f32(f16 v) { return f16_bits_to_f32(v.bits); }
    static __device__ __forceinline__ f16 from_f32(float v) { return f16{f32_to_f16_bits(v)}; }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_f16x2(lo, hi); }
};

// ---- fused epilogue -------------------------------------------------------------------------------
// Order: acc * scale[n] (int8 weights) + bias[n] -> activation, or SwiGLU gating -> + residual -> cast.
// SwiGLU: the GEMM's N columns hold (gate, up) interleaved by the build's prepack (column 2h is
// gate h, 2h+1 is up h), so the output has N/2 columns and every pair below is one output.
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2, ACT_SILU = 3 };

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + __expf(-v)); }

template <class OutT, bool BIAS, int ACT, bool RESIDUAL, bool SWIGLU, bool SCALE>
struct Epilogue {
    using Out = OutT;
    static constexpr bool has_swiglu = SWIGLU;

    static __device__ __forceinline__ float activate(float v) {
        if (ACT == ACT_RELU) return v > 0.0f ? v : 0.0f;
        if (ACT == ACT_GELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        if (ACT == ACT_SILU) return silu_f(v);
        return v;
    }

    // v0, v1: columns n, n+1 of row m (n even). Writes nothing outside M x N.
    static __device__ __forceinline__ void store_pair(Out* __restrict__ C, const float* __restrict__ bias,
                                                      const float* __restrict__ scale,
                                                      const Out* __restrict__ residual,
                                                      int m, int n, float v0, float v1, int M, int N) {
        if (m >= M || n >= N) return;
        const bool has1 = n + 1 < N;
        if (SCALE) { v0 *= scale[n]; if (has1) v1 *= scale[n + 1]; }
        if (BIAS) { v0 += bias[n]; if (has1) v1 += bias[n + 1]; }
        if (SWIGLU) {
            const int ldc = N / 2;
            const size_t at = size_t(m) * ldc + n / 2;
            float v = silu_f(v0) * v1;
            if (RESIDUAL) v += Elem<Out>::to_f32(residual[at]);
            C[at] = Elem<Out>::from_f32(v);
            return;
        }
        const size_t at = size_t(m) * N + n;
        v0 = activate(v0);
        v1 = activate(v1);
        if (RESIDUAL) {
            v0 += Elem<Out>::to_f32(residual[at]);
            if (has1) v1 += Elem<Out>::to_f32(residual[at + 1]);
        }
        C[at] = Elem<Out>::from_f32(v0);
        if (has1) C[at + 1] = Elem<Out>::from_f32(v1);
    }
};
