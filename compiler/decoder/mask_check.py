"""Proving that each attention's mask is causal, or causal within a sliding window, plus at most an
ALiBi position bias, before paging drops it.

The paged form keeps no mask: PagedAttention lets token q of a sequence see its keys 0..P+q, or with
a window W the last W of them, P+q-W < k <= P+q (Mistral, Gemma 2 and 3, Qwen2: transformers'
sliding_window), and adds slope[h] * (k - (P+q)) to head h's scores when it has ALiBi slopes (Bloom,
MPT). That is only the model's own attention when the graph's mask is exactly that for every past
length P the plan can hold, up to a constant per query row (which softmax ignores). Any other bias
would be lost silently, so the build runs the mask subgraph on a few (P, S) probes up to
max_model_len, reads each layer's window and slopes off them (the same in every probe where they
show) and refuses what is neither. An export without a KV cache is probed on whole sequences of
P + S tokens: causal attention over a sequence's own tokens is what paging computes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput, InfcError
from ..lower import lower_graph
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel
from .sites import Site, past_shape

MASKED = -1e30  # an additive entry at or below this absorbs any real score (as in the attention fusion)


PREFILL_PROBE = 64  # a window or bias shows in any prefill; the last decode step sees the longest reach


def probes(max_model_len: int, max_batched_tokens: int) -> list[tuple[int, int]]:
    """(past length, new tokens): a prefill, a chunk at the end, the last decode step (whose query sees
    all max_model_len keys: a sliding window shorter than that shows there)."""
    prefill = max(1, min(max_model_len, max_batched_tokens, PREFILL_PROBE))
    return sorted({(0, prefill), (max(0, max_model_len - 5), min(5, max_model_len)), (max_model_len - 1, 1)})


@dataclass
class MaskForm:
    window: int  # keys each query sees, 0 where no window shows within max_model_len
    slopes: tuple[float, ...] | None  # ALiBi: one per query head, None without


def check_causal_masks(graph: gs.Graph, sites: list[Site], steps: list[tuple[int, int]]) -> list[MaskForm]:
    """Each site's sliding window and ALiBi slopes, read on the (past, new tokens) `steps` (probes())."""
    for site in sites:
        if site.bias is None:
            raise BadInput(f"not a recognized decoder: attention '{site.node.name}' has no mask, so its prefill "
                           "is not causal")
    sub = graph.copy()
    tensors = sub.tensors()
    sub.outputs = list({s.bias.name: tensors[s.bias.name] for s in sites}.values())  # layers often share one
    sub.cleanup(remove_unused_graph_inputs=True).toposort()
    program = lower_graph(sub, has_kernel, allow_fallback=True)
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[t.name for t in sub.outputs])
    past = {t.name: s for s in sites for t in s.past}
    windows: dict[int, set[tuple[int, int]]] = {id(site): set() for site in sites}
    slopes: dict[int, list[np.ndarray | None]] = {id(site): [] for site in sites}
    if not past:  # an export without a KV cache sees each sequence whole: its mask over P + S tokens
        steps = sorted({(0, num_past + num_new) for num_past, num_new in steps})
    for num_past, num_new in steps:
        feeds = {t.name: probe_feed(t, num_past, num_new, past.get(t.name)) for t in sub.inputs}
        outputs = _run_probe(executor, feeds, num_past, num_new, max(p + n for p, n in steps))
        for site in sites:
            bias = np.asarray(outputs[site.bias.name])
            site_slopes, bias = alibi_slopes(bias, num_past, num_new, site.num_heads)
            window, reason = _window_of(bias, num_past, num_new)
            if reason:
                raise BadInput(f"not a recognized decoder: attention '{site.node.name}': with {num_past} past and "
                               f"{num_new} new tokens its mask {reason}; paged attention is causal, within a "
                               "sliding window or not, with an ALiBi bias or not (another bias?)")
            windows[id(site)].add((window, num_past + num_new))
            slopes[id(site)].append(site_slopes)
    return [MaskForm(_one_window(site, windows[id(site)]), _one_slopes(site, slopes[id(site)])) for site in sites]


class PastModelPositions(BadInput):
    """The profile's max_model_len reaches positions the model has no table rows for."""


def _run_probe(executor: Executor, feeds: dict, num_past: int, num_new: int, max_model_len: int) -> dict:
    """A probe reaches position max_model_len - 1: a model whose tables of positions are shorter
    (learned position embeddings, a mask buffer) fails there with an index out of range, which is
    the profile's max_model_len asking too much, not an internal error."""
    try:
        return executor.run(feeds)
    except InfcError as exc:
        if not isinstance(exc.__cause__, IndexError):
            raise
        raise PastModelPositions(f"decode.max_model_len {max_model_len} is past what the model supports: with "
                       f"{num_past} past and {num_new} new tokens (positions up to {num_past + num_new - 1}), {exc}; "
                       "lower max_model_len to the model's maximum positions") from None


SLOPE_RTOL = 1e-5  # float32 products of a slope and a position, fitted back


def _one_slopes(site: Site, seen: list[np.ndarray | None]) -> tuple[float, ...] | None:
    """The slopes every probe agrees on (the last probe's: its rows are the longest)."""
    found = [s for s in seen if s is not None]
    if not found:
        return None
    if len(found) != len(seen) or any(not np.allclose(s, found[-1], rtol=SLOPE_RTOL, atol=1e-7) for s in found):
        raise BadInput(f"not a recognized decoder: attention '{site.node.name}': its ALiBi slopes change with the "
                       "past length")
    return tuple(float(np.float32(s)) for s in found[-1])


