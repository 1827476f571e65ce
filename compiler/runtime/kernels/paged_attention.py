"""`infc.PagedAttention`: attention over the paged KV cache.

PagedAttention inputs: q [1, T, N*H], k_new and v_new [1, kvN, T, H], the layer's K and V pools
[num_blocks, kvN, block_size, H] (written in place: the one kernel that writes into its inputs, the
pools belong to the model runner), slot_mapping [T], block_tables [num_seqs, max_blocks],
query_start_loc [num_seqs + 1], context_lens [num_seqs] (tokens in the cache after this step).
Each sequence's query rows attend causally to its cached context and its own new tokens. Attributes:
num_heads, kv_num_heads, scale, layer, softcap (> 0: scores become softcap * tanh(scores / softcap)
after scaling, as Gemma 2's attention and the ONNX Attention op's softcap), window (> 0: a sliding
window, the query at position p sees keys p - window < k <= p, as transformers' sliding_window) and
alibi_slopes (one per query head: head h's score of key k from the query at position p gains
slope[h] * (k - p), after the soft-cap; Bloom, MPT) and sinks (one logit per query head that joins
each row's softmax denominator as exp(sink) and adds no value term; gpt-oss). Work is
per sequence and in float64, so a row's result does not depend on what else is in the batch.
Float32 plans take a compiled path that reads the pools in place (jit_paged_attention.py); the
NumPy path below gathers the blocks and serves the rest and `jit.disabled()`.
"""

from __future__ import annotations

import numpy as np

from .jit_paged_attention import attend, write_pools


