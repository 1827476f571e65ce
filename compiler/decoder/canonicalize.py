"""Rewriting a decoder into its paged form: one flat batch of tokens, KV cache in the block pool.

    before:  q, Concat(past_k, k_new), Concat(past_v, v_new) ─► attention(.., mask) ─► y
    after:   q, k_new, v_new, kv pools, step metadata ─► infc.PagedAttention ─► y

The graph runs with batch 1 and sequence = every scheduled token: input_ids and position_ids are
[1, T]. Past inputs and present outputs leave, the mask subgraph dies with the attention bias, and
the LM head reads only the rows named by `infc.logits_indices` when its input is a plain [.., T, D].
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import BadInput
from ..graph import NameGen
from .past_length import LengthRead, check_past_length
from .latent_kv import clone_onto_new_tokens
from .sites import Site, past_shape

DOMAIN = "infc"
SLOT_MAPPING, BLOCK_TABLES = "infc.slot_mapping", "infc.block_tables"
QUERY_START_LOC, CONTEXT_LENS, LOGITS_INDICES = "infc.query_start_loc", "infc.context_lens", "infc.logits_indices"
# What the runner feeds besides infc.*: token ids, each token's position ([1, T], and [T] as the
# cache_position newer transformers exports take), an all-ones mask for graphs that still read the
# mask's shape (its values no longer matter once attention is paged), and token type 0 (the segment
# generation runs in, as transformers.js and Optimum's ORTModelForCausalLM feed it).
TOKEN_INPUTS = ("input_ids", "position_ids", "cache_position", "attention_mask", "token_type_ids")
POSITION_INPUTS = ("position_ids", "cache_position")
GEMM_OPS = {"MatMul", "Gemm", "FusedMatMul"}


def pool_name(layer: int, which: str) -> str:
    return f"infc.kv.{layer}.{which}"


def canonicalize(graph: gs.Graph, sites: list[Site], block_size: int, logits_name: str,
                 probes: list[tuple[int, int]]) -> dict:
    """Rewrites `graph` in place; returns what the plan records about it (input roles, logits).
    `probes`: (past, new tokens) pairs on which reads of the past length are checked."""
    names = NameGen(graph)
    meta_inputs = [gs.Variable(SLOT_MAPPING, np.int64, ["num_tokens"]),
                   gs.Variable(BLOCK_TABLES, np.int32, ["num_seqs", "max_blocks"]),
                   gs.Variable(QUERY_START_LOC, np.int32, ["num_seqs_plus_1"]),
                   gs.Variable(CONTEXT_LENS, np.int32, ["num_seqs"])]
    pools, past, present = [], set(), set()
    pool_dim = max(site.head_dim for site in sites)  # one head size in every layer's pools (_replace pads)
    for layer, site in enumerate(sites):
        layer_pools = [gs.Variable(pool_name(layer, w), np.float32, ["num_blocks", site.kv_num_heads, block_size, pool_dim])
                       for w in ("key", "value")]
        pools += layer_pools
        past.update(id(t) for t in site.past)
        present.update(id(t) for t in site.present)
        _replace(graph, site, layer, layer_pools + meta_inputs, names, pool_dim)
    graph.outputs = [t for t in graph.outputs if id(t) not in present]
    graph.cleanup(remove_unused_graph_inputs=False)
    past_lengths = _drop_past_reads(graph, past, sites[0])
    graph.inputs = [t for t in graph.inputs if id(t) not in past] + meta_inputs + pools
    gathers_logits = _gather_logits(graph, logits_name, names)
    graph.cleanup(remove_unused_graph_inputs=True).toposort()
    check_past_length(graph, past_lengths, probes)  # replaced by 0: must not matter where still read
    reads_past_shape = bool(past_lengths)
    inputs = [t.name for t in graph.inputs]
    unknown = [name for name in inputs if name not in TOKEN_INPUTS and not name.startswith("infc.")]
    # Positions derived from the mask or the past length would be wrong on a flat batch of sequences.
    derives_positions = not set(POSITION_INPUTS) & set(inputs) and ("attention_mask" in inputs or reads_past_shape)
    if unknown or "input_ids" not in inputs or derives_positions:
        raise BadInput("not a recognized decoder: after paging attention the graph takes "
                       f"{', '.join(n for n in inputs if not n.startswith('infc.'))}"
                       f"{' and reads the past KV shape' if reads_past_shape else ''}; it needs input_ids, and "
                       "position_ids (or cache_position) wherever it reads the attention mask or the past length")
    return {"gathers_logits": gathers_logits, "inputs": inputs}


def _pad_last(graph: gs.Graph, names: NameGen, t: gs.Tensor, rank: int, width: int) -> gs.Tensor:
    """`t` with `width` zeros appended to its last axis (none: `t`)."""
    return t if width <= 0 else _node(graph, names, "Pad", [t, _const(names, [0] * (2 * rank - 1) + [width])])


def _replace(graph: gs.Graph, site: Site, layer: int, extra: list[gs.Tensor], names: NameGen, pool_dim: int) -> None:
    """extra: the layer's K and V pools, then the step metadata inputs. The pools hold heads of
    `pool_dim` (the widest layer's keys): narrower queries and keys are padded with zeros (their
    scores stay the same: the scale is the layer's own), narrower values too, and the context is
    sliced back to the layer's value heads (DeepSeek's MLA; Gemma 4's sliding layers)."""
    node, y = site.node, site.node.outputs[0]
    n, h, hv = site.num_heads, site.head_dim, site.value_dim or site.head_dim
    is_padded = hv < pool_dim or h < pool_dim
    q = site.q
    if site.q_is_4d:  # ONNX Attention with q as (B, N, S, H): PagedAttention takes (B, S, N*H)
        q = _node(graph, names, "Transpose", [q], perm=[0, 2, 1, 3])
    elif h < pool_dim:
        q = _node(graph, names, "Reshape", [q, _const(names, [0, 0, n, h])])
    if site.q_is_4d or h < pool_dim:
        q = _node(graph, names, "Reshape", [_pad_last(graph, names, q, 4, pool_dim - h), _const(names, [0, 0, n * pool_dim])])
    k_new, v_new = site.k_new, site.v_new
    if site.latent is not None:  # MLA: the keys and values of the new tokens alone (latent_kv.py)
        k_new, v_new = clone_onto_new_tokens(graph, site.latent, [site.k_new, site.v_new])
    k_new, v_new = _pad_last(graph, names, k_new, 4, pool_dim - h), _pad_last(graph, names, v_new, 4, pool_dim - hv)
    out = gs.Variable(names("paged_attention"), np.float32, None) if site.q_is_4d or is_padded else y
    node.outputs = []
    node.inputs = []
    graph.nodes.append(gs.Node("PagedAttention", names(f"paged_attention_{layer}"), domain=DOMAIN,
                               attrs={"num_heads": n, "kv_num_heads": site.kv_num_heads, "scale": site.scale, "layer": layer,
                                      **({"softcap": site.softcap} if site.softcap else {}),
                                      **({"window": site.window} if site.window else {}),
                                      **({"alibi_slopes": list(site.alibi_slopes)} if site.alibi_slopes else {}),
                                      **({"sinks": list(site.sinks)} if site.sinks else {})},
                               inputs=[q, k_new, v_new, *extra], outputs=[out]))
    if site.q_is_4d or is_padded:  # (1, T, N*P) -> (1, T, N, P) [-> the first hv of each head]
        out = _node(graph, names, "Reshape", [out, _const(names, [0, 0, n, pool_dim])])
    if hv < pool_dim:
        out = _node(graph, names, "Slice", [out, _const(names, [0]), _const(names, [hv]), _const(names, [3])])
    if site.q_is_4d:
        graph.nodes.append(gs.Node("Transpose", names("transpose"), attrs={"perm": [0, 2, 1, 3]}, inputs=[out], outputs=[y]))
    elif is_padded:
        graph.nodes.append(gs.Node("Reshape", names("reshape"), inputs=[out, _const(names, [0, 0, n * hv])], outputs=[y]))


def _node(graph: gs.Graph, names: NameGen, op: str, inputs: list, **attrs) -> gs.Tensor:
    out = gs.Variable(names(op.lower()), np.float32, None)
    graph.nodes.append(gs.Node(op, names(op.lower()), attrs=attrs, inputs=inputs, outputs=[out]))
    return out


def _const(names: NameGen, values) -> gs.Constant:
    return gs.Constant(names("shape"), np.asarray(values, dtype=np.int64))


def _drop_past_reads(graph: gs.Graph, past: set[int], site: Site) -> list[LengthRead]:
    """Exporters read shapes off the past inputs (dynamo: the batch size, and the past length in its
    shape arithmetic). The paged graph is the model run on an empty past: [1, kvN, 0, H]. Returns
    the reads that include the past length (now constants)."""
    lengths = []
    for tensor in [t for t in graph.inputs if id(t) in past]:
        static = past_shape(tensor, site, 0)
        for consumer in list(tensor.outputs):
            if consumer.op != "Shape":
                raise BadInput(f"not a recognized decoder: '{consumer.name}' ({consumer.op}) reads the past KV "
                               f"input '{tensor.name}' outside attention")
            start, end = consumer.attrs.get("start", 0), consumer.attrs.get("end", 4)
            value = consumer.outputs[0]
            value.to_constant(np.asarray(static[slice(start, end)], dtype=np.int64))
            consumer.outputs.clear()
            consumer.inputs.clear()
            axes = list(range(4))[slice(start, end)]
            if 2 in axes:  # the batch or head dims alone say nothing of positions
                lengths.append(LengthRead(value, axes.index(2)))
    return lengths


def _gather_logits(graph: gs.Graph, logits_name: str, names: NameGen) -> bool:
    """Insert Gather(hidden, logits_indices, axis=token axis) before an LM head GEMM on [1, T, D] rows
    (the graph gathers them itself when it takes logits_indices already: logits_rows.py)."""
    if any(t.name == LOGITS_INDICES for t in graph.inputs):
        return True
    logits = next((t for t in graph.outputs if t.name == logits_name), None)
    head = logits.inputs[0] if logits is not None and len(logits.inputs) == 1 else None
    hidden = head.inputs[0] if head is not None and head.op in GEMM_OPS else None
    if hidden is None or hidden.shape is None or len(hidden.shape) != 3 or any(head.attrs.get(a) for a in ("transA", "transBatchA")):
        return False
    indices = gs.Variable(LOGITS_INDICES, np.int64, ["num_logits"])
    rows = gs.Variable(names("logits_rows"), hidden.dtype, [hidden.shape[0], "num_logits", hidden.shape[2]])
    graph.nodes.append(gs.Node("Gather", names("gather_logits"), attrs={"axis": 1}, inputs=[hidden, indices], outputs=[rows]))
    head.inputs[0] = rows
    graph.inputs.append(indices)
    return True
