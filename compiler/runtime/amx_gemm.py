"""bf16 GEMM on AMX-BF16 tiles (`tdpbf16ps`): the same sums as bf16_gemm.py, 16 x 16 outputs an instruction.

Why: on a Sapphire Rapids core `vdpbf16ps` retires one 512-bit instruction a cycle, 32 products,
what two float32 FMAs do: bf16_gemm.py's kernel reaches 0.75x OpenBLAS's sgemm there (110 against
145 GFLOP/s a core). The AMX unit multiplies a 16 x 32 bf16 tile by a 32 x 16 one into a 16 x 16
float32 tile per `tdpbf16ps` (8,192 products, issued every 16 cycles): 16x the float32 FMA rate.

Layout: the weight is bf16_gemm.pack_pairs's (panels of 64 columns, [pairs, 64] words of k pairs,
the pairs padded to a multiple of TILE_PAIRS), which is exactly the "VNNI" layout a B tile
wants: tile row kp holds 16 columns' pairs (2kp, 2kp + 1). The activation's pairs, [M, pairs]
words, are A tiles as they lie (row m holds its 32 k values). A block is 32 rows x 32 columns: four
float32 C tiles (tmm0-3) over all of K, two A tiles (tmm4-5) and two B tiles (tmm6-7) per 32 k;
rows and columns past the edge land in a scratch block and are not copied out. Each output is one
chain of pair sums in k order per tile step (the unit's own order inside a step), whatever M.

The tile registers need the kernel's permission (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`, asked once per process) and a tile configuration per thread (`ldtilecfg` at
the start of each call; `tilerelease` at its end so the kernel leaves no 8 KB of tile state for
the OS to save). `amx_product` returns None where either is missing (no AMX-BF16, another OS, a
kernel without the permission), before anything is compiled; callers keep the AVX512-BF16 or the
float32 path.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import numpy as np

from . import aligned, cpu_features
from .bf16_gemm import PANEL, TILE_PAIRS, activation_pairs, has_avx512_bf16
from .jit import IN_ORDER, jit

TILE_ROWS = 16  # rows of every tile (A, B and C)
BLOCK = 2 * TILE_ROWS  # a block's rows and columns (2 x 2 C tiles)
# k pairs a pass over the row blocks: cutting K into blocks of 64-256 pairs (C tiles reloaded per
# block) measured 10-40% slower than none, up to K = 3072
K_BLOCK = 4096
# products from this many multiply-adds split their panels with the helper thread (was 2M): on a
# 2-core Sapphire Rapids smaller products ran slower split (128 x 768 x 768: 0.87x one core) and
# larger ones gained (128 x 768 x 3072: 1.34x, 512 x 768 x 3072: 1.73x) in one hour; in another
# (bench/results/amx_split-2026-12-03.json) no size gained or lost more than 4%
SPLIT_MIN_MACS = 1 << 27
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


@functools.cache
def _tile_permission() -> bool:
    """The kernel let this process use AMX tile data (asked once; a process-wide grant)."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except Exception:  # noqa: BLE001 - no libc syscall: no tiles
        return False


def has_amx_bf16() -> bool:
    """AMX-BF16 is there and usable by this process (checked, and the permission asked, on first call)."""
    return has_avx512_bf16() and cpu_features.has("amx-bf16", "amx-tile") and _tile_permission()


def tile_config() -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, every tile used 16 rows x 64 bytes."""
    config = np.zeros(64, np.uint8)
    config[0] = 1
    config[16:32].view(np.uint16)[:8] = 64
    config[48:56] = TILE_ROWS
    return config


def declared(module, name: str, args: list):
    """The void LLVM intrinsic `name` taking `args`, declared once per module."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on

    found = module.globals.get(name)
    return found if found is not None else ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)


def at(builder, data, byte_offset):
    """The address `byte_offset` bytes past `data` (any pointer), as an i8*."""
    from llvmlite import ir  # noqa: PLC0415

    byte_ptr = ir.IntType(8).as_pointer()
    return builder.gep(builder.bitcast(data, byte_ptr), [byte_offset])


