"""A seed's model: a random walk over the op table from one input, every unused value an output,
and the inputs' shapes at each profile level."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from .graph import F32, LATE, Graph
from .ops_attention import VOCAB
from .table import AXIS_LEVELS, BATCHES, DIM_NAMES, EXCLUDED_BY_FLAG, FORMS, MAX_ELEMENTS, START_SHAPES
from .variants import as_float16, converted, older

# the share of seeds (drawn off a second generator, so the walk itself stays the seed's) at an older
# opset, and in float16 throughout
OLD_OPSETS = ((0.12, 13), (0.2, 11))
# the forms past "wide" reach further: opsets 7-10 (attributes that later became inputs) and the
# newest onnxruntime loads
OPSETS_BY_FORMS = {"all": ((0.04, 7), (0.08, 9), (0.14, 10), (0.2, 11), (0.26, 13), (0.31, 24), (0.36, 26)),
                   "edge": ((0.04, 7), (0.08, 9), (0.14, 10), (0.2, 11), (0.26, 13), (0.31, 24), (0.36, 26)),
                   "old": ((0.15, 7), (0.3, 8), (0.5, 9), (0.7, 10), (0.85, 11), (1.0, 12))}
FLOAT16_SHARE = 0.15


def random_case(seed: int, forms: str = "all") -> tuple[onnx.ModelProto, dict[str, dict[str, list[int]]]]:
    """The seed's model and its inputs' shapes at each profile level; forms="classic" draws only the
    first table and no variants, so a seed builds the model it built before the table grew."""
    ops = FORMS[forms]
    rng = np.random.default_rng(seed)
    g = Graph(rng)
    start, varying = START_SHAPES[rng.integers(len(START_SHAPES))]
    varying = varying if rng.integers(2) else set()
    g.shapes["x"], g.dyn["x"] = start, frozenset(varying)
    if len(start) == 3 and rng.integers(2):  # a sequence may come with its attention mask
        g.mask_length, g.mask_varies = start[1], 1 in varying
    current = "x"
    for _ in range(int(rng.integers(3, 17))):
        if len(g.nodes) > 1 and rng.integers(4) == 0:  # branch off an earlier value
            current = str(rng.choice(list(g.shapes)))
        shape = g.shapes[current]
        excluded = set().union(*(EXCLUDED_BY_FLAG.get(flag, set()) for flag in g.flags))
        choices = [k for k, (ranks, _) in ops.items() if len(shape) in ranks and k not in excluded]
        assert choices, f"no op takes rank {len(shape)} ({current})"
        for _attempt in range(8):
            made = ops[str(rng.choice(choices))][1](g, current, shape)
            if made is not None and 0 < np.prod(g.shapes[made]) <= MAX_ELEMENTS:
                current = made
                break
    consumed = {i for n in g.nodes for i in n.input}
    outputs = [current] + [n.output[0] for n in g.nodes
                           if n.output[0] in g.shapes and n.output[0] not in consumed and n.output[0] != current]
    interior = [n.output[0] for n in g.nodes if n.output[0] in g.shapes and n.output[0] not in outputs]
    if interior and rng.integers(3) == 0:
        outputs.append(str(rng.choice(interior)))  # an interior value a fusion must keep

    def info(name, dims):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    def output_dims(name):
        return ["batch", *(f"{name}_{a}" if a in g.dyn[name] else d for a, d in enumerate(g.shapes[name]) if a)]

    inputs = [info("x", ["batch", *(DIM_NAMES[a] if a in varying else d for a, d in enumerate(start) if a)])]
    for name, used in (("mask", g.mask_used), ("ids", g.ids_used)):
        if used:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64,
                                                        ["batch", DIM_NAMES[1] if g.mask_varies else g.mask_length]))
    graph = helper.make_graph(g.nodes, f"fuzz_{seed}", inputs, [info(o, output_dims(o)) for o in outputs]
                              + [info(name, dims) for name, dims in g.extra_outputs]
                              + [helper.make_tensor_value_info(name, elem, ["batch", *(f"{name}_{a}" if a in dyn else d
                                                                                       for a, d in enumerate(shape) if a)])
                                 for name, elem, shape, dyn in g.typed_outputs],
                              [numpy_helper.from_array(v, k) for k, v in g.inits.items()])
    late = [helper.make_opsetid(LATE, 1)] if "late" in g.flags else []
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *late], ir_version=8)
    if not late:
        onnx.checker.check_model(model, full_check=True)
    if forms == "classic":
        if seed % 2:  # odd seeds at opset 18, as dynamo writes it: reductions' axes, Split, Pad and Resize as inputs
            model = onnx.version_converter.convert_version(model, 18)
            onnx.checker.check_model(model, full_check=True)
    else:
        model = _variant(model, seed, g.flags, OPSETS_BY_FORMS.get(forms, OLD_OPSETS))
    levels = {}
    for level in BATCHES:
        x = [BATCHES[level], *(d + AXIS_LEVELS[level] if a in varying else d for a, d in enumerate(start) if a)]
        levels[level] = {"x": x, **({"mask": x[:2]} if g.mask_used else {}), **({"ids": x[:2]} if g.ids_used else {})}
    return model, levels


def _variant(model: onnx.ModelProto, seed: int, flags: set, opsets=OLD_OPSETS) -> onnx.ModelProto:
    """The opset the seed's model is written at, maybe in float16; its judging flags in metadata."""
    side = np.random.default_rng([seed, 1])
    draw = side.random()
    opset = next((o for share, o in opsets if draw < share), 18 if seed % 2 else 17)
    if "late" in flags:
        opset = max(opset, 23)
    made = model if opset == 17 else older(model, opset) if opset < 17 else converted(model, opset)
    if made is None and opset >= 23 and "late" in flags:
        raise ValueError(f"seed {seed}: onnx cannot convert the model to opset 23")
    model = made or model  # an older opset the converter cannot reach: the seed stays at 17
    if side.random() < FLOAT16_SHARE and not flags & {"quantized", "exact_ints"}:
        model = as_float16(model)
        flags = flags | {"fp16_model"}
    if flags:
        onnx.helper.set_model_props(model, {"fuzz.flags": ",".join(sorted(flags))})
    return model


def random_model(seed: int) -> onnx.ModelProto:
    return random_case(seed)[0]


def flags_of(model: onnx.ModelProto) -> set:
    return set(next((p.value for p in model.metadata_props if p.key == "fuzz.flags"), "").split(",")) - {""}


def _feeds(shapes: dict[str, list[int]], seed: int, x_dtype=F32) -> dict:
    """x normal; a mask of ones and zeros whose rows each keep their first position."""
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(shapes["x"]).astype(x_dtype)}
    if "mask" in shapes:
        mask = rng.integers(0, 2, size=shapes["mask"]).astype(np.int64)
        mask[:, 0] = 1
        feeds["mask"] = mask
    if "ids" in shapes:
        feeds["ids"] = rng.integers(0, VOCAB, size=shapes["ids"]).astype(np.int64)
    return feeds
