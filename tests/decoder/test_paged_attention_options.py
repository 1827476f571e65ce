"""infc.PagedAttention's options, compiled and NumPy paths against a dense float64 reference, on one
step that mixes a prompt, chunks after cached context and decode rows:

    softcap  Gemma 2's attn_logit_softcapping: scaled scores s become c * tanh(s / c) before the mask
    window   a sliding window (Mistral, Gemma 2/3): the query at position p sees keys p - W < k <= p
    alibi_slopes  ALiBi (Bloom, MPT): head h's score of key k from position p gains slope[h] * (k - p)
    sinks    gpt-oss: head h's softmax over [scores, sinks[h]], the sink's column then dropped

The cap is small against the scores and the windows shorter than the contexts, so a kernel that
ignored either would be far off. With a window the compiled loops start where the task's first row's
window does, which depends on how a prompt is cut into chunks: a row must come out bitwise the same
whichever cut (decoder plans rely on chunk invariance)."""

import numpy as np
import pytest

from infc.compiler.runtime import jit
from infc.compiler.runtime.kernels import kernel_for
from infc.compiler.runtime.kernels.common import KernelContext

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE = 4, 2, 16, 4, 0.25
LENGTHS = [40, 23, 14, 8]  # each sequence's positions
STEP = [(0, 40), (9, 14), (13, 1), (7, 1)]  # (cached positions, new positions) per sequence


def _sequences(seed=0):
    rng = np.random.default_rng(seed)
    return [{"q": rng.standard_normal((n, HEADS * HEAD_DIM)).astype(np.float32) * 2,
             "k": rng.standard_normal((KV_HEADS, n, HEAD_DIM)).astype(np.float32),
             "v": rng.standard_normal((KV_HEADS, n, HEAD_DIM)).astype(np.float32)} for n in LENGTHS]