def alibi_slopes(bias: np.ndarray, num_past: int, num_new: int, num_heads: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(slopes, bias without them) when every visible entry of head h's query row at position p is
    slopes[h] * (k - p) plus a constant of the row (ALiBi: Bloom adds slope * k, MPT slope * (k - T + 1)),
    else (None, bias). Visible: above MASKED; slopes are fitted by least squares and every entry must
    lie on the fit within float32 rounding of the largest entry."""
    total = num_past + num_new
    if bias.dtype == np.bool_ or bias.ndim != 4 or bias.shape[1] not in (1, num_heads):
        return None, bias
    try:
        bias = np.broadcast_to(bias, bias.shape[:-2] + (num_new, total))
    except ValueError:
        return None, bias  # _window_of names the shape
    seen = bias > MASKED
    values = np.where(seen, bias, 0.0).astype(np.float64)
    if not values.any():
        return None, bias
    weight = seen.astype(np.float64)
    offset = np.arange(total)[None, :] - (num_past + np.arange(num_new))[:, None]  # k - p
    count = np.maximum(weight.sum(-1, keepdims=True), 1)
    k_mean, v_mean = (weight * offset).sum(-1, keepdims=True) / count, values.sum(-1, keepdims=True) / count
    k_dev, v_dev = (offset - k_mean) * weight, (values - v_mean) * weight
    spread = (k_dev * k_dev).sum((-1, -2))  # per (batch, head)
    if (spread == 0).any():
        return None, bias  # rows of one key each: no slope shows
    slope = (k_dev * v_dev).sum((-1, -2)) / spread
    residual = np.abs(v_dev - slope[..., None, None] * k_dev) * weight
    if residual.max() > 1e-6 * (1.0 + np.abs(values).max()) or not np.allclose(slope, slope[:1], rtol=0, atol=0):
        return None, bias  # not linear in the key position (or not the same in every batch row)
    without = np.where(seen, 0.0, bias).astype(bias.dtype)  # a constant per row is softmax's to ignore
    return (np.broadcast_to(slope[0], (num_heads,)).copy() if slope.any() else None), without


def _one_window(site: Site, seen: set[tuple[int, int]]) -> int:
    """The window every probe agrees on, from (window, keys of its longest row) per probe: a probe
    that no window cut (0) must be one the window does not reach."""
    limited = {w for w, _ in seen if w}
    reach = max((total for w, total in seen if not w), default=0)
    if len(limited) > 1 or limited and reach > min(limited):
        raise BadInput(f"not a recognized decoder: attention '{site.node.name}': its mask's sliding window changes "
                       f"with the past length ({sorted(limited)} keys, none over {reach})")
    return limited.pop() if limited else 0


def probe_feed(t: gs.Tensor, num_past: int, num_new: int, site: Site | None = None, reader: str = "the attention mask"
               ) -> np.ndarray:
    """A probe's value of graph input `t`: a step of `num_new` tokens after `num_past` cached ones
    (`site`: its zero past K/V)."""
    dtype = np.dtype(t.dtype or np.int64)
    if site is not None:
        return np.zeros(past_shape(t, site, num_past), dtype)
    if t.name == "input_ids":
        return np.zeros((1, num_new), dtype)
    if t.name == "position_ids":
        return np.arange(num_past, num_past + num_new, dtype=dtype)[None]
    if t.name == "cache_position":
        return np.arange(num_past, num_past + num_new, dtype=dtype)
    if t.name == "attention_mask":
        return np.ones((1, num_past + num_new), dtype)
    if t.name == "token_type_ids":  # dynamo reads dims off it
        return np.zeros((1, num_new), dtype)
    raise BadInput(f"not a recognized decoder: {reader} reads input '{t.name}'")


def _window_of(bias: np.ndarray, num_past: int, num_new: int) -> tuple[int, str | None]:
    """(W, None) when the bias (or boolean mask) is causal within a window of W keys: 0 (True) where
    num_past + q - W < k <= num_past + q, else <= MASKED (False); W = 0 when no query row is cut short.
    (0, reason) otherwise."""
    total = num_past + num_new
    try:
        bias = np.broadcast_to(bias, bias.shape[:-2] + (num_new, total))
    except ValueError:
        return 0, f"has shape {list(bias.shape)}, not (.., {num_new}, {total})"
    keys, last = np.arange(total)[None, :], num_past + np.arange(num_new)[:, None]  # each row's own position
    allowed = bias if bias.dtype == np.bool_ else bias == 0
    masked = ~bias if bias.dtype == np.bool_ else bias <= MASKED
    if (allowed & (keys > last)).any():
        return 0, "lets a query see keys after it"
    if not (allowed | masked).all():
        return 0, "hides or biases keys that causal attention sees"
    seen = allowed.sum(axis=-1)  # keys each row sees, and how many causal attention would
    cut = seen < last[:, 0] + 1
    window = int(seen[cut].min()) if cut.any() else 0
    if window == 0 and cut.any() or cut.any() and not (allowed == (keys > last - window) & (keys <= last)).all():
        return 0, "hides or biases keys that causal attention sees"
    return window, None
