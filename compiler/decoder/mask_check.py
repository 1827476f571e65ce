"""Proving that each attention's mask is the plain causal one before paging drops it.

The paged form keeps no mask: PagedAttention lets token q of a sequence see its keys 0..P+q. That is
only the model's own attention when the graph's mask is exactly causal for every past length P the
plan can hold. A sliding window shorter than decode.max_model_len, ALiBi or any other bias would be
lost silently, so the build runs the mask subgraph on a few (P, S) probes up to max_model_len and
refuses what differs."""

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


def check_causal_masks(graph: gs.Graph, sites: list[Site], max_model_len: int, max_batched_tokens: int) -> None:
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
    for num_past, num_new in probes(max_model_len, max_batched_tokens):
        feeds = {t.name: _feed(t, num_past, num_new, past.get(t.name)) for t in sub.inputs}
        outputs = executor.run(feeds)
        for site in sites:
            reason = _not_causal(np.asarray(outputs[site.bias.name]), num_past, num_new)
            if reason:
                raise BadInput(f"not a recognized decoder: attention '{site.node.name}': with {num_past} past and "
                               f"{num_new} new tokens its mask {reason}; paged attention is plain causal (a sliding "
                               "window shorter than decode.max_model_len, ALiBi or another bias?)")


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


def _not_causal(bias: np.ndarray, num_past: int, num_new: int) -> str | None:
    """None when the bias (or boolean mask) is causal: 0 (True) where key k <= num_past + q, else
    <= MASKED (False)."""
    total = num_past + num_new
    try:
        bias = np.broadcast_to(bias, bias.shape[:-2] + (num_new, total))
    except ValueError:
        return f"has shape {list(bias.shape)}, not (.., {num_new}, {total})"
    allowed = np.arange(total)[None, :] <= num_past + np.arange(num_new)[:, None]
    if bias.dtype == np.bool_:
        ok_allowed, ok_masked = bias[..., allowed].all(), not bias[..., ~allowed].any()
    else:
        ok_allowed, ok_masked = (bias[..., allowed] == 0).all(), (bias[..., ~allowed] <= MASKED).all()
    if not ok_allowed:
        return "hides or biases keys that causal attention sees"
    return None if ok_masked else "lets a query see keys after it"
