"""Multi-head latent attention (DeepSeek V2/V3, MiniCPM3, Kimi): the export caches each token's latent,
and the attention's keys and values are computed from the whole concatenated cache.

    past latent ─► Concat(axis 2) ◄─ new latent            ==>    new latent ─► f' ─► k_new, v_new
                      ├─► present                                    (B, N, S, Hk) and (B, N, S, Hv)
                      └─► f (kv_b_proj, split, expand, copy into slices) ─► K, V ─► Attention

The paged KV cache holds keys and values, so each such attention gets f cloned onto the new tokens'
latents alone (f', by canonicalize.py: until then the graph runs as exported, masks probed on it),
as an export without a KV cache would compute them; the pools then hold the
expanded keys and values (more memory than the latents: the price of paging them as they are).
That is exact only when f computes each position from that position alone, which the build proves
on a probe: f on L random positions and on the last S of them alone must agree. The past latent
inputs and the Concats' present outputs leave as any export's do (canonicalize.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from ..lower import lower_graph
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel

MAX_CLOSURE_NODES = 600  # f is a few dozen nodes per layer; a walk past this is not f
# f may read dims off graph inputs (dynamo: the batch size off input_ids): f' reads them as they are
# (any sequence length they give is the new tokens', f''s own); a read of a past latent input's dims
# becomes, in f', the dims of an empty past (f' sees no cached positions)
SHAPE_READS = {"Shape", "Size"}
PROBE_LENGTHS = (7, 3)  # f on 7 positions, then on the last 3 alone
PROBE_RTOL = 1e-5  # a GEMM over 3 rows may round apart from one over 7


@dataclass
class LatentCache:
    nodes: list[gs.Node]  # f: from the Concats' outputs (and constants) to the attention's K and V
    concats: list[gs.Node]  # Concat(past latent input, new latent)

    @property
    def past(self) -> tuple[gs.Tensor, ...]:
        return tuple(c.inputs[0] for c in self.concats)

    @property
    def present(self) -> tuple[gs.Tensor, ...]:
        return tuple(c.outputs[0] for c in self.concats)


def _is_cache_concat(node: gs.Node, graph_inputs: set[int]) -> bool:
    return (node.op == "Concat" and len(node.inputs) == 2 and id(node.inputs[0]) in graph_inputs
            and node.attrs.get("axis") in (2, -2))


def _closure(roots: list[gs.Tensor], graph_inputs: set[int]) -> tuple[list[gs.Node], list[gs.Node], str | None]:
    """(nodes computing `roots` from cache Concats and constants, those Concats, reason when not so)."""
    nodes, concats, seen, stack = [], [], set(), list(roots)
    while stack:
        t = stack.pop()
        if isinstance(t, gs.Constant) or t.is_empty():
            continue
        if not t.inputs:
            return [], [], f"keys/values read input '{t.name}' other than through a past-KV Concat"
        node = t.inputs[0]
        if id(node) in seen:
            continue
        seen.add(id(node))
        if _is_cache_concat(node, graph_inputs):
            concats.append(node)
            continue
        nodes.append(node)
        if node.op in SHAPE_READS and id(node.inputs[0]) in graph_inputs:
            continue  # dims of a step input: cloned as they are (past latents': clone_onto_new_tokens)
        if len(nodes) > MAX_CLOSURE_NODES:
            return [], [], "keys/values are computed from more than the past-KV Concats"
        stack.extend(node.inputs)
    return nodes, concats, None


def clone_onto_new_tokens(graph: gs.Graph, latent: LatentCache, roots: list[gs.Tensor]) -> list[gs.Tensor]:
    """f's nodes again, added to `graph`, reading each Concat's new-token input instead of its output:
    `roots` (the attention's K and V) computed from the new tokens alone, as (B, N, S, H)."""
    graph.toposort()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    mapped = {id(c.outputs[0]): c.inputs[1] for c in latent.concats}
    past = {id(t) for t in latent.past}
    for node in sorted(latent.nodes, key=lambda n: order[id(n)]):
        if node.op in SHAPE_READS and id(node.inputs[0]) in past:
            mapped[id(node.outputs[0])] = gs.Constant(f"{node.outputs[0].name}/new_tokens", _empty_past_dims(node))
            continue
        outputs = [gs.Variable(f"{o.name}/new_tokens", o.dtype, None) for o in node.outputs]
        for old, new in zip(node.outputs, outputs):
            mapped[id(old)] = new
        graph.nodes.append(gs.Node(node.op, f"{node.name}/new_tokens", dict(node.attrs),
                                   [mapped.get(id(i), i) for i in node.inputs], outputs, domain=node.domain))
    new_kv = [mapped[id(r)] for r in roots]
    for old, new in zip(roots, new_kv):
        new.shape = [old.shape[0], old.shape[1], "sequence_length", old.shape[3]] if old.shape is not None else None
    return new_kv


def _empty_past_dims(node: gs.Node) -> np.ndarray:
    """Shape (or Size) of a past latent input [1, heads, 0, width]: the batch of a paged step is 1."""
    shape = list(node.inputs[0].shape)
    dims = np.array([1, int(shape[1]), 0, int(shape[3])], np.int64)
    if node.op == "Size":
        return np.array(0, np.int64)
    return dims[slice(node.attrs.get("start", 0), node.attrs.get("end", 4))]


def _is_per_position(graph: gs.Graph, latents: list[gs.Tensor], keys_values: list[gs.Tensor]) -> bool:
    """f' on PROBE_LENGTHS[0] random positions, then on the last PROBE_LENGTHS[1] alone: the same rows."""
    from .mask_check import probe_feed  # noqa: PLC0415 - mask_check imports sites, which imports this module

    sub = graph.copy()
    tensors = sub.tensors()
    shape_sources = list(sub.inputs)  # what SHAPE_READS may read: the step's inputs, as for L new tokens
    sub.inputs = [tensors[t.name] for t in latents]
    for t in sub.inputs:
        t.inputs.clear()
    sub.inputs += [t for t in shape_sources if t.name not in {x.name for x in latents}]
    sub.outputs = [tensors[t.name] for t in keys_values]
    sub.cleanup(remove_unused_graph_inputs=True).toposort()
    program = lower_graph(sub, has_kernel, allow_fallback=True)
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[t.name for t in sub.outputs])
    rng = np.random.default_rng(0)
    names = {t.name for t in latents}

    def feeds(length: int, values: dict) -> dict:
        return {t.name: values[t.name][:, :, -length:] if t.name in names else
                np.zeros([1, int(t.shape[1]), 0, int(t.shape[3])], np.float32) if t.name.startswith("past") else
                probe_feed(t, 0, length, reader="the keys' and values' shape arithmetic") for t in sub.inputs}

    whole = {t.name: rng.standard_normal((1, int(t.shape[1]), PROBE_LENGTHS[0], int(t.shape[3]))).astype(np.float32)
             for t in latents}
    got_whole, got_tail = executor.run(feeds(PROBE_LENGTHS[0], whole)), executor.run(feeds(PROBE_LENGTHS[1], whole))
    for t in sub.outputs:
        a, b = np.asarray(got_whole[t.name])[:, :, -PROBE_LENGTHS[1]:], np.asarray(got_tail[t.name])
        if a.shape != b.shape or not np.allclose(a, b, rtol=PROBE_RTOL, atol=PROBE_RTOL * (np.abs(a).max() + 1e-30)):
            return False
    return True


