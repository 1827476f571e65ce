"""The row kernels (compiler/codegen/templates/rows.cuh) through their launcher (runtime/cuda/rows.py), run
by the CPU emulator against the device ops' array paths: softmax rows shorter and longer than the
register cache, MultiHeadAttention's scale and causal band (more, as many and fewer queries than
keys), rows all -inf, and every operand combination of the norm kernel. Each entry is also compiled
for sm_90 with nvcc, with no spills."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen import emulate
from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import compile_source, find_nvcc
from infc.compiler.codegen.row_kernels import ROW_OPS, row_entries, row_source
from infc.compiler.runtime.cuda.executor import DeviceContext
from infc.compiler.runtime.cuda.ops_attention import multi_head_attention, softmax_last
from infc.compiler.runtime.cuda.ops_nn import NN
from infc.compiler.runtime.cuda.rows import NORM, ROW_ARGS, SOFTMAX, RowKernels
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

ROW_CACHE_SOFTMAX, ROW_CACHE_NORM = 8 * 128, 8 * 256  # values a block holds in registers (ROW_CACHE x BLOCK)


@pytest.fixture(scope="module")
def rows(emu_dir):
    return RowKernels({entry: emulate.Function(row_source(entry), entry, ROW_ARGS[entry], emu_dir)
                       for entry in (SOFTMAX, NORM)})


def _ctx(rows, num_outputs: int = 1) -> DeviceContext:
    return DeviceContext(np, None, 17, [None] * num_outputs, rows=rows)


def _close(got, want, limit=2e-6):
    error = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
    assert error <= limit, f"max error {error:.2e} at {np.unravel_index(np.abs(got - want).argmax(), want.shape)}"


@pytest.mark.parametrize("width", [5, 131, ROW_CACHE_SOFTMAX + 77])
def test_softmax_rows_match_the_array_path(rows, width):
    x = np.random.default_rng(width).standard_normal((3, width), dtype=np.float32) * 4
    x[1, :] = -np.inf  # a row with nothing visible: zeros, as the CPU kernel
    y = rows.softmax(x, np, scale=0.5)
    _close(y, softmax_last(x.astype(np.float64) * 0.5, np))
    assert rows.launches and not np.isnan(y).any() and (y[1] == 0).all()
    before = x.copy()
    assert rows.softmax(x, np) is not x and (x == before).all()  # a new array unless in place
    inner = rows.softmax(x, np, in_place=True)
    assert inner is x and np.allclose(x[0], softmax_last(before[0], np), rtol=1e-6)


@pytest.mark.parametrize("queries,keys", [(3, 7), (7, 7), (9, 4)])
@pytest.mark.parametrize("masked", [False, True, "left"])
def test_attention_scores_in_one_pass_match_the_array_path(rows, queries, keys, masked):
    rng = np.random.default_rng(queries * 10 + keys)
    b, n, h = 2, 3, 8
    q = rng.standard_normal((b, queries, n * h), dtype=np.float32)
    k = rng.standard_normal((b, keys, n * h), dtype=np.float32)
    v = rng.standard_normal((b, keys, n * h), dtype=np.float32)
    inputs = [q, k, v, None, None, None, None, None]
    if masked:  # key padding (the array ops go first, then the kernel with scale 1)
        inputs[4] = (rng.random((b, keys)) > 0.3).astype(np.int32)
    if masked == "left":  # left padding under the causal band: a first query sees only padded keys
        inputs[4] = np.ones((b, keys), np.int32)
        inputs[4][1, :keys // 2 + 1] = 0
    attrs = {"num_heads": n, "unidirectional": 1, "scale": 0.3}
    want = multi_head_attention(inputs, attrs, _ctx(None, 3))[0]
    cpu = kernel_for("com.microsoft", "MultiHeadAttention")(inputs, attrs, KernelContext(17, [None] * 3))[0]
    _close(want, cpu, 1e-5)  # the array path is the CPU kernel's semantics
    launches = rows.launches
    got = multi_head_attention(inputs, attrs, _ctx(rows, 3))[0]
    assert rows.launches == launches + 1
    _close(got, want)


@pytest.mark.parametrize("op,width", [("LayerNormalization", 7), ("LayerNormalization", 1024),
                                      ("RMSNormalization", 300), ("LayerNormalization", ROW_CACHE_NORM + 45)])
def test_norm_rows_match_the_array_path(rows, op, width):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((2, 3, width), dtype=np.float32) * 3 + 1
    gamma, beta = rng.standard_normal(width, dtype=np.float32), rng.standard_normal(width, dtype=np.float32)
    inputs = [x, gamma, beta] if op == "LayerNormalization" else [x, gamma]
    want = NN[("", op)](inputs, {"epsilon": 1e-5}, _ctx(None, len(inputs)))
    launches = rows.launches
    got = NN[("", op)](inputs, {"epsilon": 1e-5}, _ctx(rows, len(inputs)))
    assert rows.launches == launches + 1 and len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        _close(g, w)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("with_bias,num_outputs", [(True, 4), (False, 1)])
def test_skip_norm_rows_match_the_array_path(rows, op, with_bias, num_outputs):
    rng = np.random.default_rng(3)
    width = 96
    x, skip = (rng.standard_normal((2, 5, width), dtype=np.float32) for _ in range(2))
    gamma, beta, bias = (rng.standard_normal(width, dtype=np.float32) for _ in range(3))
    centered = op == "SkipLayerNormalization"
    inputs = [x, skip, gamma] + ([beta] if centered else []) + ([bias] if with_bias else [])
    kernel = NN[("com.microsoft", op)]
    want = kernel(inputs, {"epsilon": 1e-6}, _ctx(None, num_outputs))
    got = kernel(inputs, {"epsilon": 1e-6}, _ctx(rows, num_outputs))
    _close(got[0], want[0])
    _close(got[2], want[2])
    assert (got[1] is None) == (want[1] is None) == (not centered)
    if num_outputs == 4:
        _close(got[3], want[3], 1e-7)  # x + skip (+ bias): the same float32 sums


def test_broadcast_operands_keep_the_array_path(rows):
    x = np.ones((2, 4, 8), dtype=np.float32)
    assert not rows.may_norm(x, 2, np.ones((4, 8), dtype=np.float32))  # gamma over more than the last axis
    assert rows.may_norm(x, 1, np.ones((4, 8), dtype=np.float32))
    assert not rows.may_norm(x, 2, np.ones(8, dtype=np.float32), skip=np.ones((1, 4, 8), dtype=np.float32))
    assert not rows.may_norm(x.astype(np.float64), 2, np.ones(8))
    assert not rows.may_softmax(np.ones((2, 3), dtype=np.float16))


def test_ops_map_to_entries():
    program = [{"op": "Softmax"}, {"op": "SkipLayerNormalization", "domain": "com.microsoft"}, {"op": "Add"}]
    assert row_entries(program) == [NORM, SOFTMAX]
    assert set(ROW_OPS.values()) == set(ROW_ARGS)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")
@pytest.mark.parametrize("entry", sorted(ROW_ARGS))
def test_row_kernels_compile_for_sm90_without_spills(entry, tmp_path):
    compiled = compile_source(row_source(entry), entry, CubinCache(tmp_path), "sm_90")
    assert compiled.cubin.read_bytes().startswith(b"\x7fELF")
    assert not compiled.resources.has_spills, compiled.resources
