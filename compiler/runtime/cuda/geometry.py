"""Launch geometry of the generated GEMM kernels: grid, block, shared memory, split-K workspace.

Pure Python, no CuPy: the launcher, the CPU emulator tests and the build's tuner all use it. A
kernel is described by its params (compiler/codegen/variants.py Variant.params): family, dtypes,
epilogue flags and tile constants. Every family computes C = epilogue(A @ W^T) with N the GEMM's
column count (for SwiGLU, N = 2 H and C has H columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# Kernel argument order, shared with the generator that writes the signatures.
ARGS = {
    "simt": ("a", "w", "out", "bias", "residual", "M", "N", "K"),
    "mma": ("a", "w", "out", "bias", "residual", "M", "N", "K"),
    "skinny": ("a", "w", "out", "bias", "scale", "residual", "workspace", "counters", "M", "N", "K", "num_splits"),
}
ARGS["skinny_int8"] = ARGS["skinny"]
INT_ARGS = frozenset({"M", "N", "K", "num_splits"})
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int = 0          # dynamic shared memory
    num_splits: int = 1
    workspace_floats: int = 0    # split-K partial sums
    num_counters: int = 0        # split-K arrival counters (zeroed once at allocation)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


SKINNY_K_STEP = 32  # k per packed step of the skinny kernels (prepack.pack_skinny pads K to it)


def skinny_cols(params: Mapping[str, Any]) -> int:
    """Output columns of one skinny block: NW n16 tiles."""
    return 16 * params["NW"]


def skinny_rows(params: Mapping[str, Any]) -> int:
    """Most rows a skinny tile computes: MT groups of 8 (the mma's n8 side)."""
    return 8 * params["MT"]


def packed_shape(params: Mapping[str, Any], N: int, K: int) -> tuple[int, int]:
    """(rows, k) of the zero-padded weight the skinny kernels read (prepack.pack_skinny pads to it)."""
    return _ceil(N, skinny_cols(params)) * skinny_cols(params), _ceil(K, SKINNY_K_STEP) * SKINNY_K_STEP


def unsupported(params: Mapping[str, Any], M: int, N: int, K: int) -> str | None:
    """Why this kernel cannot run the shape, or None. Short and generic: reasons are counted."""
    family = params["family"]
    if min(M, N, K) < 1:
        return "empty GEMM"
    if params.get("swiglu") and N % 2:
        return "swiglu needs an even N"
    if family == "mma" and K % 8:
        return "K not a multiple of 8"
    if family.startswith("skinny"):
        if M > skinny_rows(params):
            return "M too large for skinny tile"
        if K % 8:
            return "K not a multiple of 8"
    return None


def choose_splits(params: Mapping[str, Any], N: int, K: int, num_sms: int = 132) -> int:
    """Split-K count of a skinny kernel from N and K only (never M: batch invariance). Aims at
    about 32 resident warps per multiprocessor, with every warp of a block given KU steps."""
    num_groups = _ceil(N, skinny_cols(params))
    num_kb = _ceil(K, SKINNY_K_STEP)
    target_blocks = num_sms * 32 // params["WARPS"]
    max_splits = max(1, num_kb // (params["WARPS"] * params["KU"]))
    splits = max(1, min(_ceil(target_blocks, num_groups), max_splits))
    return _ceil(num_kb, _ceil(num_kb, splits))  # no empty split


def block_threads(params: Mapping[str, Any]) -> int:
    family = params["family"]
    if family == "simt":
        return (params["BM"] // params["TM"]) * (params["BN"] // params["TN"])
    if family == "mma":
        return params["WM"] * params["WN"] * 32
    return params["WARPS"] * 32


def launch_for(params: Mapping[str, Any], M: int, N: int, K: int, num_sms: int = 132,
               num_splits: int | None = None) -> Launch:
    reason = unsupported(params, M, N, K)
    if reason:
        raise ValueError(f"gemm {params['family']} {M}x{N}x{K}: {reason}")
    family = params["family"]
    if family == "simt":
        return Launch((_ceil(N, params["BN"]), _ceil(M, params["BM"]), 1), (block_threads(params), 1, 1))
    if family == "mma":
        blocks = _ceil(M, params["BM"]) * _ceil(N, params["BN"])
        smem = params["STAGES"] * (params["BM"] + params["BN"]) * params["BK"] * ITEMSIZE[params["dtype"]]
        return Launch((blocks, 1, 1), (block_threads(params), 1, 1), smem)
    num_groups = _ceil(N, skinny_cols(params))
    num_kb = _ceil(K, SKINNY_K_STEP)
    splits = num_splits or choose_splits(params, N, K, num_sms)
    splits = _ceil(num_kb, _ceil(num_kb, max(1, min(splits, num_kb))))
    workspace = splits * M * num_groups * skinny_cols(params) if splits > 1 else 0
    return Launch((num_groups, splits, 1), (block_threads(params), 1, 1), skinny_ring_bytes(params), splits,
                  workspace, num_groups if splits > 1 else 0)


def skinny_ring_bytes(params: Mapping[str, Any]) -> int:
    """Dynamic shared memory of a skinny tile: ST stages of each warp's round of 16-byte weight loads
    per lane (two per step and n16 tile for 16-bit weights, one for int8); 0 for ST = 0."""
    loads = 1 if params["family"] == "skinny_int8" else 2
    return params["WARPS"] * params["ST"] * params["KU"] * params["NW"] * loads * 32 * 16


def output_shape(params: Mapping[str, Any], M: int, N: int) -> tuple[int, int]:
    return M, N // 2 if params.get("swiglu") else N


def kernel_args(params: Mapping[str, Any], launch: Launch, M: int, N: int, K: int,
                pointers: Mapping[str, Any], as_int=int) -> tuple:
    """Arguments in signature order: `pointers` maps array names to what the launcher passes
    (device arrays, or addresses in the emulator); missing ones get pointers['null']. `as_int`
    wraps the integers (np.int32 for CuPy: a Python int goes as 64 bits)."""
    ints = {"M": M, "N": N, "K": K, "num_splits": launch.num_splits}
    return tuple(as_int(ints[name]) if name in INT_ARGS else pointers.get(name, pointers["null"])
                 for name in ARGS[params["family"]])
