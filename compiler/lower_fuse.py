"""Lowering-time fusions that change how a program executes, not what it computes.

Sibling GEMMs: MatMuls of one activation by constant weights (attention's Q, K and V projections),
each optionally followed by its bias Add, become one MatMul by the concatenated weights, one Add
and a Split (three BLAS calls and three Adds become one of each):

    x ─► MatMul(Wq) ─► Add(bq) ─► q            x ─► MatMul([Wq|Wk|Wv]) ─► Add([bq|bk|bv]) ─► Split ─► q, k, v
    x ─► MatMul(Wk) ─► Add(bk) ─► k      ══►
    x ─► MatMul(Wv) ─► Add(bv) ─► v

Gated activations (SwiGLU, GeGLU): a projection's output split in two halves, one half through a
GELU-family activation, times the other half, become one `infc.cpu.GatedActivation` step reading the
packed output once (runtime/kernels/activation.py), the same bits as the three steps:

    h ─► Split ─► g ─► QuickGelu ─► Mul ─► y       ══►    h ─► GatedActivation(gate=0) ─► y
               └─► u ────────────────┘

Elementwise runs become one `infc.cpu.ElementwiseChain` step (runtime/kernels/chain.py), which
takes each block of the output through all the ops while it is in cache and writes memory once, in
place when the executor can donate the input's buffer.

    x ─► HardSigmoid ─► h ─► Mul(x, h) ─► Mul(·, s) ─► Add(·, b) ─► y      4 steps, 4 passes, 4 arrays
    ══►  ElementwiseChain(x, s, b) ─► y                                     1 step, 1 pass

A step joins the chain that produced one of its inputs when that input is the chain's last result
and nothing else reads it; so every result inside a chain is read only inside it, and only the
last one is visible to the rest of the program. Only float32/float64 steps of ops the chain kernel
runs natively join (chain.INTO), and a chain holds two steps at least. Values a subgraph reads
(control flow in islands) are never folded away.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .lower_experts import fuse_expert_gemms
from .runtime.kernels.chain import INTO

CHAIN_OP, CHAIN_DOMAIN = "ElementwiseChain", "infc.cpu"
FLOAT_NAMES = {"float32", "float64"}


GATED_OP = "GatedActivation"
GATED_ACTIVATIONS = {"QuickGelu", "FastGelu", "Gelu"}  # com.microsoft, one input (no FastGelu bias)


def fuse_program(steps: list[dict], weights: dict[str, np.ndarray], graph: gs.Graph) -> list[dict]:
    """The fusions; `weights` gains the concatenated weights and loses the ones no step reads any more."""
    visible = visible_names(graph)  # once: a walk of every subgraph of the model
    steps = fuse_expert_gemms(steps, weights, visible, graph.tensors())
    steps = merge_sibling_gemms(steps, weights, graph, visible)
    return fuse_elementwise(fuse_gated(steps, weights, graph, visible), graph, visible)


def fuse_gated(steps: list[dict], weights: dict[str, np.ndarray], graph: gs.Graph,
               visible: set[str] | None = None) -> list[dict]:
    """The program with Split -> activation -> Mul triples as one GatedActivation step each."""
    visible = visible_names(graph) if visible is None else visible
    tensors = graph.tensors()
    consumers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                consumers.setdefault(name, []).append(index)

    def only_reader(name: str) -> int | None:
        readers = consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in visible else None

    fused: dict[int, dict] = {}
    dropped: set[int] = set()
    for index, split in enumerate(steps):
        if not _halves_along_last_axis(split, weights, tensors):
            continue
        for gate in (0, 1):
            act_index = only_reader(split["outputs"][gate])
            act = steps[act_index] if act_index is not None else None
            if act is None or act["op"] not in GATED_ACTIVATIONS or act.get("domain") != "com.microsoft" \
                    or len([i for i in act["inputs"] if i]) != 1:
                continue
            mul_index = only_reader(act["outputs"][0])
            mul = steps[mul_index] if mul_index is not None else None
            other = split["outputs"][1 - gate]
            if mul is None or mul["op"] != "Mul" or mul.get("domain") or sorted(mul["inputs"]) != sorted([act["outputs"][0], other]) \
                    or only_reader(other) != mul_index:
                continue
            attrs = {"activation": act["op"], "gate": gate}
            if "alpha" in act.get("attrs", {}):
                attrs["alpha"] = act["attrs"]["alpha"]
            fused[mul_index] = {"op": GATED_OP, "domain": CHAIN_DOMAIN, "name": f"{mul.get('name', '')}#gated",
                                "inputs": [split["inputs"][0]], "outputs": list(mul["outputs"]), "attrs": attrs}
            dropped.update((index, act_index))
            break
    return [fused.get(i, step) for i, step in enumerate(steps) if i not in dropped]


def _halves_along_last_axis(step: dict, weights: dict[str, np.ndarray], tensors: dict) -> bool:
    """A Split of its input's last axis into two equal halves (by default sizes or given ones)."""
    if step["op"] != "Split" or step.get("domain") or len(step["outputs"]) != 2 or not all(step["outputs"]):
        return False
    source = tensors.get(step["inputs"][0])
    rank = len(source.shape) if source is not None and source.shape is not None else None
    axis = step["attrs"].get("axis", 0)
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        return False
    sizes = step["attrs"].get("split")
    if len(step["inputs"]) > 1 and step["inputs"][1]:
        given = weights.get(step["inputs"][1])
        if given is None:
            return False
        sizes = np.asarray(given).reshape(-1).tolist()
    return sizes is None or (len(sizes) == 2 and sizes[0] == sizes[1])