def _write_kv(pool: np.ndarray, new_BNTH: np.ndarray, slots: np.ndarray) -> None:
    block_size = pool.shape[2]
    pool[slots // block_size, :, slots % block_size, :] = new_BNTH[0].transpose(1, 0, 2)


def _gather_kv(pool, table: np.ndarray, length: int, xp=np, compute=np.float64):
    """[..., blocks] table -> [..., kvN, length, H] in `compute` (pool and result on xp's side)."""
    blocks = pool[xp.asarray(table)]  # [..., nb, kvN, bs, H]
    lead = blocks.shape[:-4]
    nb, kv_heads, block_size, head_dim = blocks.shape[-4:]
    moved = xp.moveaxis(blocks, -4, -3).astype(compute, order="C")  # one copy into [..., kvN, nb, bs, H]
    return moved.reshape(*lead, kv_heads, nb * block_size, head_dim)[..., :length, :]


def _attend(q, k, v, allowed, scale: float, softcap: float, bias=None, xp=np, sinks=None):
    """q [..., kvN, G*S, H], k/v [..., kvN, L, H] in one float type, allowed, bias and sinks ([..., kvN, G*S, 1])
    broadcastable to the scores."""
    # k gathered from the pool is non-contiguous; transposed as is, matmul misses BLAS (50x slower)
    scores = xp.matmul(q, xp.ascontiguousarray(xp.swapaxes(k, -1, -2)))
    scores *= scale
    if softcap > 0:
        scores = softcap * xp.tanh(scores / softcap)
    if bias is not None:
        scores += xp.asarray(bias)
    scores = xp.where(xp.asarray(allowed), scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    if sinks is not None:  # the sink's column: in the peak and the denominator, without a value
        peak = xp.maximum(peak, sinks)
    scores -= peak
    xp.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    scores /= total if sinks is None else total + xp.exp(sinks - peak)
    return xp.matmul(scores, v)


def paged_attention(inputs, attrs, ctx):
    q, k_new, v_new, k_pool, v_pool, slots, tables, starts, context_lens = inputs
    heads, kv_heads, scale = attrs["num_heads"], attrs["kv_num_heads"], attrs["scale"]
    softcap, window = float(attrs.get("softcap", 0.0)), int(attrs.get("window", 0))
    slopes = np.asarray(attrs.get("alibi_slopes", ()), np.float32)
    sinks = np.asarray(attrs.get("sinks", ()), np.float32)
    if not write_pools(k_pool, v_pool, k_new, v_new, slots):
        _write_kv(k_pool, k_new, slots)
        _write_kv(v_pool, v_new, slots)
    # float32 plans: one compiled pass over the pools (jit_paged_attention.py) when numba is there
    out = attend(q, k_pool, v_pool, tables, starts, context_lens, heads, scale, softcap, window, slopes, sinks) \
        if k_pool.shape[1] == kv_heads else None
    if out is None:
        out = _attend_numpy(q, k_pool, v_pool, tables, starts, context_lens, heads, kv_heads, scale, softcap, window,
                            slopes, sinks=sinks)
    return [out.reshape(q.shape)]


def _attend_numpy(q, k_pool, v_pool, tables, starts, context_lens, heads: int, kv_heads: int, scale: float,
                  softcap: float = 0.0, window: int = 0, slopes: np.ndarray | None = None, xp=np,
                  compute=np.float64, sinks: np.ndarray | None = None):
    """[T, N * H] float32: each sequence's rows over its gathered context in `compute`. The step's
    metadata (tables, starts, context_lens) are host arrays and every decision is taken on the host;
    q and the pools live on xp's side (a device for runtime/cuda/ops_paged.py), where masks and row
    indexes are sent as they are needed."""
    head_dim, group = k_pool.shape[-1], heads // kv_heads
    # ALiBi slopes by (KV head, query head of its group), in float32 as the compiled path adds them
    head_slopes = np.asarray(slopes, np.float32).reshape(kv_heads, group) if slopes is not None and len(slopes) else None
    head_sinks = np.asarray(sinks, compute).reshape(kv_heads, group, 1) if sinks is not None and len(sinks) else None
    q_TNH = q.reshape(-1, heads, head_dim).astype(compute)
    out = xp.empty((q_TNH.shape[0], heads * head_dim), np.float32)
    num_new = np.diff(starts)
    block_size = k_pool.shape[2]
    decode = np.flatnonzero(num_new == 1)
    if decode.size:  # one query row each: all together, each row masked to its own context
        length = int(context_lens[decode].max())
        table = tables[decode, :-(-length // block_size)]
        k, v = (_gather_kv(pool, table, length, xp, compute) for pool in (k_pool, v_pool))
        rows = xp.asarray(starts[decode])
        q_d = q_TNH[rows].reshape(len(decode), kv_heads, group, head_dim)
        keys, ends = np.arange(length), context_lens[decode, None]
        allowed = ((keys < ends) & ((keys >= ends - window) if window else True))[:, None, None, :]
        # slots past a row's context hold other sequences' values (maybe inf): a zero weight times
        # inf would still poison the row, so they are zeroed, not only masked
        v = xp.where(xp.asarray(allowed.reshape(len(decode), 1, length, 1)), v, 0.0)
        bias = None if head_slopes is None else \
            head_slopes[None, :, :, None] * (keys - (ends - 1)).astype(np.float32)[:, None, None, :]
        y = _attend(q_d, k, v, allowed, scale, softcap, bias, xp, None if head_sinks is None else xp.asarray(head_sinks))
        out[rows] = y.reshape(len(decode), heads * head_dim)
    for seq in np.flatnonzero(num_new > 1):
        begin, count, length = int(starts[seq]), int(num_new[seq]), int(context_lens[seq])
        table = tables[seq, :-(-length // block_size)]
        k, v = (_gather_kv(pool, table, length, xp, compute) for pool in (k_pool, v_pool))
        q_s = q_TNH[begin:begin + count].reshape(count, kv_heads, group, head_dim).transpose(1, 2, 0, 3)
        positions = np.arange(length - count, length)
        keys = np.arange(length)[None, :]
        allowed = (keys <= positions[:, None]) & ((keys > positions[:, None] - window) if window else True)  # [S, L]
        bias = None if head_slopes is None else (head_slopes[:, :, None, None] * (
            keys - positions[:, None]).astype(np.float32)[None, None]).reshape(kv_heads, group * count, length)
        row_sinks = None if head_sinks is None else xp.asarray(np.repeat(head_sinks, count, axis=1))  # [kvN, G*S, 1]
        y = _attend(q_s.reshape(kv_heads, group * count, head_dim), k, v, np.tile(allowed, (group, 1)), scale, softcap,
                    bias, xp, row_sinks)
        out[begin:begin + count] = y.reshape(kv_heads, group, count, head_dim).transpose(2, 0, 1, 3).reshape(count, -1)
    return out


KERNELS = {
    ("infc", "PagedAttention"): paged_attention,
}