def tile_ops(module) -> dict:
    """The tile instructions a kernel's blocks use, declared in `module`: load, store, zero, dot."""
    from llvmlite import ir  # noqa: PLC0415

    i8, i64 = ir.IntType(8), ir.IntType(64)
    byte_ptr = i8.as_pointer()
    return {"load": declared(module, "llvm.x86.tileloadd64", [i8, byte_ptr, i64]),
            "store": declared(module, "llvm.x86.tilestored64", [i8, byte_ptr, i64]),
            "zero": declared(module, "llvm.x86.tilezero", [i8]),
            "dot": declared(module, "llvm.x86.tdpbf16ps", [i8, i8, i8])}


def intrinsics() -> dict:
    """amx_configure(config), amx_release() and amx_block(...) (below) as numba intrinsics."""
    from llvmlite import ir  # noqa: PLC0415 - numba's own dependency: only when compiled kernels are on
    from numba import types  # noqa: PLC0415
    from numba.extending import intrinsic  # noqa: PLC0415
    from numba.core import cgutils  # noqa: PLC0415

    i8 = ir.IntType(8)
    byte_ptr = i8.as_pointer()

    def configure_codegen(context, builder, signature, args):
        config = context.make_array(signature.args[0])(context, builder, args[0])
        builder.call(declared(builder.module, "llvm.x86.ldtilecfg", [byte_ptr]), [builder.bitcast(config.data, byte_ptr)])
        return context.get_dummy_value()

    def release_codegen(context, builder, signature, args):
        builder.call(declared(builder.module, "llvm.x86.tilerelease", []), [])
        return context.get_dummy_value()

    def block_codegen(context, builder, signature, args):
        """C[o0:o0+32, c0:c0+32] (+)= A[i0:i0+32, kp0:kp1] @ B[kp0:kp1, j0:j0+32] (pairs), plus what C
        holds when `accumulate` is nonzero."""
        a_val, i0, w_val, j0, kp0, kp1, accumulate, out_val, o0, c0 = args
        a, w, out = (context.make_array(signature.args[i])(context, builder, v)
                     for i, v in ((0, a_val), (2, w_val), (7, out_val)))
        ops = tile_ops(builder.module)
        load, store, zero, dot = ops["load"], ops["store"], ops["zero"], ops["dot"]
        intp = i0.type
        tile = [ir.Constant(i8, t) for t in range(8)]
        four = ir.Constant(intp, 4)
        a_row, w_row, out_row = (builder.extract_value(x.strides, 0) for x in (a, w, out))
        c_at = [[at(builder, out.data, builder.add(builder.mul(builder.add(o0, ir.Constant(intp, r * TILE_ROWS)), out_row),
                                                   builder.mul(builder.add(c0, ir.Constant(intp, c * TILE_ROWS)), four)))
                 for c in range(2)] for r in range(2)]
        is_accumulating = builder.icmp_signed("!=", accumulate, ir.Constant(accumulate.type, 0))
        with builder.if_else(is_accumulating) as (then, otherwise):
            with then:
                for r in range(2):
                    for c in range(2):
                        builder.call(load, [tile[2 * r + c], c_at[r][c], out_row])
            with otherwise:
                for t in range(4):
                    builder.call(zero, [tile[t]])
        a_at = [builder.mul(builder.add(i0, ir.Constant(intp, r * TILE_ROWS)), a_row) for r in range(2)]
        w_at = [builder.mul(builder.add(j0, ir.Constant(intp, c * TILE_ROWS)), four) for c in range(2)]
        steps = builder.sdiv(builder.sub(kp1, kp0), ir.Constant(intp, TILE_PAIRS))
        with cgutils.for_range(builder, steps) as loop:
            kp = builder.add(kp0, builder.mul(loop.index, ir.Constant(intp, TILE_PAIRS)))
            k_bytes = builder.mul(kp, four)
            for r in range(2):
                builder.call(load, [tile[4 + r], at(builder, a.data, builder.add(a_at[r], k_bytes)), a_row])
            w_rows = builder.mul(kp, w_row)
            for c in range(2):
                builder.call(load, [tile[6 + c], at(builder, w.data, builder.add(w_rows, w_at[c])), w_row])
            for r in range(2):
                for c in range(2):
                    builder.call(dot, [tile[2 * r + c], tile[4 + r], tile[6 + c]])
        for r in range(2):
            for c in range(2):
                builder.call(store, [tile[2 * r + c], c_at[r][c], out_row])
        return context.get_dummy_value()

    def configure_typer(typingctx, config):
        return types.void(config), configure_codegen

    def release_typer(typingctx):
        return types.void(), release_codegen

    def block_typer(typingctx, a, i0, w, j0, kp0, kp1, accumulate, out, o0, c0):
        index = types.intp
        return types.void(a, index, w, index, index, index, index, out, index, index), block_codegen

    configure_typer.__name__, release_typer.__name__, block_typer.__name__ = "amx_configure", "amx_release", "amx_block"
    return {"amx_configure": intrinsic(configure_typer), "amx_release": intrinsic(release_typer),
            "amx_block": intrinsic(block_typer)}


