"""Build-time weight layouts for the generated GEMMs (NumPy only).

Every family reads W as (N, K), K contiguous (ONNX MatMul's (K, N) weight is transposed once at
build time). On top of that:

- SwiGLU: the logical weight is (2H, K) with gate rows [0, H) and up rows [H, 2H) (one fused
  gate_up projection); interleave_gate_up reorders rows to g0, u0, g1, u1, ... so the epilogue
  finds gate and up of one output in adjacent columns. Bias follows the same order.
- skinny / skinny_int8: pack_skinny writes the order the kernel's lanes read, see
  templates/skinny.cuh: [N / (16 NW)][K / 32][NW][VPL][lane = 4 g + t][16 bytes], padded with
  zeros (int8: biased zeros). Lane (g, t) of n16 tile j holds the mma A fragments of rows
  16 j + g + 8 h and k = 32 kb + 8 t + 4 s + 2 q + e: register 2 q + h of k16 half s, element e.
  16-bit weights: load s, word 2 q + h. int8 (stored + 128): one load, word 2 s + q, byte 2 e + h.
"""

from __future__ import annotations

import numpy as np

from ..runtime.cuda.geometry import SKINNY_K_STEP  # k per packed step, both weight kinds



def float_to_bf16_bits(x, xp=np):
    """Round to nearest even, as the GPU's cvt.rn.bf16.f32 (finite inputs)."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32).astype(xp.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(xp.uint16)


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_bits(x, dtype: str, xp=np):
    """Array in the device's storage: float32, or uint16 bit patterns for bf16/fp16."""
    if dtype == "float32":
        return xp.ascontiguousarray(x, dtype=xp.float32)
    if dtype == "bfloat16":
        return float_to_bf16_bits(x, xp)
    if dtype == "float16":
        return xp.ascontiguousarray(x, dtype=xp.float16).view(xp.uint16)
    raise ValueError(f"unsupported dtype {dtype}")


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return np.asarray(bits, dtype=np.float32)
    if dtype == "bfloat16":
        return bf16_bits_to_float(bits)
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x as the device sees it after storing in `dtype`, as float32."""
    return from_bits(to_bits(x, dtype), dtype)


def interleave_gate_up(w_nk: np.ndarray, bias: np.ndarray | None = None):
    """(2H, K) gate-then-up rows -> g0, u0, g1, u1, ...; same for a (2H,) bias."""
    if w_nk.shape[0] % 2:
        raise ValueError("gate/up weight needs an even number of rows")
    h = w_nk.shape[0] // 2
    order = np.stack([np.arange(h), np.arange(h) + h], axis=1).reshape(-1)
    return w_nk[order], (None if bias is None else np.asarray(bias)[order])


def quantize_int8(w_nk, xp=np):
    """Symmetric per-output-channel int8: w ~ q * scale[:, None], q in [-127, 127]."""
    w = xp.asarray(w_nk, dtype=xp.float32)
    scale = xp.abs(w).max(axis=1) / 127.0
    scale = xp.where(scale > 0, scale, 1.0).astype(xp.float32)
    q = xp.clip(xp.rint(w / scale[:, None]), -127, 127).astype(xp.int8)
    return q, scale


def pack_skinny(w_nk, nw: int, dtype: str, xp=np):
    """Packed bytes (uint8, 16-byte multiple) of an (N, K) weight for skinny kernels with NW n16
    tiles per warp. dtype: 'bfloat16' / 'float16' (w is float) or 'int8' (w is int8)."""
    n, k = w_nk.shape
    n_pad, k_pad = -(-n // (16 * nw)) * 16 * nw, -(-k // SKINNY_K_STEP) * SKINNY_K_STEP
    if dtype == "int8":
        if w_nk.dtype != np.int8:
            raise ValueError("pack_skinny int8: quantize first (quantize_int8)")
        full = xp.full((n_pad, k_pad), 128, dtype=xp.uint8)  # biased zero
        full[:n, :k] = (w_nk.astype(xp.int16) + 128).astype(xp.uint8)
    else:
        full = xp.zeros((n_pad, k_pad), dtype=xp.uint16)
        full[:n, :k] = to_bits(w_nk, dtype, xp)
    # n = (group, j, h, g), k = (kb, t, s, q, e)
    blocks = full.reshape(n_pad // (16 * nw), nw, 2, 8, k_pad // SKINNY_K_STEP, 4, 2, 2, 2)
    order = (0, 4, 1, 3, 5, 6, 7, 8, 2) if dtype == "int8" else (0, 4, 1, 6, 3, 5, 7, 2, 8)
    return xp.ascontiguousarray(blocks.transpose(order)).reshape(-1).view(xp.uint8)