def merge_sibling_gemms(steps: list[dict], weights: dict[str, np.ndarray], graph: gs.Graph,
                        visible: set[str] | None = None) -> list[dict]:
    keep = visible_names(graph) if visible is None else visible
    consumers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                consumers.setdefault(name, []).append(index)
    groups: dict[tuple, list[int]] = {}
    for index, step in enumerate(steps):
        if step["op"] != "MatMul" or step.get("domain") or len(step["inputs"]) != 2 or not step["outputs"][0]:
            continue
        w = weights.get(step["inputs"][1])
        if w is None or w.ndim != 2 or w.dtype != np.float32 or step["inputs"][0] in weights:
            continue
        groups.setdefault((step["inputs"][0], w.shape[0]), []).append(index)
    replaced: dict[int, list[dict]] = {}
    dropped: set[int] = set()
    for (x, _), members in groups.items():
        if len(members) < 2:
            continue
        biases = [_bias_add(steps, consumers, weights, keep, i) for i in members]
        with_bias = all(b is not None for b in biases)
        tag = steps[members[0]]["outputs"][0]
        w_cat = np.concatenate([weights[steps[i]["inputs"][1]] for i in members], axis=1)
        sizes = np.array([weights[steps[i]["inputs"][1]].shape[1] for i in members], dtype=np.int64)
        names = {"w": f"{tag}@siblings_w", "sizes": f"{tag}@siblings_sizes", "y": f"{tag}@siblings"}
        weights[names["w"]], weights[names["sizes"]] = w_cat, sizes
        new = [{"op": "MatMul", "domain": "", "name": f"{tag}@siblings", "inputs": [x, names["w"]],
                "outputs": [names["y"]], "attrs": {}}]
        if with_bias:
            names["b"], names["yb"] = f"{tag}@siblings_b", f"{tag}@siblings_biased"
            weights[names["b"]] = np.concatenate([weights[steps[b]["inputs"][side]] for b, side in biases])
            new.append({"op": "Add", "domain": "", "name": f"{tag}@siblings_bias", "inputs": [names["y"], names["b"]],
                        "outputs": [names["yb"]], "attrs": {}})
            dropped.update(b for b, _ in biases)
        outputs = [steps[b]["outputs"][0] for b, _ in biases] if with_bias else [steps[i]["outputs"][0] for i in members]
        new.append({"op": "Split", "domain": "", "name": f"{tag}@siblings_split",
                    "inputs": [new[-1]["outputs"][0], names["sizes"]], "outputs": outputs, "attrs": {"axis": -1}})
        replaced[members[0]] = new
        dropped.update(members[1:])
    if not replaced:
        return steps
    result = []
    for index, step in enumerate(steps):
        if index in replaced:
            result.extend(replaced[index])
        elif index not in dropped and index not in replaced:
            result.append(step)
    still_read = {name for step in result for name in step["inputs"]} | keep
    for index in [i for members in groups.values() if len(members) > 1 for i in members] + list(dropped):
        for name in steps[index]["inputs"]:
            if name in weights and name not in still_read:
                del weights[name]
    return result