@jit(fastmath=IN_ORDER, intrinsics=intrinsics)
def _amx_columns(a, panels, config, rows, p0, p1, n, k_block, out):
    """out[:rows, p0*PANEL : p1*PANEL] (cut at n) = a @ W from W's panels; `a` holds the activation's
    pairs with its rows padded (zeros) to a multiple of BLOCK. K runs in blocks of `k_block` pairs
    over every row block (see K_BLOCK)."""
    padded = a.shape[0]
    pairs = panels.shape[1]
    scratch = np.empty((padded, BLOCK), np.float32)  # sums of blocks cut by the edges of out
    amx_configure(config)  # noqa: F821 - bound by `intrinsics`
    for p in range(p0, p1):
        w = panels[p]
        for jb in range(0, PANEL, BLOCK):
            j0 = p * PANEL + jb
            if j0 >= n:
                break
            width = min(BLOCK, n - j0)
            for kp0 in range(0, pairs, k_block):
                kp1 = min(pairs, kp0 + k_block)
                for i0 in range(0, padded, BLOCK):
                    if width == BLOCK and i0 + BLOCK <= rows:
                        amx_block(a, i0, w, jb, kp0, kp1, kp0, out, i0, j0)  # noqa: F821
                    else:
                        amx_block(a, i0, w, jb, kp0, kp1, kp0, scratch, i0, 0)  # noqa: F821
            for i0 in range(0, padded, BLOCK):
                if not (width == BLOCK and i0 + BLOCK <= rows):
                    for m in range(i0, min(rows, i0 + BLOCK)):
                        for j in range(width):
                            out[m, j0 + j] = scratch[m, j]
    amx_release()  # noqa: F821


CONFIG = tile_config()


def amx_product(a: np.ndarray, panels: np.ndarray, n: int, out: np.ndarray | None = None,
                split: bool = True) -> np.ndarray | None:
    """a [M, K] float32 @ W [K, n] from W's `bf16_gemm.pack_pairs`, a rounded to bf16, float32
    sums; into `out` ([M, n] float32, unit-stride rows) when given; `split`: the panels may be
    shared with the helper thread. None where AMX-BF16 is not usable or compiled kernels are off."""
    if not has_amx_bf16():
        return None
    kernel = _amx_columns.get()
    m, k = a.shape
    if panels.shape[1] % TILE_PAIRS or not 0 <= panels.shape[1] - -(-k // 2) < TILE_PAIRS:
        raise ValueError(f"amx gemm: activation has {k} columns, the packed weight {2 * panels.shape[1]} rows")
    pairs = activation_pairs(a, -(-m // BLOCK) * BLOCK, panels.shape[1])
    if kernel is None or pairs is None:
        return None
    if out is None:
        out = aligned.empty((m, n), np.float32)  # tile stores on whole cache lines
    if panels.shape[1] == 0:  # K = 0: a sum of nothing (the kernel's K blocks would write nothing)
        out[...] = 0.0
        return out
    return paired_product(kernel, pairs, panels, m, n, out, split and m * k * n >= SPLIT_MIN_MACS)


def paired_product(kernel, pairs: np.ndarray, panels: np.ndarray, rows: int, n: int, out: np.ndarray,
                   split: bool) -> np.ndarray:
    """out[:rows, :n] = the left operand's k pairs (rows padded to BLOCK) @ W's panels, through the
    compiled `kernel` (`_amx_columns.get()`); `split`: the panels are shared with the helper thread."""
    count = panels.shape[0]
    if not split or count < 2:
        kernel(pairs, panels, CONFIG, rows, 0, count, n, K_BLOCK, out)
        return out
    from .gemm_impls import parallel_for  # noqa: PLC0415 - gemm_impls imports this module

    half = count // 2
    parallel_for(2, lambda i: kernel(pairs, panels, CONFIG, rows, *((0, half) if i == 0 else (half, count)), n, K_BLOCK, out))
    return out
