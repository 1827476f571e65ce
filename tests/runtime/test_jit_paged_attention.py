"""Compiled infc.PagedAttention (kernels/jit_paged_attention.py) against its NumPy path
(`jit.disabled()`, float64 over gathered blocks) and a dense float64 reference, on random pools with
scattered block tables: decode rows and prefill chunks mixed, odd block sizes and head sizes, one and
several query heads per KV head, NaN and infinities, scores wide enough for exp to underflow, and
exact scores that show the float32 exp's error. A row's result must be bitwise the same alone, in a
bigger batch, and with its prompt cut into other chunks (decoder plans rely on batch and chunk
invariance).

The compiled path computes in float32 (dots, exp, output sums; the softmax denominator in float64),
the NumPy path and the reference in float64: on these unit-scale numbers the two agree to ~5e-7
absolute (float32 rounding of dots over up to 64 products), hence RTOL and ATOL."""

import numpy as np
import pytest
from infc.compiler.runtime import jit
from infc.compiler.runtime.kernels import jit_paged_attention, kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

needs_jit = pytest.mark.skipif(not jit.enabled(), reason="numba is not installed (INFC_JIT=0 or missing)")
RTOL, ATOL = 2e-6, 1e-6  # float32 attention vs float64 (see the module docstring); seen: <= 5e-7


