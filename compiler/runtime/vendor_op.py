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

Sessions do not spin. Each session owns a thread pool, and onnxruntime's workers spin-wait after
every run by default: with a few dozen sessions that spin on the cores the next step needs (ResNet-50
on two cores: 111 ms with spinning, 66 ms without).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

TACTIC = "onnxruntime"
NATIVE = "infc"
TACTICS = (NATIVE, TACTIC)
# step (domain, op) -> (onnxruntime's domain, op, how many of the step's inputs it reads, keeps attributes)
VENDOR_FORMS = {
    ("", "Conv"): ("", "Conv", None, True),
    ("com.microsoft", "FusedConv"): ("com.microsoft", "FusedConv", None, True),
    ("infc.cpu", "TunedMatMul"): ("", "MatMul", 2, False),
}
CONV_STEPS = {("", "Conv"), ("com.microsoft", "FusedConv")}
_OPSETS = {"": 17, "com.microsoft": 1}  # Conv and MatMul are unchanged since opset 13; FusedConv is version 1


def is_conv_step(step: dict) -> bool:
    return ((step.get("domain") or ""), step["op"]) in CONV_STEPS


def is_vendor_step(step: dict) -> bool:
    return ((step.get("domain") or ""), step["op"]) in VENDOR_FORMS


def _attr(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def vendor_runner(step_op: str, step_domain: str, attrs: dict, input_names: list[str],
                  constants: dict[str, np.ndarray], threads: int | None = None) -> Callable:
    """A kernel (inputs, attrs, ctx) -> [y] that runs one step in onnxruntime; `inputs` are all the
    step's inputs in order (the constant ones and those its onnxruntime form does not read are
    ignored: the session holds the constants). `attrs` are decoded values. `threads`: the session's
    intra-op threads (None: onnxruntime's default, one per core)."""
    step = {"op": step_op, "domain": step_domain, "inputs": list(input_names), "outputs": ["y"], "attrs": attrs}
    fed = [(name, index) for index, name in enumerate(input_names[:_num_read(step)]) if name and name not in constants]
    session = _session([step], [name for name, _ in fed], ["y"], constants, lambda a: a, threads)
    outputs = ["y"]

    def in_onnxruntime(inputs, attrs, ctx):
        return session.run(outputs, {name: inputs[index] for name, index in fed})

    return in_onnxruntime


def _session(members: list[dict], input_names: list[str], output_names: list[str], weights: dict, decode,
             threads: int | None = None):
    """One onnxruntime session over the members' onnxruntime forms (VENDOR_FORMS); the inputs they
    read from `weights` are its initializers. `decode` turns a member's attributes into values."""
    import onnxruntime as ort  # noqa: PLC0415 - only plans with this tactic need it
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    nodes, constants = [], {}
    for member in members:
        domain, op, _, keeps_attrs = VENDOR_FORMS[((member.get("domain") or ""), member["op"])]
        names = [name or "" for name in member["inputs"][:_num_read(member)]]
        constants.update({name: weights[name] for name in names if name in weights})
        attrs = {k: _attr(v) for k, v in decode(member.get("attrs") or {}).items()} if keeps_attrs else {}
        nodes.append(helper.make_node(op, names, list(member["outputs"]), domain=domain, **attrs))
    graph = helper.make_graph(
        nodes, "vendor", [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in input_names],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in output_names],
        [numpy_helper.from_array(np.ascontiguousarray(value), name) for name, value in constants.items()])
    domains = sorted({node.domain for node in nodes if node.domain})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSETS[""])]
                              + [helper.make_opsetid(d, _OPSETS[d]) for d in domains], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # a failure surfaces as the step's one-line error
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = int(threads)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


# Runs of consecutive tactic steps (a ResNet block's convolutions, a MobileNet's whole body) are one
# session: inside it onnxruntime keeps its blocked NCHWc layout from one convolution to the next,
# where separate sessions reorder every input to NCHWc and every output back (MobileNetV2 at 224:
# most of the time of its 1x1 convolutions). The build marks the runs (`"tactic_group"`, the index
# of the run's first step) when the whole program measured faster with them (tune_vendor.py).
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
    count = VENDOR_FORMS[((step.get("domain") or ""), step["op"])][2]
    return len(step["inputs"]) if count is None else count


def group_runner(step: dict, weights: dict, decode) -> Callable:
    """A kernel (inputs, attrs, ctx) -> outputs running a GROUP_OP step's members in one session;
    `decode` turns a member's JSON attributes into values (kernels.common.decode_attrs)."""
    input_names, output_names = list(step["inputs"]), list(step["outputs"])
    session = _session(step["members"], input_names, output_names, weights, decode)

    def group_in_onnxruntime(inputs, attrs, ctx):
        return session.run(output_names, dict(zip(input_names, inputs)))

    return group_in_onnxruntime
