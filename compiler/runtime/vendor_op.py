"""The vendor tactic: one convolution or GEMM step run by onnxruntime.

On the CPU the vendor library of a convolution or a GEMM is onnxruntime's MLAS (blocked NCHWc
direct convolutions, SGEMM with prepacked weights), as cuBLAS is a GEMM's on the GPU. The build
times it against infc's own kernels for every such step of the program (tune_vendor.py) and marks
the steps it wins with `"tactic": "onnxruntime"`; the executor then runs such a step through a
one-node onnxruntime session built here, at load, from the step itself and its constant inputs. The
plan stores no model bytes and no second copy of the weights, and it stays portable: a device
executor or an observer ignores the tactic and runs infc's kernel.

    step                        runs in onnxruntime as
    Conv                        Conv (same attributes and inputs)
    com.microsoft.FusedConv     FusedConv (same attributes and inputs)
    infc.cpu.TunedMatMul        MatMul(a, w) on the original weight (inputs 0 and 1)
    RNN, GRU, LSTM              themselves (same attributes and inputs)

Sessions do not spin, unless one session runs all of a program's tactic steps. Each session owns a
thread pool, and onnxruntime's workers spin-wait after every parallel section by default: with a
few dozen sessions that spin on the cores the next step needs (ResNet-50 on two cores: 111 ms with
spinning, 66 ms without). A program's only session spins, as onnxruntime alone would: waking
sleeping workers for each of its parallel sections cost 5-15% (EfficientNet-B0 and a T5 encoder,
each all in one session, measured in separate processes).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .conv_sum_form import conv_sum_nodes, has_sum
from .ort_call import as_feed, named_feeds, session_runner
from .ort_crashes import optimizers_to_disable

__all__ = ["as_feed"]  # re-exported: tactic sessions and islands feed through it (ort_call.py)

TACTIC = "onnxruntime"
NATIVE = "infc"
TACTICS = (NATIVE, TACTIC)
# step (domain, op) -> (onnxruntime's domain, op, how many of the step's inputs it reads, keeps attributes)
VENDOR_FORMS = {
    ("", "Conv"): ("", "Conv", None, True),
    ("com.microsoft", "FusedConv"): ("com.microsoft", "FusedConv", None, True),
    ("infc.cpu", "TunedMatMul"): ("", "MatMul", 2, False),
    # recurrent layers (marked untimed: tune_vendor.RECURRENT_STEPS), as the model had them
    ("", "RNN"): ("", "RNN", None, True),
    ("", "GRU"): ("", "GRU", None, True),
    ("", "LSTM"): ("", "LSTM", None, True),
}
CONV_STEPS = {("", "Conv"), ("com.microsoft", "FusedConv")}
_OPSETS = {"": 17, "com.microsoft": 1}  # Conv and MatMul are unchanged since opset 13; FusedConv is version 1

# Bridges: steps that are ONNX (or onnxruntime contrib) nodes as the model had them, which infc's
# kernels run with the standard's meaning, so onnxruntime can run them too, as themselves. They are
# never timed alone: a bridge joins a run of tactic steps (an activation, a pooling, a LayerNorm
# between two convolutions or GEMMs) so that the run stays one session in onnxruntime's layout
# (compiler/tune_bridge.py decides which, in context). A group holding bridges runs at the model's
# opset, since their meaning can depend on it.
BRIDGE_OPS = frozenset(
    [("", op) for op in (
        "Abs", "Add", "And", "ArgMax", "ArgMin", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Celu",
        "Clip", "Concat", "ConstantOfShape", "ConvInteger", "ConvTranspose", "Cos", "CumSum", "DepthToSpace", "DequantizeLinear",
        "Div", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather",
        "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater",
        "GreaterOrEqual", "GroupNormalization", "HardSigmoid", "HardSwish", "Identity",
        "InstanceNormalization", "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log",
        "LogSoftmax", "LpNormalization", "LRN", "MatMul", "MatMulInteger", "Max", "MaxPool", "Mean", "Min",
        "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "PRelu", "QLinearConv", "QLinearMatMul",
        "QuantizeLinear", "Reciprocal", "ReduceL2", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
        "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Range", "Reshape", "Resize", "Round", "Selu",
        "Shape", "Sigmoid", "Sign", "Size", "SimplifiedLayerNormalization", "Sin", "Slice", "Softmax", "Softplus", "Softsign",
        "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "ThresholdedRelu", "Tile", "TopK",
        "Transpose", "Trilu", "Unsqueeze", "Where", "Xor")]
    + [("com.microsoft", op) for op in (
        "BiasGelu", "FastGelu", "FusedGemm", "FusedMatMul", "Gelu", "MultiHeadAttention", "QuickGelu",
        "RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization")])
CHAIN = ("infc.cpu", "ElementwiseChain")  # bridges as its ops (lowering fused them from the model's nodes)
GATED = ("infc.cpu", "GatedActivation")  # bridges as the Split, activation and Mul it fused (lower_fuse.py)
ISLAND_OP = "__island__"  # ops without an infc kernel (lower.py): an island bridges as its subgraph's nodes


def is_conv_step(step: dict) -> bool:
    return ((step.get("domain") or ""), step["op"]) in CONV_STEPS


def is_vendor_step(step: dict) -> bool:
    """A step onnxruntime can run when the build marked it: timed (VENDOR_FORMS) or a bridge."""
    key = ((step.get("domain") or ""), step["op"])
    return key in VENDOR_FORMS or key in BRIDGE_OPS or key in (CHAIN, GATED) or step["op"] == ISLAND_OP


def is_bridge_step(step: dict) -> bool:
    key = ((step.get("domain") or ""), step["op"])
    return (key in BRIDGE_OPS or key in (CHAIN, GATED) or step["op"] == ISLAND_OP) and key not in VENDOR_FORMS


def bridge_nodes(step: dict, opset: int = 17) -> list[dict]:
    """The ONNX nodes a bridge step stands for ({"op", "domain", "attrs"}): itself, a chain's ops or a
    gated activation's three (at the model's `opset`), none for an island (onnxruntime already runs
    its subgraph)."""
    if step["op"] == ISLAND_OP:
        return []
    key = ((step.get("domain") or ""), step["op"])
    if key == CHAIN:
        return [{"op": op["op"], "domain": op.get("domain") or "", "attrs": op.get("attrs") or {}}
                for op in step["attrs"]["ops"]]
    if key == GATED:
        return _gated_nodes(step["attrs"], opset)
    return [step]


def _gated_nodes(attrs: dict, opset: int) -> list[dict]:
    """GatedActivation as ONNX nodes: Split in two halves along the last axis, the activation of
    the `gate` half (a com.microsoft op), Mul by the other half."""
    split = {"axis": -1, **({"num_outputs": 2} if opset >= 18 else {})}  # equal halves: the default before 18
    activation = attrs["activation"]
    act_attrs = {"alpha": attrs.get("alpha", 1.702)} if activation == "QuickGelu" else {}
    return [{"op": "Split", "domain": "", "attrs": split}, {"op": activation, "domain": "com.microsoft", "attrs": act_attrs},
            {"op": "Mul", "domain": "", "attrs": {}}]


def _form(step: dict) -> tuple:
    """(onnxruntime's domain, op, how many of the step's inputs it reads, keeps attributes)."""
    key = ((step.get("domain") or ""), step["op"])
    return VENDOR_FORMS.get(key) or (key[0], key[1], None, True)


def _attr(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def vendor_runner(step_op: str, step_domain: str, attrs: dict, input_names: list[str],
                  constants: dict[str, np.ndarray], threads: int | None = None,
                  output_names: list[str] | None = None) -> Callable:
    """A kernel (inputs, attrs, ctx) -> outputs that runs one step in onnxruntime; `inputs` are all
    the step's inputs in order (the constant ones and those its onnxruntime form does not read are
    ignored: the session holds the constants). `attrs` are decoded values. `threads`: the session's
    intra-op threads (None: onnxruntime's default, one per core). `output_names`: the step's (an
    LSTM's Y, Y_h, Y_c, "" where unused, None for those); one output where not given."""
    wanted = [bool(name) for name in (output_names or ["y"])]
    node_outputs = [f"y{i}" if is_wanted else "" for i, is_wanted in enumerate(wanted)]
    step = {"op": step_op, "domain": step_domain, "inputs": list(input_names), "outputs": node_outputs, "attrs": attrs}
    fed = []  # (name, index) once per name: a tensor read twice (an LSTM's h0 = c0) is one session input
    for index, name in enumerate(input_names[:_num_read(step)]):
        if name and name not in constants and name not in {fed_name for fed_name, _ in fed}:
            fed.append((name, index))
    outputs = [name for name in node_outputs if name]
    run = session_runner(_session([step], [name for name, _ in fed], outputs, constants, lambda a: a, threads))
    if all(wanted) and [index for _, index in fed] == list(range(len(fed))):  # a Conv or GEMM: no gaps to fill
        fed_names = [name for name, _ in fed]

        def in_onnxruntime(inputs, attrs, ctx):
            return run(outputs, named_feeds(fed_names, inputs))

        return in_onnxruntime

    def in_onnxruntime_gaps(inputs, attrs, ctx):
        results = iter(run(outputs, {name: as_feed(inputs[index]) for name, index in fed}))
        return [next(results) if is_wanted else None for is_wanted in wanted]

    return in_onnxruntime_gaps



def _session(members: list[dict], input_names: list[str], output_names: list[str], weights: dict, decode,
             threads: int | None = None, opset: int | None = None, spin: bool = False, islands: dict | None = None):
    """One onnxruntime session over the members' onnxruntime forms (VENDOR_FORMS, a bridge as
    itself, an island as its subgraph's nodes from `islands`); the inputs they read from `weights`
    are its initializers. `decode` turns a member's attributes into values; `opset`: the model's,
    needed when a bridge is among the members. Inputs are float32 but for those a member lists in
    its "tactic_dtypes" (the build saw them), of unknown rank but for those in its "tactic_ranks" and the
    1-D ones of its "tactic_lengths"."""
    import onnx  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415 - only plans with this tactic need it
    from onnx import helper, numpy_helper  # noqa: PLC0415

    nodes, constants, dtypes, ranks, initializers = [], {}, {}, {}, {}
    opsets = {"": int(opset) if any(is_bridge_step(member) for member in members) else _OPSETS[""]}
    for member in members:
        dtypes.update(member.get("tactic_dtypes") or {})
        ranks.update(member.get("tactic_ranks") or {})
        ranks.update({name: [length] for name, length in (member.get("tactic_lengths") or {}).items()})
        names = [name or "" for name in member["inputs"][:_num_read(member)]]
        constants.update({name: weights[name] for name in names if name in weights})
        if member["op"] == ISLAND_OP:
            island = onnx.load_from_string(islands[member["section"]])
            for index, node in enumerate(island.graph.node):  # node names must be unique in a session
                node.name = f"{member['section']}.{index}"
            nodes += island.graph.node
            initializers.update({init.name: init for init in island.graph.initializer})
            for entry in island.opset_import:
                opsets[entry.domain] = max(opsets.get(entry.domain, 0), entry.version)
            continue
        nodes += _onnx_nodes(member, names, decode, opsets[""])
    for domain in {node.domain for node in nodes if node.domain} - set(opsets):
        opsets[domain] = _OPSETS.get(domain, 1)
    handed = {name: np.ascontiguousarray(value) for name, value in constants.items() if _is_handed(value)}
    initializers.update({name: external_stub(name, value) for name, value in handed.items()})
    initializers.update({name: numpy_helper.from_array(np.asarray(value, order="C"), name)  # 0-d stays 0-d
                         for name, value in constants.items() if name not in handed})
    graph = helper.make_graph(
        nodes, "vendor",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtypes.get(name, "float32"))),
                                       _declared_dims(ranks.get(name)))
         for name in input_names],
        [helper.make_empty_tensor_value_info(name) for name in output_names],  # onnxruntime infers their types
        list(initializers.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(opsets.items())],
                              ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failure surfaces as the step's one-line error
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if threads:
        options.intra_op_num_threads = int(threads)
    if handed:
        options.add_external_initializers(list(handed), [ort.OrtValue.ortvalue_from_numpy(v) for v in handed.values()])
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=optimizers_to_disable(graph.node) or None)