class Cache:
    """Pools of one layer and the sequences cached in them: every sequence's K/V and q for all of its
    positions are drawn up front, so any cut of it into steps sees the same numbers."""

    def __init__(self, rng, heads, kv_heads, head_dim, block_size, num_blocks=256, stale_nan=False):
        self.rng, self.heads, self.kv_heads, self.head_dim = rng, heads, kv_heads, head_dim
        self.block_size = block_size
        # where no sequence has written: stale numbers (the NumPy path multiplies the masked ones
        # by 0, so they must be finite there), or NaN, which shows any read past a context
        shape, stale = (num_blocks, kv_heads, block_size, head_dim), np.random.default_rng(99)
        self.k_pool = np.full(shape, np.nan, np.float32) if stale_nan else stale.standard_normal(shape).astype(np.float32)
        self.v_pool = np.full(shape, np.nan, np.float32) if stale_nan else stale.standard_normal(shape).astype(np.float32)
        self.free = list(rng.permutation(num_blocks))
        self.seqs = []

    def add(self, length, q_scale=1.0):
        blocks = [self.free.pop() for _ in range(-(-length // self.block_size))]
        k = self.rng.standard_normal((self.kv_heads, length, self.head_dim)).astype(np.float32)
        v = self.rng.standard_normal((self.kv_heads, length, self.head_dim)).astype(np.float32)
        q = (self.rng.standard_normal((length, self.heads * self.head_dim)) * q_scale).astype(np.float32)
        self.seqs.append({"blocks": blocks, "k": k, "v": v, "q": q})
        return len(self.seqs) - 1

    def fill(self, seq, count):
        """Writes the first `count` positions of `seq` into the pools (its cached context)."""
        s = self.seqs[seq]
        for pos in range(count):
            block, offset = s["blocks"][pos // self.block_size], pos % self.block_size
            self.k_pool[block, :, offset] = s["k"][:, pos]
            self.v_pool[block, :, offset] = s["v"][:, pos]

    def step(self, chunks, scale=0.125, meta_dtype=np.int32):
        """Runs PagedAttention on chunks (seq, first position, number of new positions); returns each
        chunk's output rows [count, N * H]. The new K/V land in the pools as the runner's step does."""
        total = sum(count for _, _, count in chunks)
        q = np.concatenate([self.seqs[s]["q"][p:p + n] for s, p, n in chunks])[None]
        k_new = np.concatenate([self.seqs[s]["k"][:, p:p + n] for s, p, n in chunks], axis=1)[None]
        v_new = np.concatenate([self.seqs[s]["v"][:, p:p + n] for s, p, n in chunks], axis=1)[None]
        width = max(len(self.seqs[s]["blocks"]) for s, _, _ in chunks) + 2
        tables = np.zeros((len(chunks), width), meta_dtype)
        slots = []
        for i, (s, p, n) in enumerate(chunks):
            blocks = self.seqs[s]["blocks"]
            tables[i, :len(blocks)] = blocks
            slots += [blocks[pos // self.block_size] * self.block_size + pos % self.block_size for pos in range(p, p + n)]
        starts = np.concatenate([[0], np.cumsum([n for _, _, n in chunks])]).astype(meta_dtype)
        context_lens = np.array([p + n for _, p, n in chunks], meta_dtype)
        attrs = {"num_heads": self.heads, "kv_num_heads": self.kv_heads, "scale": scale, "layer": 0}
        inputs = [q, k_new, v_new, self.k_pool, self.v_pool, np.array(slots, np.int64).reshape(total),
                  tables, starts, context_lens]
        (y,) = kernel_for("infc", "PagedAttention")(inputs, attrs, KernelContext(17))
        assert y.shape == q.shape and y.dtype == np.float32
        return [y[0, starts[i]:starts[i + 1]] for i in range(len(chunks))]

    def reference(self, seq, first, count, scale=0.125):
        """Dense float64 attention of positions [first, first + count) over the sequence's prefix."""
        s = self.seqs[seq]
        group, length = self.heads // self.kv_heads, first + count
        q = s["q"][first:length].reshape(count, self.heads, self.head_dim).astype(np.float64)
        k = np.repeat(s["k"][:, :length].astype(np.float64), group, axis=0)
        v = np.repeat(s["v"][:, :length].astype(np.float64), group, axis=0)
        scores = np.einsum("snh,nlh->nsl", q, k) * scale
        scores = np.where(np.arange(length)[None, :] <= np.arange(first, length)[:, None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.einsum("nsl,nlh->snh", probs, v).reshape(count, -1)


def both_paths(make_cache, chunks, scale=0.125, meta_dtype=np.int32):
    """(compiled outputs, NumPy outputs, compiled pools, NumPy pools) of one step on two equal caches."""
    compiled, numpy_path = make_cache(), make_cache()
    y = compiled.step(chunks, scale, meta_dtype)
    with jit.disabled():
        y_numpy = numpy_path.step(chunks, scale, meta_dtype)
    return y, y_numpy, compiled, numpy_path


def mixed_cache(heads, kv_heads, head_dim, block_size, seed=0, stale_nan=False):
    """A cache with sequences for a mixed step, and that step: a whole prompt, a chunk after
    cached context, decode rows (one right at a block boundary), a context all new but one."""
    cache = Cache(np.random.default_rng(seed), heads, kv_heads, head_dim, block_size, stale_nan=stale_nan)
    chunks = []
    for cached, new in [(0, 23), (9, 7), (40, 1), (block_size * 3 - 1, 1), (block_size * 2, 1), (1, 18), (0, 1)]:
        seq = cache.add(cached + new)
        cache.fill(seq, cached)
        chunks.append((seq, cached, new))
    return cache, chunks


@needs_jit
@pytest.mark.parametrize("heads, kv_heads, head_dim, block_size", [
    (9, 3, 64, 16), (4, 4, 32, 16), (6, 2, 33, 5), (3, 1, 7, 1), (8, 2, 16, 3)])
def test_compiled_matches_numpy_path_and_dense_reference(heads, kv_heads, head_dim, block_size):
    def make():
        return mixed_cache(heads, kv_heads, head_dim, block_size)[0]

    chunks = mixed_cache(heads, kv_heads, head_dim, block_size)[1]
    y, y_numpy, compiled, numpy_path = both_paths(make, chunks)
    assert np.array_equal(compiled.k_pool, numpy_path.k_pool) and np.array_equal(compiled.v_pool, numpy_path.v_pool)
    stale_nan, _ = mixed_cache(heads, kv_heads, head_dim, block_size, stale_nan=True)
    for got, alone in zip(y, stale_nan.step(chunks)):  # nothing outside the contexts was read
        assert np.array_equal(got, alone)
    with jit.disabled():  # the NumPy path gathers slots past short contexts, and must not let NaN through
        stale_numpy = mixed_cache(heads, kv_heads, head_dim, block_size, stale_nan=True)[0].step(chunks)
    for got, want in zip(stale_numpy, y_numpy):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    for (seq, first, count), got, want in zip(chunks, y, y_numpy):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"sequence {seq} vs the NumPy path")
        np.testing.assert_allclose(got, compiled.reference(seq, first, count), rtol=RTOL, atol=ATOL,
                                   err_msg=f"sequence {seq} vs the dense reference")


@needs_jit
@pytest.mark.parametrize("meta_dtype", [np.int32, np.int64])
def test_wide_scores_underflow_like_numpy(meta_dtype):
    """Scores tens apart: most exp terms underflow, the row is one or two keys (the polynomial exp
    against NumPy's), with the step's indexes as int32 or int64. Scores reach ~300 here, where a
    float32 ulp is 3e-5: the weights are off by that much relative, the outputs (sums of unit-scale
    values) by up to 1.4e-5 seen over 10 seeds, hence the wider tolerance (as onnxruntime's float32)."""
    def make():
        cache = Cache(np.random.default_rng(3), 4, 2, 24, 8)
        for length in (50, 31, 64):
            cache.add(length, q_scale=40.0)
        for seq, cached in enumerate((49, 0, 20)):
            cache.fill(seq, cached)
        return cache

    chunks = [(0, 49, 1), (1, 0, 31), (2, 20, 44)]
    y, y_numpy, compiled, _ = both_paths(make, chunks, scale=0.5, meta_dtype=meta_dtype)
    for (seq, first, count), got, want in zip(chunks, y, y_numpy):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5)
        np.testing.assert_allclose(got, compiled.reference(seq, first, count, 0.5), rtol=1e-4, atol=5e-5)


@needs_jit
def test_nan_reaches_the_rows_that_see_it_as_in_numpy():
    def make():
        cache = mixed_cache(6, 2, 16, 4, seed=4)[0]
        cache.seqs[0]["k"][1, 10, 3] = np.nan  # prompt position 10, second KV head
        cache.seqs[2]["v"][0, 5, 0] = np.nan  # in the cached context of a decode row
        cache.fill(2, 40)
        return cache

    chunks = mixed_cache(6, 2, 16, 4, seed=4)[1]
    y, y_numpy, _, _ = both_paths(make, chunks)
    for got, want in zip(y, y_numpy):
        assert np.array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # K's NaN: all of heads 3-5 (KV head 1) from position 10 on; V's NaN: feature 0 of heads 0-2
    assert np.isnan(y[0][10:, 48:]).all() and np.isnan(y[0]).sum() == 13 * 48
    assert np.isnan(y[2][0, [0, 16, 32]]).all() and np.isnan(y[2]).sum() == 3


@needs_jit
@pytest.mark.parametrize("heads, kv_heads, head_dim, block_size", [(9, 3, 64, 16), (6, 2, 33, 5), (2, 2, 8, 1)])
def test_rows_do_not_depend_on_the_batch_or_the_chunking(heads, kv_heads, head_dim, block_size):
    """A prompt of 61 positions run whole, in chunks of 3, 5, 16, ..., one position at a time, and
    among other sequences of a bigger (and parallel) step: every row bitwise the same."""
    length, cuts = 61, [3, 5, 16, 1, 2, 34]

    def fresh():
        cache = Cache(np.random.default_rng(7), heads, kv_heads, head_dim, block_size, num_blocks=600, stale_nan=True)
        cache.add(length)
        for other in (150, 33, 7, 90, 120):  # company for the batched step
            cache.fill(cache.add(other), other - 1)
        return cache

    whole = fresh().step([(0, 0, length)])[0]
    cache, rows, start = fresh(), [], 0
    for count in cuts:
        rows.append(cache.step([(0, start, count)])[0])
        start += count
    chunked = np.concatenate(rows)
    cache, rows = fresh(), []
    for pos in range(length):
        rows.append(cache.step([(0, pos, 1)])[0])
    single = np.concatenate(rows)
    cache = fresh()
    batched = cache.step([(1, 149, 1), (2, 32, 1), (0, 0, 29), (3, 6, 1), (4, 89, 1)])[2]
    batched = np.concatenate([batched, cache.step([(5, 119, 1), (0, 29, 32), (1, 150 - 1, 1)])[1]])
    assert np.array_equal(whole, chunked), "chunked prefill differs from the whole prompt"
    assert np.array_equal(whole, single), "one position per step differs from the whole prompt"
    assert np.array_equal(whole, batched), "rows in a batch differ from the prompt alone"
    np.testing.assert_allclose(whole, fresh().reference(0, 0, length), rtol=RTOL, atol=ATOL)


@needs_jit
def test_large_decode_step_split_across_threads_matches_rows_alone():
    """Enough context to share the step with the helper thread; each row equals its step alone."""
    cache = Cache(np.random.default_rng(11), 9, 3, 64, 16, num_blocks=800)
    seqs = [cache.add(length) for length in np.random.default_rng(12).integers(100, 300, 24)]
    for seq in seqs:
        cache.fill(seq, len(cache.seqs[seq]["q"]) - 1)
    chunks = [(seq, len(cache.seqs[seq]["q"]) - 1, 1) for seq in seqs]
    together = cache.step(chunks)
    for chunk, got in zip(chunks, together):
        assert np.array_equal(got, cache.step([chunk])[0])
    with jit.disabled():
        numpy_path = cache.step(chunks)
    np.testing.assert_allclose(np.concatenate(together), np.concatenate(numpy_path), rtol=RTOL, atol=ATOL)


def exact_scores_cache(scores, block_size=16):
    """A cache whose one sequence's last position scores exactly `scores` (float32) against its
    context with scale 1 (q and every key have one nonzero feature, 1 and the score), and whose
    value rows are one-hot: that row's output is the softmax weights themselves."""
    length = len(scores)
    cache = Cache(np.random.default_rng(8), 1, 1, length, block_size)
    seq = cache.add(length)
    s = cache.seqs[seq]
    s["q"][:] = 0.0
    s["q"][-1, 0] = 1.0
    s["k"][:] = 0.0
    s["k"][0, :, 0] = scores
    s["v"][0] = np.eye(length, dtype=np.float32)
    cache.fill(seq, length - 1)
    return cache, [(seq, length - 1, 1)]


@needs_jit
def test_softmax_weights_carry_only_float32_rounding_and_underflow_to_zero():
    """Scores that are exact in float32 (the peak 0 among them, so x = score - peak is exact too):
    each weight is the float32 exp (range reduction and Taylor polynomial, <= 2 ulp) over a float64
    sum, rounded once more; scores under -87 (and -inf) weigh exactly 0, as exp underflows."""
    rng = np.random.default_rng(9)
    scores = np.concatenate([[0.0, -np.inf, -87.5, -100.0, -1e30, -86.9, -0.3465, 0.3465 - 1.0],
                             rng.uniform(-87.0, 0.0, 40), rng.uniform(-3.0, 0.0, 14)]).astype(np.float32)
    cache, chunks = exact_scores_cache(scores)
    got = cache.step(chunks, scale=1.0)[0][0]
    weights = np.exp(scores.astype(np.float64))
    want = weights / weights.sum()
    assert np.all(got[scores < -87.0] == 0.0)
    # atol: weights under float32's normal range (below 1.2e-38) keep fewer digits
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-38)
    with jit.disabled():
        np.testing.assert_allclose(exact_scores_cache(scores)[0].step(chunks, scale=1.0)[0][0], want, rtol=1e-7, atol=1e-38)


@needs_jit
@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the NumPy path's inf - inf
@pytest.mark.parametrize("scores, nan_row", [
    ([1.0, -np.inf, 0.5], False), ([0.5, np.inf, -1.0], True), ([-np.inf], True), ([-np.inf, -np.inf], True),
    ([2.0, -np.inf, np.nan, 1.0], True)])
def test_infinite_and_nan_scores_as_in_numpy(scores, nan_row):
    """-inf weighs 0, unless every score is -inf (-inf - -inf is NaN); +inf wins the peak and
    inf - inf is NaN; NaN makes its row NaN: all as in the NumPy path's float64 softmax."""
    scores = np.array(scores, np.float32)
    cache, chunks = exact_scores_cache(scores)
    got = cache.step(chunks, scale=1.0)[0]
    with jit.disabled():
        want = exact_scores_cache(scores)[0].step(chunks, scale=1.0)[0]
    assert np.isnan(got).all() if nan_row else not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)


def test_block_outside_the_pool_is_the_numpy_paths_error():
    cache = Cache(np.random.default_rng(5), 2, 1, 8, 4, num_blocks=8)
    seq = cache.add(12)
    cache.fill(seq, 8)
    cache.seqs[seq]["blocks"][1] = 8  # the cached context's second block is not in the pool
    cache.seqs[seq]["blocks"][2] = 0
    with pytest.raises(IndexError):
        cache.step([(seq, 8, 4)])


def test_malformed_steps_are_left_to_the_numpy_path():
    attend = jit_paged_attention.attend
    pool = np.zeros((4, 1, 4, 8), np.float32)
    q = np.zeros((1, 3, 16), np.float32)
    tables = np.zeros((1, 2), np.int32)
    starts = np.array([0, 3], np.int32)
    assert attend(q, pool, pool, tables, starts, np.array([2], np.int32), 2, 1.0) is None  # 3 rows, context 2
    assert attend(q, pool, pool, tables, starts, np.array([9], np.int32), 2, 1.0) is None  # table covers 8
    assert attend(q, pool, pool, tables, np.array([0, 4], np.int32), np.array([4], np.int32), 2, 1.0) is None
    assert attend(q.astype(np.float64), pool, pool, tables, starts, np.array([3], np.int32), 2, 1.0) is None
    if jit.enabled():
        assert attend(q, pool, pool, tables, starts, np.array([3], np.int32), 2, 1.0) is not None


@needs_jit
def test_new_rows_are_written_into_the_pools_as_the_numpy_path_writes_them():
    from infc.compiler.runtime.kernels.paged_attention import _write_kv

    rng = np.random.default_rng(13)
    k_pool, v_pool = (rng.standard_normal((6, 2, 4, 8)).astype(np.float32) for _ in range(2))
    pools = [k_pool, v_pool, k_pool.copy(), v_pool.copy()]
    k_new, v_new = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(2))
    slots = np.array([3, 4, 17, 0, 23])
    assert jit_paged_attention.write_pools(pools[0], pools[1], k_new, v_new, slots)
    _write_kv(pools[2], k_new, slots)
    _write_kv(pools[3], v_new, slots)
    assert np.array_equal(pools[0], pools[2]) and np.array_equal(pools[1], pools[3])
    before = [p.copy() for p in pools[:2]]
    for outside in (24, -1):  # past the pools, negative: nothing written, the NumPy path judges it
        assert not jit_paged_attention.write_pools(pools[0], pools[1], k_new, v_new, np.array([3, 4, outside, 0, 1]))
        assert all(np.array_equal(p, b) for p, b in zip(pools[:2], before))
    assert not jit_paged_attention.write_pools(pools[0], pools[1], k_new.astype(np.float64), v_new, slots)
