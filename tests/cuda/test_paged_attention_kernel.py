"""The device paged-attention kernel (compiler/codegen/templates/paged_attention.cuh, launched by
runtime/cuda/rows.py), run by the CPU emulator against the CPU kernel's float64 path over the same
pools: decode rows and prefill chunks in one step, grouped / multi / single KV heads, contexts past
one tile of keys, head sizes past one dimension per thread, sliding windows, soft-capping, ALiBi,
scattered block tables; and a row's result bit for bit the same alone and in a batch."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.codegen import emulate
from infc.compiler.codegen.row_kernels import row_source
from infc.compiler.runtime.cuda.executor import DeviceContext
from infc.compiler.runtime.cuda.ops_paged import paged_attention as device_paged_attention
from infc.compiler.runtime.cuda.rows import PAGED, ROW_ARGS, RowKernels
from infc.compiler.runtime.kernels.paged_attention import _attend_numpy

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def rows(emu_dir):
    return RowKernels({PAGED: emulate.Function(row_source(PAGED), PAGED, ROW_ARGS[PAGED], emu_dir)})


def _step(rng, chunks, heads, kv_heads, head_size, num_blocks=24):
    """Pools filled at random, a table per sequence drawn from a shuffled pool, and the step's metadata
    for chunks of (new tokens, context length after the step)."""
    pools = [rng.standard_normal((num_blocks, kv_heads, BLOCK_SIZE, head_size), dtype=np.float32) for _ in range(2)]
    free = list(rng.permutation(num_blocks))
    width = max(-(-length // BLOCK_SIZE) for _, length in chunks)
    tables = np.zeros((len(chunks), width), np.int32)
    for row, (_, length) in enumerate(chunks):
        tables[row, :-(-length // BLOCK_SIZE)] = [free.pop() for _ in range(-(-length // BLOCK_SIZE))]
    starts = np.concatenate([[0], np.cumsum([n for n, _ in chunks])]).astype(np.int32)
    context_lens = np.array([length for _, length in chunks], np.int32)
    q = rng.standard_normal((1, int(starts[-1]), heads * head_size), dtype=np.float32)
    return q, pools, tables, starts, context_lens


CASES = {  # name: (heads, kv_heads, head_size, attrs)
    "grouped": (4, 2, 16, {}),
    "multi-head, long head": (2, 2, 160, {}),
    "multi-query, window": (4, 1, 8, {"window": 21}),
    "softcap and alibi": (4, 2, 8, {"softcap": 5.0, "alibi_slopes": [0.5, 0.25, 0.125, 0.0625]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_the_cpu_kernel(rows, case):
    heads, kv_heads, head_size, extra = CASES[case]
    rng = np.random.default_rng(len(case))
    chunks = [(1, 150), (5, 37), (1, 3), (2, 2)]  # decodes past one tile of keys, a prefill chunk, a first prompt
    q, (k_pool, v_pool), tables, starts, context_lens = _step(rng, chunks, heads, kv_heads, head_size)
    scale = head_size ** -0.5
    softcap, window = float(extra.get("softcap", 0.0)), int(extra.get("window", 0))
    slopes = np.asarray(extra.get("alibi_slopes", ()), np.float32)
    assert rows.may_paged(q, k_pool, heads, kv_heads)
    got = rows.paged_attention(q, k_pool, v_pool, tables, starts, context_lens, np, num_heads=heads, kv_heads=kv_heads,
                               scale=scale, softcap=softcap, window=window, slopes=slopes)
    want = _attend_numpy(q, k_pool, v_pool, tables, starts, context_lens, heads, kv_heads, scale, softcap, window, slopes)
    error = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert error <= 2e-6, f"{case}: max error {error:.2e}"
    assert rows.launches


def test_a_row_is_the_same_alone_and_in_a_batch(rows):
    rng = np.random.default_rng(7)
    q, (k_pool, v_pool), tables, starts, context_lens = _step(rng, [(3, 140), (1, 60), (4, 9)], 4, 2, 16)
    batch = rows.paged_attention(q, k_pool, v_pool, tables, starts, context_lens, np, num_heads=4, kv_heads=2,
                                 scale=0.25, softcap=0.0, window=0, slopes=None)
    alone = rows.paged_attention(q[:, 3:4], k_pool, v_pool, tables[1:2], np.array([0, 1], np.int32), context_lens[1:2],
                                 np, num_heads=4, kv_heads=2, scale=0.25, softcap=0.0, window=0, slopes=None)
    assert np.array_equal(batch[3], alone[0])


def test_the_device_op_writes_the_pools_and_launches_the_kernel(rows):
    rng = np.random.default_rng(11)
    heads, kv_heads, head_size = 4, 2, 16
    q, pools, tables, starts, context_lens = _step(rng, [(2, 20), (1, 7)], heads, kv_heads, head_size)
    new = [rng.standard_normal((1, kv_heads, 3, head_size), dtype=np.float32) for _ in range(2)]
    positions = np.array([18, 19, 6])
    owner = np.array([0, 0, 1])
    slots = tables[owner, positions // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + positions % BLOCK_SIZE
    expected_pools = [p.copy() for p in pools]
    for pool, values in zip(expected_pools, new):
        pool[slots // BLOCK_SIZE, :, slots % BLOCK_SIZE, :] = values[0].transpose(1, 0, 2)
    ctx = DeviceContext(np, None, 17, [None], rows=rows)
    before = rows.launches
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": 0.25}
    (got,) = device_paged_attention([q, *new, *pools, slots, tables, starts, context_lens], attrs, ctx)
    assert rows.launches == before + 1
    assert all(np.array_equal(p, e) for p, e in zip(pools, expected_pools))  # written in place
    want = _attend_numpy(q, *pools, tables, starts, context_lens, heads, kv_heads, 0.25)
    assert np.abs(got.reshape(want.shape) - want).max() / np.abs(want).max() <= 2e-6