def _declared_dims(rank: int | list | None) -> list | None:
    """A session input's dims: unknown (any size runs) but for the rank, or a 1-D length, known."""
    return rank if isinstance(rank, list) else None if rank is None else [None] * rank


# Weights from this size are handed to onnxruntime as arrays (add_external_initializers: one copy, at
# load) instead of inside the serialized model, where each stood three more times (its TensorProto,
# the model's bytes, onnxruntime's parse): a 1.2 GB encoder's plan ran in 11 GB. Smaller constants
# (shapes, axes) stay in the model, where onnxruntime's shape inference reads them.
HANDED_MIN_BYTES = 4096


def _is_handed(value) -> bool:
    value = np.asarray(value)
    return value.nbytes >= HANDED_MIN_BYTES and value.dtype.kind in "fiub"


def external_stub(name: str, value: np.ndarray):
    """An initializer that names external data which the session options provide."""
    from onnx import TensorProto, helper  # noqa: PLC0415

    stub = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype), dims=list(value.shape),
                       data_location=TensorProto.EXTERNAL)
    for key, text in (("location", "infc-handed-weight"), ("offset", "0"), ("length", str(value.nbytes))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, text
    return stub


def _onnx_nodes(member: dict, names: list[str], decode, opset: int) -> list:
    """The member's onnxruntime form as ONNX nodes; an ElementwiseChain is its ops, one node each,
    their intermediate values named after the chain's output."""
    from onnx import helper  # noqa: PLC0415

    key = ((member.get("domain") or ""), member["op"])
    if key == GATED:
        split, activation, product = _gated_nodes(decode(member.get("attrs") or {}), opset)
        out = member["outputs"][0]
        halves = [f"{out}::gated.0", f"{out}::gated.1"]
        gate, up = halves if member["attrs"].get("gate", 0) == 0 else halves[::-1]
        return [helper.make_node("Split", names[:1], halves, **split["attrs"]),
                helper.make_node(activation["op"], [gate], [f"{out}::gated.act"], domain="com.microsoft",
                                 **{k: _attr(v) for k, v in activation["attrs"].items()}),
                helper.make_node("Mul", [f"{out}::gated.act", up], [out])]
    if has_sum(member["op"], key[0], names):  # onnxruntime blocks it to NCHWc only as Conv + Add (conv_sum_form.py)
        unfused = conv_sum_nodes(names, member["outputs"][0], decode(member.get("attrs") or {}), member.get("name", ""))
        if unfused is not None:
            return unfused
    if key != CHAIN:
        domain, op, _, keeps_attrs = _form(member)
        attrs = _node_attrs(member.get("attrs") or {}, decode) if keeps_attrs else {}
        return [helper.make_node(op, names, list(member["outputs"]), domain=domain, **attrs)]
    ops, out = member["attrs"]["ops"], member["outputs"][0]
    results = [f"{out}::chain.{k}" for k in range(len(ops) - 1)] + [out]
    nodes = []
    for op, result in zip(ops, results):
        args = ["" if arg is None else names[arg] if arg >= 0 else results[-1 - arg] for arg in op["args"]]
        nodes.append(helper.make_node(op["op"], args, [result], domain=op.get("domain") or "",
                                      **_node_attrs(op.get("attrs") or {}, decode)))
    return nodes


def _node_attrs(attrs: dict, decode) -> dict:
    """A step's JSON attributes as ONNX node attributes: a tensor attribute (ConstantOfShape's
    value) stays a tensor, where its decoded array would become a list of numbers."""
    from onnx import numpy_helper  # noqa: PLC0415

    decoded = decode(attrs)
    return {k: numpy_helper.from_array(np.asarray(v)) if isinstance(attrs[k], dict) and "tensor" in attrs[k] else _attr(v)
            for k, v in decoded.items()}


# Runs of consecutive tactic steps (a ResNet block's convolutions, a MobileNet's whole body) are one
# session: inside it onnxruntime keeps its blocked NCHWc layout from one convolution to the next,
# where separate sessions reorder every input to NCHWc and every output back (MobileNetV2 at 224:
# most of the time of its 1x1 convolutions). The build marks the runs (`"tactic_group"`, the index
# of the run's first step) when the whole program measured faster with them (tune_context.py).
GROUP_OP = "__onnxruntime_group__"


def group_tactic_steps(steps: list[dict], weights: dict, keep: set[str]) -> list[dict]:
    """The program with each run of two or more consecutive steps of one "tactic_group" replaced by
    a step that runs them in one session (`members` holds them); values of the run that later steps
    or the program outputs read are its outputs."""
    runs: list[list[int]] = []
    for index, step in enumerate(steps):
        group = step.get("tactic_group") if step.get("tactic") == TACTIC and is_vendor_step(step) else None
        if group is not None and runs and steps[runs[-1][-1]].get("tactic_group") == group and runs[-1][-1] == index - 1:
            runs[-1].append(index)
        elif group is not None:
            runs.append([index])
    merged: dict[int, dict | None] = {}
    for run in runs:
        if len(run) < 2:
            continue
        members = [steps[i] for i in run]
        produced = {name for member in members for name in member["outputs"] if name}
        read_after = set(keep)
        for later in steps[run[-1] + 1:]:
            read_after.update(later["inputs"])
        inputs = list(dict.fromkeys(name for member in members for name in member["inputs"][:_num_read(member)]
                                    if name and name not in produced and name not in weights))
        outputs = [name for member in members for name in member["outputs"] if name and name in read_after]
        merged[run[0]] = {"op": GROUP_OP, "domain": "", "name": f"{members[0].get('name', '')} .. {members[-1].get('name', '')}",
                          "inputs": inputs, "outputs": outputs, "members": members}
        for i in run[1:]:
            merged[i] = None
    return [merged.get(i, step) for i, step in enumerate(steps) if merged.get(i, step) is not None]


def _num_read(step: dict) -> int:
    count = _form(step)[2]
    return len(step["inputs"]) if count is None else count


def group_runner(step: dict, weights: dict, decode, opset: int, spin: bool = False,
                 islands: dict | None = None) -> Callable:
    """A kernel (inputs, attrs, ctx) -> outputs running a GROUP_OP step's members in one session;
    `decode` turns a member's JSON attributes into values (kernels.common.decode_attrs); `opset`:
    the model's; `islands`: the plan's island sections (a member may be one); `spin`: its workers spin-wait between parallel sections, as onnxruntime's do by
    default (right when it is the program's only session: nobody else's workers need the cores)."""
    input_names, output_names = list(step["inputs"]), list(step["outputs"])
    run = session_runner(_session(step["members"], input_names, output_names, weights, decode, opset=opset, spin=spin,
                                  islands=islands))

    def group_in_onnxruntime(inputs, attrs, ctx):
        return run(output_names, named_feeds(input_names, inputs))

    return group_in_onnxruntime
