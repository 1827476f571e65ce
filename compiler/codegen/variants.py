"""Every generated GEMM kernel variant, as data: family, dtypes, tile constants, epilogue.

Families (templates in templates/*.cuh, all computing C = epilogue(A @ W^T) with W stored (N, K)):
    simt         (a) fp32 SIMT tiles          tile: BM BN BK TM TN
    mma          (b) bf16/fp16 mma.sync       tile: BM BN BK WM WN STAGES
    skinny       (c) decode M <= 8*MT         tile: NW MT WARPS KU ST   (weights pre-packed)
    skinny_int8  (e) same, int8 weights with per-channel scales

The epilogue (d) is part of every variant. CI compiles every entry of VARIANTS to an sm_90 cubin
and rejects spills (tests/codegen/test_compile.py). Per family and dtype the list holds every
tile with the plain and with the heaviest epilogue, plus every epilogue (and a cast) on the first
tile: an epilogue only changes the last few instructions, so that covers each epilogue's code and
each tile's register pressure without compiling the whole product.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Iterator

DTYPES = ("float32", "bfloat16", "float16")
SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
ACTIVATIONS = ("none", "relu", "gelu", "silu")
TILE_KEYS = {
    "simt": ("BM", "BN", "BK", "TM", "TN"),
    "mma": ("BM", "BN", "BK", "WM", "WN", "STAGES"),
    "skinny": ("NW", "MT", "WARPS", "KU", "ST"),
    "skinny_int8": ("NW", "MT", "WARPS", "KU", "ST"),
}


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    act: str = "none"
    residual: bool = False
    swiglu: bool = False        # output column h = silu(gate h) * up h; gate/up interleaved by prepack
    out_dtype: str | None = None  # None: the input dtype

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise ValueError(f"epilogue: unknown activation {self.act!r}")
        if self.swiglu and self.act != "none":
            raise ValueError("epilogue: swiglu already applies silu to the gate; act must be 'none'")
        if self.out_dtype is not None and self.out_dtype not in DTYPES:
            raise ValueError(f"epilogue: unknown output dtype {self.out_dtype!r}")

    def tag(self, in_dtype: str) -> str:
        parts = [p for p, on in (("bias", self.bias), (self.act, self.act != "none"),
                                 ("swiglu", self.swiglu), ("res", self.residual)) if on]
        out = self.out_dtype or in_dtype
        if out != in_dtype:
            parts.append("to" + SHORT_DTYPE[out])
        return "_".join(parts) or "plain"


@dataclass(frozen=True)
class Variant:
    family: str
    dtype: str                      # A (activation) dtype; skinny_int8 weights are int8
    tile: tuple[int, ...]           # values for TILE_KEYS[family], in order
    epilogue: Epilogue = field(default_factory=Epilogue)

    def __post_init__(self) -> None:
        if self.family not in TILE_KEYS:
            raise ValueError(f"variant: unknown family {self.family!r}")
        if len(self.tile) != len(TILE_KEYS[self.family]):
            raise ValueError(f"variant {self.family}: tile needs {TILE_KEYS[self.family]}")
        if (self.family == "simt") != (self.dtype == "float32"):
            raise ValueError(f"variant {self.family}: dtype {self.dtype} not supported")

    @property
    def params(self) -> dict[str, int | str | bool]:
        """What the launcher needs (runtime/cuda/geometry.py), JSON scalars only."""
        e = self.epilogue
        return {"family": self.family, "dtype": self.dtype, "out_dtype": self.out_dtype, "bias": e.bias,
                "act": e.act, "residual": e.residual, "swiglu": e.swiglu,
                **dict(zip(TILE_KEYS[self.family], self.tile))}

    @property
    def out_dtype(self) -> str:
        return self.epilogue.out_dtype or self.dtype

    @property
    def name(self) -> str:
        tile = "x".join(str(v) for v in self.tile)
        return f"{self.family}_{SHORT_DTYPE[self.dtype]}_{tile}_{self.epilogue.tag(self.dtype)}"


SIMT_TILES = ((128, 128, 8, 8, 8), (128, 64, 16, 8, 4), (64, 64, 16, 4, 4), (64, 32, 16, 4, 4))
# 128x128x32 first: the fastest on the H200 (2026-11-29, 308 TFLOP/s at 4096^3 bf16, 0.39x cuBLAS) and the
# tile every epilogue is compiled on. The template since loads the next k-step's fragments while the mma
# run, so BK = 64 fits without spills: half the barriers per FLOP. 128x128x64 keeps two 4-warp blocks
# per SM (252 registers, 96 KB each); the 8-warp 256x128 / 128x256 x64 tiles (CUTLASS's sm80 defaults,
# one block per SM) need a quarter less L2 traffic per FLOP. The smaller tiles are for M <= 1024 or N <
# 4096, where the big ones leave SMs idle. On the H200 (2026-11-30, TFLOP/s at 4096^3 bf16, cuBLAS 795):
# 402, 400 for 128x256x64 at 3 and 4 stages, 381 and 364 for 256x128x64 at 4 and 3, 355 128x128x64, 334
# 128x64, 328 128x128x32, 291 64x128, 252 64x64; untimed since the epilogue goes through shared memory.
MMA_TILES = ((128, 128, 32, 2, 2, 4), (128, 128, 64, 2, 2, 3), (256, 128, 64, 4, 2, 3), (256, 128, 64, 4, 2, 4),
             (128, 256, 64, 2, 4, 3), (128, 256, 64, 2, 4, 4), (128, 64, 64, 2, 2, 3), (64, 128, 32, 2, 2, 4),
             (64, 64, 64, 2, 2, 4))
# Skinny: NW n16 tiles (16 NW columns) per block, MT groups of 8 rows (M <= 8 MT), WARPS, KU steps per
# round, ST stages of the weights' shared-memory ring (0: the next round prefetched into registers).
# The H200 run of 2026-11-29 measured the previous layout (activations as the mma's A side, 4-byte
# activation loads) at 74-89% of the copy bandwidth for M = 1 and 60% at M = 16, its int8 form no faster
# than bf16 (instruction-bound). The operand-swapped register-prefetch tiles (ST = 0) measured 85-100% at
# M = 1 and 70-97% at M = 16 on 2026-11-30, and the int8 GEMV 1.45-1.6x the bf16 path at 59-80% of the
# copy bandwidth. Ring tiles (ST > 0: more bytes in flight without registers) were timed the same day and
# won no decode shape (int8 at M = 1 stayed 1.46-1.6x bf16 on the register tiles): one of each is kept.
SKINNY_TILES = ((1, 1, 8, 4, 0), (2, 1, 8, 2, 0), (1, 1, 8, 2, 0), (2, 1, 4, 2, 0),   # M <= 8
                (1, 2, 8, 4, 0), (2, 2, 4, 2, 0), (4, 2, 4, 1, 0),                     # M <= 16
                (2, 8, 4, 1, 0),                                                       # M <= 64
                (1, 2, 8, 2, 4))                                                       # ring
# int8: one 16-byte load per lane and step (half the 16-bit bytes), so deeper KU for the same bytes.
SKINNY_INT8_TILES = ((1, 1, 8, 8, 0), (2, 1, 8, 4, 0), (1, 1, 8, 4, 0), (2, 2, 8, 4, 0), (4, 2, 4, 2, 0),
                     (2, 8, 4, 1, 0), (1, 1, 8, 4, 4))

EPILOGUES = (
    Epilogue(),
    Epilogue(bias=True),
    Epilogue(bias=True, act="relu"),
    Epilogue(bias=True, act="gelu"),
    Epilogue(act="silu"),
    Epilogue(bias=True, residual=True),
    Epilogue(swiglu=True),
    Epilogue(bias=True, act="gelu", residual=True),
)
# Heaviest: every stage plus a cast, compiled on every tile to catch register pressure.
HEAVY = Epilogue(bias=True, swiglu=True, residual=True)


def _family_variants(family: str, dtypes: tuple[str, ...], tiles, casts: dict[str, str]) -> Iterator[Variant]:
    for dtype in dtypes:
        yield from (Variant(family, dtype, tiles[0], e) for e in EPILOGUES)
        yield Variant(family, dtype, tiles[0], Epilogue(bias=True, out_dtype=casts[dtype]))
        for tile in tiles[1:]:
            yield Variant(family, dtype, tile)
        for tile in tiles:
            yield Variant(family, dtype, tile, replace(HEAVY, out_dtype=casts[dtype]))


# What the build fuses into a tuned launch (compiler/codegen/epilogue_match.py): bias, an activation and a
# residual, in that order; every combination but the plain one.
FUSED_EPILOGUES = tuple(Epilogue(bias=b, act=a, residual=r) for b in (False, True) for a in ACTIVATIONS
                        for r in (False, True) if b or a != "none" or r)
# The heaviest of them (erf GELU and a residual read) on every fp32 tile: the build fuses epilogues into
# whichever tile won, so each tile's register pressure with them is compiled in CI.
FUSED_HEAVY = Epilogue(bias=True, act="gelu", residual=True)


# A GEMM site of an fp16/bf16 plan (compiler/build_cuda.py): 16-bit A and W, fp32 accumulate, and an fp32
# output for the plan's next step, which rounds it to the low type itself (as the CPU plan does).
TO_F32 = Epilogue(out_dtype="float32")


def all_variants() -> tuple[Variant, ...]:
    to_f32 = {"bfloat16": "float32", "float16": "float32"}
    variants = [
        *_family_variants("simt", ("float32",), SIMT_TILES, {"float32": "bfloat16"}),
        *(Variant("simt", "float32", tile, FUSED_HEAVY) for tile in SIMT_TILES[1:]),
        *_family_variants("mma", ("bfloat16", "float16"), MMA_TILES, to_f32),
        *(Variant("mma", dtype, tile, TO_F32) for dtype in ("bfloat16", "float16") for tile in MMA_TILES),
        *_family_variants("skinny", ("bfloat16", "float16"), SKINNY_TILES, to_f32),
        *_family_variants("skinny_int8", ("bfloat16", "float16"), SKINNY_INT8_TILES, to_f32),
    ]
    names = [v.name for v in variants]
    assert len(set(names)) == len(names), "variant names must be unique"
    return tuple(variants)


VARIANTS = all_variants()
BY_NAME = {v.name: v for v in VARIANTS}


def is_plain(variant: Variant) -> bool:
    e = variant.epilogue
    return not (e.bias or e.residual or e.swiglu or e.act != "none") and variant.out_dtype == variant.dtype


def is_plain_to_f32(variant: Variant) -> bool:
    """16-bit in, fp32 out, nothing else: what a reduced-precision plan's GEMM sites run."""
    return variant.dtype != "float32" and variant.epilogue == TO_F32


def with_epilogue(variant: Variant, epilogue: Epilogue) -> Variant:
    """The same tile with another epilogue (a tuned plain winner, fused with its site's epilogue)."""
    return replace(variant, epilogue=epilogue)


@functools.cache
def _fused_by_name() -> dict[str, Variant]:
    fused = [with_epilogue(v, e) for v in VARIANTS if is_plain(v) for e in FUSED_EPILOGUES]
    fused += [with_epilogue(v, replace(e, out_dtype=TO_F32.out_dtype)) for v in VARIANTS if is_plain_to_f32(v)
              for e in FUSED_EPILOGUES]  # a 16-bit site's tile with its epilogue taken through the rounding
    return {v.name: v for v in fused}


def variant_named(name: str) -> Variant:
    """A listed variant, or a plain one with a fused epilogue (what a plan's kernel table may name)."""
    found = BY_NAME.get(name) or _fused_by_name().get(name)
    if found is None:
        raise KeyError(f"unknown kernel variant {name!r}")
    return found