def _static_4d(t: gs.Tensor) -> bool:
    shape = t.shape
    return shape is not None and len(shape) == 4 and all(isinstance(d, (int, np.integer)) and d > 0 for d in (shape[1], shape[3]))


def find_latent_caches(graph: gs.Graph, attention_nodes: list[gs.Node], is_paged_kv) -> dict[int, LatentCache]:
    """Each attention whose K/V are not the past-KV Concats as sites.py reads them (`is_paged_kv`
    says) but computed from them, each position alone (proven): by id of the attention node."""
    graph_inputs = {id(t) for t in graph.inputs}
    found = {}
    for node in attention_nodes:
        roots = [node.inputs[1], node.inputs[2]]
        if is_paged_kv(node):
            continue
        nodes, concats, reason = _closure(roots, graph_inputs)
        if reason or not concats or not nodes:
            continue  # sites.py names what it finds
        latents = [c.inputs[1] for c in concats]
        if not all(_static_4d(t) for t in latents):
            raise BadInput(f"not a recognized decoder: attention '{node.name}': its keys/values are computed from "
                           "cached tensors of unknown head count or width")
        latent = LatentCache(nodes, concats)
        clones = len(graph.nodes)
        new_kv = clone_onto_new_tokens(graph, latent, roots)
        is_local = _is_per_position(graph, latents, new_kv)
        for clone in graph.nodes[clones:]:  # canonicalize.py clones f again where it pages the attention
            clone.inputs.clear()  # unlinked, so no tensor lists it as a consumer
            clone.outputs.clear()
        del graph.nodes[clones:]
        if not is_local:
            raise BadInput(f"not a recognized decoder: attention '{node.name}': its keys/values are computed from "
                           "the whole cached sequence, not from each cached position alone, so the KV cache cannot "
                           "page them")
        found[id(node)] = latent
    return found
