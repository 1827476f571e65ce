"""Proving that each attention's mask is causal, or causal within a sliding window, before paging
drops it.

The paged form keeps no mask: PagedAttention lets token q of a sequence see its keys 0..P+q, or with
a window W the last W of them, P+q-W < k <= P+q (Mistral, Gemma 2 and 3, Qwen2: transformers'
sliding_window). That is only the model's own attention when the graph's mask is exactly that for
every past length P the plan can hold. ALiBi or any other bias would be lost silently, so the build
runs the mask subgraph on a few (P, S) probes up to max_model_len, reads each layer's window off
them (the same in every probe where it shows) and refuses what is neither."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from ..lower import lower_graph
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel
from .sites import Site

MASKED = -1e30  # an additive entry at or below this absorbs any real score (as in the attention fusion)


PREFILL_PROBE = 64  # a window or bias shows in any prefill; the last decode step sees the longest reach


def probes(max_model_len: int, max_batched_tokens: int) -> list[tuple[int, int]]:
    """(past length, new tokens): a prefill, a chunk at the end, the last decode step (whose query sees
    all max_model_len keys: a sliding window shorter than that shows there)."""
    prefill = max(1, min(max_model_len, max_batched_tokens, PREFILL_PROBE))
    return sorted({(0, prefill), (max(0, max_model_len - 5), min(5, max_model_len)), (max_model_len - 1, 1)})


def check_causal_masks(graph: gs.Graph, sites: list[Site], max_model_len: int, max_batched_tokens: int) -> list[int]:
    """Each site's sliding window in keys, 0 where none shows within max_model_len."""
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
    for num_past, num_new in probes(max_model_len, max_batched_tokens):
        feeds = {t.name: _feed(t, num_past, num_new, past.get(t.name)) for t in sub.inputs}
        outputs = executor.run(feeds)
        for site in sites:
            window, reason = _window_of(np.asarray(outputs[site.bias.name]), num_past, num_new)
            if reason:
                raise BadInput(f"not a recognized decoder: attention '{site.node.name}': with {num_past} past and "
                               f"{num_new} new tokens its mask {reason}; paged attention is causal, within a "
                               "sliding window or not (ALiBi or another bias?)")
            windows[id(site)].add((window, num_past + num_new))
    return [_one_window(site, windows[id(site)]) for site in sites]


def _one_window(site: Site, seen: set[tuple[int, int]]) -> int:
    """The window every probe agrees on, from (window, keys of its longest row) per probe: a probe
    that no window cut (0) must be one the window does not reach."""
    limited = {w for w, _ in seen if w}
    reach = max((total for w, total in seen if not w), default=0)
    if len(limited) > 1 or limited and reach > min(limited):
        raise BadInput(f"not a recognized decoder: attention '{site.node.name}': its mask's sliding window changes "
                       f"with the past length ({sorted(limited)} keys, none over {reach})")
    return limited.pop() if limited else 0


def _feed(t: gs.Tensor, num_past: int, num_new: int, site: Site | None) -> np.ndarray:
    dtype = np.dtype(t.dtype or np.int64)
    if site is not None:
        return np.zeros((1, site.kv_num_heads, num_past, site.head_dim), dtype)
    if t.name == "input_ids":
        return np.zeros((1, num_new), dtype)
    if t.name == "position_ids":
        return np.arange(num_past, num_past + num_new, dtype=dtype)[None]
    if t.name == "attention_mask":
        return np.ones((1, num_past + num_new), dtype)
    raise BadInput(f"not a recognized decoder: the attention mask reads input '{t.name}'")


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