def _bias_add(steps, consumers, weights, keep, index) -> tuple[int, int] | None:
    """(Add step, side of the bias) when a MatMul's only reader adds a 1-D constant bias over its columns."""
    out = steps[index]["outputs"][0]
    readers = consumers.get(out, [])
    if len(readers) != 1 or out in keep:
        return None
    add = steps[readers[0]]
    if add["op"] != "Add" or add.get("domain") or len(add["inputs"]) != 2:
        return None
    side = 1 if add["inputs"][0] == out else 0
    bias = weights.get(add["inputs"][side])
    n = weights[steps[index]["inputs"][1]].shape[1]
    if add["inputs"][1 - side] != out or bias is None or bias.shape != (n,) or bias.dtype != np.float32:
        return None
    return readers[0], side


def fuse_elementwise(steps: list[dict], graph: gs.Graph, visible: set[str] | None = None) -> list[dict]:
    """The program with its elementwise runs fused (the steps are not modified)."""
    dtypes = {name: _dtype_name(t.dtype) for name, t in graph.tensors().items()}
    for step in steps:  # without shape inference: an elementwise op's output has its first input's type
        if (step.get("domain") or "", step["op"]) in INTO and step["outputs"] and not dtypes.get(step["outputs"][0]):
            dtypes[step["outputs"][0]] = dtypes.get(step["inputs"][0]) if step["inputs"] else None
    visible = visible_names(graph) if visible is None else visible
    consumers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                consumers.setdefault(name, []).append(index)
    groups: list[list[int]] = []
    tails: dict[str, int] = {}  # a chain's last result -> its group
    for index, step in enumerate(steps):
        if not _chainable(step, dtypes):
            continue
        group = None
        for name in step["inputs"]:
            if name in tails and name not in visible and all(c == index for c in consumers[name]):
                group = tails.pop(name)
                break
        if group is None:
            group = len(groups)
            groups.append([])
        groups[group].append(index)
        tails[step["outputs"][0]] = group
    fused = {members[-1]: _chain_step([steps[i] for i in members]) for members in groups if len(members) > 1}
    folded = {i for members in groups if len(members) > 1 for i in members[:-1]}
    return [fused.get(i, step) for i, step in enumerate(steps) if i not in folded]


def _chainable(step: dict, dtypes: dict) -> bool:
    key = (step.get("domain") or "", step["op"])
    if key not in INTO or len(step["outputs"]) != 1 or not step["outputs"][0] or not step["inputs"] or not step["inputs"][0]:
        return False
    if dtypes.get(step["outputs"][0]) not in FLOAT_NAMES:
        return False
    if step["op"] == "LeakyRelu" and not 0 <= step["attrs"].get("alpha", 0.01) <= 1:
        return False
    return True


def _chain_step(members: list[dict]) -> dict:
    inputs: list[str] = []
    produced: dict[str, int] = {}
    ops = []
    for k, step in enumerate(members):
        args = []
        for name in step["inputs"]:
            if not name:
                args.append(None)
            elif name in produced:
                args.append(-1 - produced[name])
            else:
                if name not in inputs:
                    inputs.append(name)
                args.append(inputs.index(name))
        ops.append({"op": step["op"], "domain": step.get("domain") or "", "args": args, "attrs": dict(step.get("attrs") or {})})
        produced[step["outputs"][0]] = k
    last = members[-1]
    return {"op": CHAIN_OP, "domain": CHAIN_DOMAIN, "name": f"{last.get('name', '')}#chain{len(members)}",
            "inputs": inputs, "outputs": list(last["outputs"]), "attrs": {"ops": ops}}


def _dtype_name(dtype) -> str | None:
    try:
        if isinstance(dtype, (int, np.integer)) or dtype is None:
            return None  # graphsurgeon keeps exotic types as TensorProto codes: never float32/float64
        return np.dtype(dtype).name
    except TypeError:
        return None


def visible_names(graph: gs.Graph) -> set[str]:
    """Values a fusion must keep: the graph's outputs and what its subgraphs read."""
    return {t.name for t in graph.outputs} | _subgraph_reads(graph)


def _subgraph_reads(graph: gs.Graph) -> set[str]:
    names = set()
    for node in graph.nodes:
        for sub in node.subgraphs(recursive=True):
            for inner in sub.nodes:
                names.update(t.name for t in inner.inputs if not t.is_empty())
    return names
