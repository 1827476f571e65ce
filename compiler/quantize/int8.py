"""INT8 post-training quantization: calibrate activation ranges in a streaming pass, then write
QDQ ONNX (see qdq.py) that onnxruntime runs, on CPU as QLinearConv / QLinearMatMul / QGemm."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from ..errors import BadInput
from .calibrate import DEFAULT_PERCENTILE, collect_ranges
from .clamp_fold import clamps_after, fold_clamps
from .silu import silu_names, split_quick_gelu
from .model_parts import drop_unused, float_constants, named_nodes
from .opset_upgrade import ensure_opset
from .qdq import (
    ACTIVATION_TYPES,
    activation_names,
    activation_params,
    select_targets,
    write_qdq,
)
from .unfuse import unfuse_activations
from .weight_range import FULL, weight_limit

# DequantizeLinear's `axis` (per-channel weights) arrives in opset 13.
PER_CHANNEL_MIN_OPSET = 13


@dataclass
class Int8Report:
    method: str
    activation_type: str  # per tensor: "uint8" asymmetric or "int8" symmetric
    weight_type: str
    num_samples: int
    quantized: dict = field(default_factory=dict)  # op -> nodes
    skipped: dict = field(default_factory=dict)  # reason -> nodes
    num_activations: int = 0  # values with a Q/DQ pair
    num_unfused: int = 0  # FusedConv/FusedGemm split back to Conv/Gemm + activation
    num_clamps_folded: int = 0  # Relu / Clip(0, hi) done by their op's output quantization (clamp_fold.py)
    num_silu_split: int = 0  # QuickGelu (alpha 1) written as Sigmoid and Mul, quantized (silu.py)
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def quantize_int8(model: onnx.ModelProto, calib_feeds_iter: Iterable[dict[str, np.ndarray]], method: str = "minmax",
                  activation_type: str = "uint8", percentile: float = DEFAULT_PERCENTILE,
                  reduce_range: bool | None = None) -> tuple[onnx.ModelProto, Int8Report]:
    """`calib_feeds_iter`: feeds dicts, one sample each (e.g. calib_data.iter_calibration(path, model));
    read once, in a single streaming pass. `method`: minmax, percentile or entropy. `reduce_range`:
    weights in [-64, 64] (weight_range.py); None: where this CPU's onnxruntime kernels need it."""
    if activation_type not in ACTIVATION_TYPES:
        raise BadInput(f"activation type '{activation_type}': expected one of {', '.join(ACTIVATION_TYPES)}")
    model, note = ensure_opset(model, PER_CHANNEL_MIN_OPSET, "per-channel DequantizeLinear")
    model, num_unfused = unfuse_activations(model)
    model, num_silu = split_quick_gelu(model)
    model = named_nodes(model)
    constants = float_constants(model)
    targets, skipped = select_targets(model, constants)
    clamps = clamps_after(model, targets, constants)  # a Relu / ReLU6 after a target: its range may do the clamp
    names = activation_names(model, targets)
    names += silu_names(model, names)  # onnxruntime's QLinearSigmoid / QLinearMul between the convolutions
    clamp_outputs = [node.output[0] for _, node, _ in clamps.values() if node.output[0] not in names]
    ranges, num_samples = collect_ranges(model, names + clamp_outputs, calib_feeds_iter, method, percentile)
    params = {name: activation_params(*ranges[name], activation_type) for name in names + clamp_outputs}
    folded = fold_clamps(clamps, params)
    for name, (_, node, _) in clamps.items():  # a clamp left in place keeps its output as it was: unquantized
        if id(node) not in folded and node.output[0] in clamp_outputs:
            params.pop(node.output[0])
    limit = weight_limit(reduce_range)
    model = write_qdq(model, targets, constants, params, limit, removed=folded)
    drop_unused(model.graph)
    notes = [note] if note else []
    if limit != FULL and targets:
        notes.append(f"weights in [-{limit}, {limit}] (7 bits): onnxruntime's int8 kernels on x86 without VNNI "
                     "saturate full-range weights" + ("" if reduce_range else ", as on this CPU"))
    if not targets:
        notes.append(_nothing_quantized(model))
    weight_type = "int8 symmetric per-channel" + ("" if limit == FULL else f" in [-{limit}, {limit}]")
    report = Int8Report(method, activation_type, weight_type, num_samples,
                        dict(Counter(t.node.op_type for t in targets)), dict(skipped), len(params), num_unfused, len(folded), num_silu, notes)
    return model, report


def _nothing_quantized(model: onnx.ModelProto) -> str:
    """Say why a plan built with --precision int8 still computes in float (no silent no-op)."""
    half = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    if any(t.data_type in half for t in model.graph.initializer):
        return ("nothing quantized: the model's weights are float16/bfloat16, and int8 quantizes float32 "
                "Conv/MatMul/Gemm weights; export the model in float32 to quantize it")
    return "nothing quantized: no Conv, MatMul or Gemm has a constant float32 weight"
