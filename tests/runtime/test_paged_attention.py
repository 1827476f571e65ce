"""infc.PagedAttention against a dense float64 reference over each sequence's whole context (cached
blocks in scattered pool order, chunks and decode tokens mixed), and the infc.Float64 GEMM wrapper (kernels/batch_invariant.py)."""

import numpy as np
import pytest

from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

BLOCK = 4


def reference(q, k, v, num_new, scale):
    """q [S, N, H], k/v [kvN, L, H]: the last S positions attend causally."""
    n, kv_heads, length = q.shape[1], k.shape[0], k.shape[1]
    k, v = np.repeat(k, n // kv_heads, axis=0), np.repeat(v, n // kv_heads, axis=0)
    scores = np.einsum("snh,nlh->nsl", q, k) * scale
    allowed = np.arange(length)[None, :] <= np.arange(length - num_new, length)[:, None]
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("nsl,nlh->snh", probs, v).reshape(num_new, -1)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_paged_attention_matches_dense_attention_per_sequence(heads, kv_heads, rng):
    head_dim, num_blocks = 8, 32
    cached, new = [0, 7, 6, 19, 3], [5, 4, 1, 1, 9]  # prefill, chunk after context, two decodes, another chunk
    k_pool = np.zeros((num_blocks, kv_heads, BLOCK, head_dim), np.float32)
    v_pool = np.zeros_like(k_pool)
    free = list(rng.permutation(num_blocks))
    tables, full_k, full_v, slots = [], [], [], []
    for c, s in zip(cached, new):
        length = c + s
        table = [free.pop() for _ in range(-(-length // BLOCK))]
        tables.append(table)
        k = rng.standard_normal((kv_heads, length, head_dim)).astype(np.float32)
        v = rng.standard_normal((kv_heads, length, head_dim)).astype(np.float32)
        for pos in range(c):  # the cached context is already in the pool
            k_pool[table[pos // BLOCK], :, pos % BLOCK] = k[:, pos]
            v_pool[table[pos // BLOCK], :, pos % BLOCK] = v[:, pos]
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(c, length)]
        full_k.append(k)
        full_v.append(v)
    total = sum(new)
    q = rng.standard_normal((1, total, heads * head_dim)).astype(np.float32)
    k_new = np.concatenate([k[:, c:] for k, c in zip(full_k, cached)], axis=1)[None]
    v_new = np.concatenate([v[:, c:] for v, c in zip(full_v, cached)], axis=1)[None]
    block_tables = np.zeros((len(new), max(map(len, tables))), np.int32)
    for i, t in enumerate(tables):
        block_tables[i, :len(t)] = t
    starts = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    context_lens = (np.array(cached) + np.array(new)).astype(np.int32)
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": 0.3, "layer": 0}
    (y,) = kernel_for("infc", "PagedAttention")(
        [q, k_new, v_new, k_pool, v_pool, np.array(slots, np.int64), block_tables, starts, context_lens], attrs, KernelContext(17))
    assert y.shape == q.shape and y.dtype == np.float32
    for i, (c, s) in enumerate(zip(cached, new)):
        q_i = q[0, starts[i]:starts[i + 1]].reshape(s, heads, head_dim).astype(np.float64)
        want = reference(q_i, full_k[i].astype(np.float64), full_v[i].astype(np.float64), s, 0.3)
        np.testing.assert_allclose(y[0, starts[i]:starts[i + 1]], want, rtol=1e-5, atol=1e-6)
        for pos in range(c, c + s):  # the new tokens' K/V landed in their slots
            assert np.array_equal(k_pool[tables[i][pos // BLOCK], :, pos % BLOCK], full_k[i][:, pos])
            assert np.array_equal(v_pool[tables[i][pos // BLOCK], :, pos % BLOCK], full_v[i][:, pos])


def test_float64_gemm_rows_do_not_depend_on_the_number_of_rows(rng):
    run = kernel_for("infc", "Float64")
    w = rng.standard_normal((96, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    a = rng.standard_normal((1, 37, 96)).astype(np.float32)
    attrs = {"inner_op": "MatMul", "inner_domain": "", "const_inputs": [1]}
    ctx = KernelContext(17)
    (full,) = run([a, w], attrs, ctx)
    (one,) = run([a[:, 5:6], w], attrs, ctx)
    assert full.dtype == np.float32 and np.array_equal(full[:, 5:6], one)
    np.testing.assert_allclose(full, a @ w, rtol=1e-4, atol=1e-5)
    assert ctx.memo[1][0] is w  # the weight was cast once
    gemm = {"inner_op": "Gemm", "inner_domain": "", "const_inputs": [1, 2], "transB": 1}
    (y,) = run([a[0], w.T.copy(), bias], gemm, KernelContext(17))
    np.testing.assert_allclose(y, a[0] @ w + bias, rtol=1e-4, atol=1e-5)


def test_numba_threads_and_the_helper_thread_give_the_same_bits(monkeypatch):
    """Runs of tasks go to numba's threads (the parallel build) or to parallel_for: each run is the
    same kernel call, so the outputs must be equal bit for bit, prefill chunks and decode rows."""
    from infc.compiler.runtime.kernels import jit_paged_attention as pa

    if pa._attend_parts.get_parallel() is None:
        pytest.skip("compiled kernels off, or no thread-safe numba threading layer (OpenMP or TBB)")
    rng = np.random.default_rng(5)
    heads, kv_heads, head_dim, block = 6, 2, 32, 16
    lengths, new = np.array([300, 260, 90, 200]), np.array([40, 1, 1, 17])
    per_seq = -(-lengths.max() // block)
    k_pool = rng.standard_normal((per_seq * 4, kv_heads, block, head_dim), dtype=np.float32)
    v_pool = rng.standard_normal(k_pool.shape, dtype=np.float32)
    tables = rng.permutation(per_seq * 4).reshape(4, per_seq).astype(np.int64)
    q = rng.standard_normal((1, int(new.sum()), heads * head_dim), dtype=np.float32)
    starts = np.concatenate([[0], np.cumsum(new)])
    args = (q, k_pool, v_pool, tables, starts, lengths, heads, 0.17)
    monkeypatch.setattr(pa, "SPREAD_MIN_BYTES", 0)
    threads = pa.attend(*args)
    monkeypatch.setattr(pa, "SPREAD_MIN_BYTES", 1 << 62)
    monkeypatch.setattr(pa, "PARALLEL_MIN_BYTES", 0)
    helper = pa.attend(*args)
    assert threads is not None and helper is not None and np.array_equal(threads, helper)


def test_attention_stays_on_this_thread_while_the_gemms_back_off(monkeypatch):
    """While the backoff of numba's threads says the other core is taken (chain_gemm.spread_or_alone),
    a step's attention runs its tasks on this thread too, with the same bits as spread."""
    from infc.compiler.runtime import chain_gemm
    from infc.compiler.runtime.kernels import jit_paged_attention as pa

    spread = pa._attend_parts.get_parallel()
    if spread is None:
        pytest.skip("compiled kernels off, or no thread-safe numba threading layer (OpenMP or TBB)")
    rng = np.random.default_rng(6)
    heads, kv_heads, head_dim, block = 6, 2, 32, 16
    lengths = np.array([150, 90, 200])
    per_seq = -(-lengths.max() // block)
    k_pool = rng.standard_normal((per_seq * 3, kv_heads, block, head_dim), dtype=np.float32)
    v_pool = rng.standard_normal(k_pool.shape, dtype=np.float32)
    tables = rng.permutation(per_seq * 3).reshape(3, per_seq).astype(np.int64)
    q = rng.standard_normal((1, 3, heads * head_dim), dtype=np.float32)
    args = (q, k_pool, v_pool, tables, np.arange(4), lengths, heads, 0.17)
    monkeypatch.setattr(pa, "SPREAD_MIN_BYTES", 0)
    monkeypatch.setattr(chain_gemm, "_SPREAD_BACKOFF", chain_gemm.Backoff())
    spread_calls = []

    class Counting:
        def get_parallel(self):
            return lambda *a: (spread_calls.append(1), spread(*a))

    monkeypatch.setattr(pa, "_attend_parts", Counting())
    spread_out = pa.attend(*args)
    chain_gemm._SPREAD_BACKOFF.skip = 2
    alone = [pa.attend(*args) for _ in range(2)]
    assert spread_calls == [1] and chain_gemm._SPREAD_BACKOFF.skip == 0
    assert all(a is not None and np.array_equal(a, spread_out) for a in alone)
