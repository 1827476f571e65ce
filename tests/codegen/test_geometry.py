"""Launch geometry (compiler/runtime/cuda/geometry.py): grids, split-K choice, argument order."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen.variants import BY_NAME, VARIANTS
from infc.compiler.runtime.cuda.geometry import (ARGS, choose_splits, kernel_args, launch_for, output_shape,
                                                 packed_shape, unsupported)

SIMT = BY_NAME["simt_f32_128x128x8x8x8_plain"].params
MMA = BY_NAME["mma_bf16_128x128x32x2x2x4_plain"].params
SKINNY = BY_NAME["skinny_bf16_1x1x8x4x0_plain"].params
INT8 = BY_NAME["skinny_int8_bf16_1x1x8x8x0_plain"].params


def test_dense_grids_cover_tails():
    assert launch_for(SIMT, 130, 257, 5).grid == (3, 2, 1)
    mma = launch_for(MMA, 300, 262, 264)
    assert mma.grid == (3 * 3, 1, 1) and mma.block == (128, 1, 1)
    assert mma.smem_bytes == 4 * (128 + 128) * 32 * 2


def test_splits_depend_on_n_and_k_only():
    for N, K in [(4096, 4096), (11008, 4096), (4096, 11008), (576, 576), (1536, 576)]:
        launches = [launch_for(SKINNY, M, N, K) for M in (1, 2, 7, 8)]
        assert len({x.num_splits for x in launches}) == 1
        splits, num_kb = launches[0].num_splits, -(-K // 32)
        per = -(-num_kb // splits)
        assert (splits - 1) * per < num_kb, "a split would be empty"


def test_split_workspace_and_counters():
    x = launch_for(SKINNY, 8, 4096, 4096)
    assert x.num_splits > 1 and x.grid == (4096 // 16, x.num_splits, 1)
    assert x.workspace_floats == x.num_splits * 8 * 4096 and x.num_counters == 4096 // 16
    single = launch_for(SKINNY, 8, 4096, 4096, num_splits=1)
    assert single.workspace_floats == 0 and single.num_counters == 0
    assert choose_splits(SKINNY, 576, 576) >= 1


def test_unsupported_shapes_say_why():
    assert unsupported(MMA, 4, 4, 12) == "K not a multiple of 8"
    assert unsupported(SKINNY, 17, 64, 64) == "M too large for skinny tile"
    assert unsupported(SKINNY, 1, 64, 60) == "K not a multiple of 8"
    assert unsupported({**SIMT, "swiglu": True}, 1, 63, 8) == "swiglu needs an even N"
    assert unsupported(SIMT, 1, 7, 3) is None
    with pytest.raises(ValueError, match="K not a multiple of 8"):
        launch_for(SKINNY, 1, 64, 63)


def test_packed_shape_and_output_shape():
    assert packed_shape(SKINNY, 100, 1000) == (112, 1024)
    assert packed_shape(INT8, 100, 1000) == (112, 1024)
    assert packed_shape(INT8, 100, 1030) == (112, 1056)
    assert output_shape({**SIMT, "swiglu": True}, 3, 10) == (3, 5)


def test_kernel_args_follow_signature_order():
    for v in VARIANTS[:1] + VARIANTS[-1:]:
        launch = launch_for(v.params, 3, 64, 128)
        args = kernel_args(v.params, launch, 3, 64, 128, {"a": "A", "w": "W", "out": "C", "null": "0"},
                           as_int=np.int32)
        assert len(args) == len(ARGS[v.family])
        assert args[:3] == ("A", "W", "C") and all(isinstance(x, np.int32) for x in args if not isinstance(x, str))