def _step(seqs, chunks, **options) -> list[np.ndarray]:
    """One PagedAttention step over `chunks` (cached, new) of `seqs`; sequence i owns a contiguous
    run of blocks, its cached positions written as earlier steps would have."""
    per_seq = -(-max(LENGTHS) // BLOCK_SIZE)
    k_pool = np.zeros((per_seq * len(seqs), KV_HEADS, BLOCK_SIZE, HEAD_DIM), np.float32)
    v_pool = np.zeros_like(k_pool)
    tables = np.arange(per_seq * len(seqs), dtype=np.int32).reshape(len(seqs), per_seq)
    slots = []
    for i, ((cached, new), s) in enumerate(zip(chunks, seqs)):
        positions = np.arange(cached + new)
        blocks, offsets = tables[i, positions // BLOCK_SIZE], positions % BLOCK_SIZE
        k_pool[blocks[:cached], :, offsets[:cached]] = s["k"][:, :cached].transpose(1, 0, 2)
        v_pool[blocks[:cached], :, offsets[:cached]] = s["v"][:, :cached].transpose(1, 0, 2)
        slots += (blocks * BLOCK_SIZE + offsets)[cached:].tolist()
    q = np.concatenate([s["q"][c:c + n] for (c, n), s in zip(chunks, seqs)])[None]
    k_new = np.concatenate([s["k"][:, c:c + n] for (c, n), s in zip(chunks, seqs)], axis=1)[None]
    v_new = np.concatenate([s["v"][:, c:c + n] for (c, n), s in zip(chunks, seqs)], axis=1)[None]
    starts = np.concatenate([[0], np.cumsum([n for _, n in chunks])]).astype(np.int32)
    context_lens = np.array([c + n for c, n in chunks], np.int32)
    attrs = {"num_heads": HEADS, "kv_num_heads": KV_HEADS, "scale": SCALE, "layer": 0, **options}
    inputs = [q, k_new, v_new, k_pool, v_pool, np.array(slots, np.int64), tables[:len(chunks)], starts, context_lens]
    (y,) = kernel_for("infc", "PagedAttention")(inputs, attrs, KernelContext(17))
    return [y[0, starts[i]:starts[i + 1]] for i in range(len(chunks))]


def _reference(s, cached: int, new: int, softcap: float = 0.0, window: int = 0, alibi_slopes=None,
               sinks=None) -> np.ndarray:
    length, group = cached + new, HEADS // KV_HEADS
    q = s["q"][cached:length].reshape(new, HEADS, HEAD_DIM).astype(np.float64)
    k, v = (np.repeat(s[x][:, :length].astype(np.float64), group, axis=0) for x in ("k", "v"))
    scores = np.einsum("snh,nlh->nsl", q, k) * SCALE
    scores = softcap * np.tanh(scores / softcap) if softcap else scores
    keys, rows = np.arange(length)[None, :], np.arange(cached, length)[:, None]
    if alibi_slopes is not None:
        scores = scores + np.asarray(alibi_slopes)[:, None, None] * (keys - rows)[None]
    scores = np.where((keys <= rows) & ((keys > rows - window) if window else True), scores, -np.inf)
    if sinks is not None:  # the sink column joins the softmax, then leaves
        scores = np.concatenate([scores, np.broadcast_to(np.asarray(sinks)[:, None, None], (HEADS, new, 1))], -1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = probs / probs.sum(-1, keepdims=True)
    return np.einsum("nsl,nlh->snh", probs[..., :length], v).reshape(new, -1)


ALIBI = [0.5, 0.25, 0.125, 0.0625]  # transformers' slopes for 2 heads, twice: steep enough to matter
SINKS = [2.5, -1.0, 4.0, 0.5]  # about the scores' size: each takes a visible share of its rows


def _paths():
    return [pytest.param(True, id="compiled", marks=pytest.mark.skipif(not jit.enabled(), reason="numba is off")),
            pytest.param(False, id="numpy")]


def _run(compiled: bool, *args, **options):
    if compiled:
        return _step(*args, **options)
    with jit.disabled():
        return _step(*args, **options)


@pytest.mark.parametrize("compiled", _paths())
@pytest.mark.parametrize("options", [{"softcap": 2.0}, {"window": 6}, {"window": 5, "softcap": 2.0}, {"window": 1},
                                     {"alibi_slopes": ALIBI}, {"alibi_slopes": ALIBI, "window": 6},
                                     {"sinks": SINKS}, {"sinks": SINKS, "window": 6}],
                         ids=["softcap", "window", "both", "window_1", "alibi", "alibi_window", "sinks", "sinks_window"])
def test_options_match_dense_reference(compiled, options):
    seqs = _sequences()
    got, plain = _run(compiled, seqs, STEP, **options), _run(compiled, seqs, STEP)
    for (cached, new), s, y, y_plain in zip(STEP, seqs, got, plain):
        want = _reference(s, cached, new, **options)
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6, err_msg=f"{cached} cached, {new} new")
        if cached + new > options.get("window", 0) + 1:  # rows the option changes
            assert np.abs(y_plain - want).max() > 1e-2


# a window of 29 keeps sums long enough for the compiled kernel's vectorized loops, whose grouping
# would follow a task-dependent start
@pytest.mark.parametrize("options", [{"window": 7}, {"window": 29}, {"alibi_slopes": ALIBI}, {"sinks": SINKS}],
                         ids=["window_7", "window_29", "alibi", "sinks"])
@pytest.mark.parametrize("compiled", _paths())
def test_rows_do_not_depend_on_the_chunk_cut(compiled, options):
    seqs = _sequences(1)
    whole = _run(compiled, seqs, STEP, **options)[0]  # the 40-position prompt in one chunk
    for cut in (5, 17, 33, 38):  # the same prompt's rows from `cut` on, after a cached prefix
        tail = _run(compiled, seqs, [(cut, 40 - cut)] + STEP[1:], **options)[0]
        assert np.array_equal(tail, whole[cut:]), f"cut at {cut}"
