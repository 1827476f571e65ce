"""Loading and saving ONNX models: validation with one-line errors, external data, atomic writes."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError, EncodeError

from .atomic import atomic_path
from .errors import BadInput
from .graph_order import sort_topologically

# Protobuf cannot serialize a message over 2 GiB; stay clear of it with some headroom.
EXTERNAL_DATA_THRESHOLD_BYTES = 1_800_000_000
# onnxruntime 1.30 (the oldest one we support, on the H200 image) reads IR <= 13 / opset <= 26.
MAX_IR_VERSION = 10


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if path.is_dir():
        raise BadInput(f"{path}: is a directory, expected an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise BadInput(f"{path}: not a valid ONNX protobuf (truncated or another format): {_first_line(exc)}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    if model.ir_version == 0 or not model.HasField("graph"):
        raise BadInput(f"{path}: not an ONNX model (no IR version or no graph)")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # a missing data file is the last
        raise BadInput(f"{path}: cannot load external data: {_first_line(exc)}") from None
    _check_acyclic(model.graph, path)
    sort_topologically(model.graph)
    _drop_repeated_metadata(model)
    _check_model(model, path)
    return _inline_local_functions(model, path)


def _drop_repeated_metadata(model: onnx.ModelProto) -> None:
    """Keeps the first entry of each metadata key. onnxruntime's quantize_dynamic and
    matmul_nbits_quantizer copy a model's metadata_props onto its own copy of them, so every key
    comes twice (transformers.js' model_quantized.onnx); onnx's checker rejects repeated keys."""
    seen, kept = set(), []
    for entry in model.metadata_props:
        if entry.key not in seen:
            seen.add(entry.key)
            kept.append(entry)
    if len(kept) < len(model.metadata_props):
        del model.metadata_props[:]
        model.metadata_props.extend(kept)


def _inline_local_functions(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """A model's own functions (FunctionProtos in model.functions, as onnxscript and module-preserving
    exports write them) expanded into the graph, as onnxruntime does on load: the passes, the lowering and
    onnxruntime islands then see ordinary nodes (an island calling a function it does not carry fails)."""
    if not model.functions:
        return model
    import onnx.inliner  # noqa: PLC0415

    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - onnx's C++ inliner raises plain exceptions
        raise BadInput(f"{path}: cannot expand the model's local functions: {_first_line(exc)}") from None


def check_inference_mode(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """A Dropout whose training_mode is a constant true (with a ratio above zero) drops random
    elements: no plan can reproduce it, and onnxruntime's outputs change from run to run. Such a
    model was exported in training mode; say so before building (plans run inference only)."""
    constants = {init.name: init for init in model.graph.initializer}
    constants.update({node.output[0]: attr.t for node in model.graph.node if node.op_type == "Constant"
                      for attr in node.attribute if attr.name == "value"})

    def value(name: str):
        tensor = constants.get(name)
        return None if tensor is None else onnx.numpy_helper.to_array(tensor)

    for node in model.graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or len(node.input) < 3 or not node.input[2]:
            continue
        training = value(node.input[2])
        ratio = value(node.input[1]) if len(node.input) > 1 and node.input[1] else 0.5
        if training is not None and bool(training) and (ratio is None or float(ratio) > 0):
            raise BadInput(f"{path}: Dropout '{node.name or node.output[0]}' runs in training mode (its training_mode "
                           "input is true), so its output is random; export the model in eval mode (torch: model.eval())")


def check_tensor_interface(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Plans take and return tensors (arrays in .npz files): a graph input or output that is a
    sequence, a map or an optional (a ZipMap's list of {label: probability}) is refused by name."""
    values = [("input", v) for v in model.graph.input] + [("output", v) for v in model.graph.output]
    for role, value in values:
        if value.type.WhichOneof("value") not in ("tensor_type", None):
            hint = _zipmap_hint(model, value.name) if role == "output" and "map_type" in str(value.type) else ""
            raise BadInput(f"{path}: {role} '{value.name}' is a {type_text(value.type)}; infc plans take and "
                           f"return tensors only{hint}")


def _zipmap_hint(model: onnx.ModelProto, output: str) -> str:
    """What to do about a ZipMap output. Some exporters always write one (CatBoost's classifiers),
    so besides converting without it, name the tensor it is made from: that tensor can be the output."""
    zipmap = next((n for n in model.graph.node if n.op_type == "ZipMap" and output in n.output), None)
    converters = "convert without it (skl2onnx: options={'zipmap': False}; onnxmltools: zipmap=False)"
    if zipmap is None:
        return f" (a ZipMap's output: {converters})"
    tensor = zipmap.input[0]
    outputs = [tensor if o.name == output else o.name for o in model.graph.output]
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    return (f" (ZipMap '{zipmap.name or output}' makes it from the tensor '{tensor}': {converters}, or make that tensor "
            f"the output: onnx.utils.extract_model(MODEL, OUT, {inputs}, {outputs}))")


def type_text(value_type: onnx.TypeProto) -> str:
    """An ONNX type as its schema spells it: seq(map(int64,tensor(float)))."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({onnx.helper.tensor_dtype_to_string(value_type.tensor_type.elem_type).removeprefix('TensorProto.').lower()})"
    if kind == "sequence_type":
        return f"seq({type_text(value_type.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.helper.tensor_dtype_to_string(value_type.map_type.key_type).removeprefix("TensorProto.").lower()
        return f"map({key},{type_text(value_type.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_text(value_type.optional_type.elem_type)})"
    return kind or "value of no type"


def _check_model(model: onnx.ModelProto, path: Path) -> None:
    """onnx's checker on the model with its large initializers given as typed inputs: the checker
    reads the graph, and serializing the weights for it took seconds on a decoder. Their data sizes
    are checked here instead (what the checker would have found wrong with them)."""
    _check_weight_sizes(model.graph, path)
    light = _without_weight_data(model)
    for _ in range(MAX_ORT_ONLY_OPS + 2):
        try:
            onnx.checker.check_model(light)
            return
        except (onnx.checker.ValidationError, ValueError) as exc:
            if not (_set_aside_ort_only_op(light, str(exc)) or _declare_io_types(light, str(exc))):
                plainly = _unknown_ops(model, str(exc))
                if plainly:
                    raise BadInput(f"{path}: {plainly}") from None
                raise BadInput(f"{path}: the ONNX checker rejects the model: {_first_line(exc)}") from None
    raise BadInput(f"{path}: the ONNX checker rejects the model: more than {MAX_ORT_ONLY_OPS} ops it does not know")


# Ops in the ONNX domain that onnx does not define but onnxruntime registers there (onnxruntime-genai's
# SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization): the checker stops at the first
# one; it checks the rest of the graph with them set aside in a domain of their own.
UNKNOWN_OP = re.compile(r"No Op registered for (\w+) with domain_version of (\d+)")
MAX_ORT_ONLY_OPS = 8
SET_ASIDE_DOMAIN = "infc.onnxruntime_only"


def _unknown_ops(model: onnx.ModelProto, message: str) -> str | None:
    """The checker's first unknown op, said plainly with every other one (unknown_ops.py)."""
    if UNKNOWN_OP.search(message) is None:
        return None
    from .quantize.graph_types import signature  # noqa: PLC0415 - onnxruntime's registry, only when needed
    from .unknown_ops import unknown_ops_message  # noqa: PLC0415 - only on this refusal

    return unknown_ops_message(model, lambda op, opset: signature(op, "", opset) is not None)


def _set_aside_ort_only_op(light: onnx.ModelProto, message: str) -> bool:
    from .quantize.graph_types import signature  # noqa: PLC0415 - onnxruntime's registry, only when needed

    found = UNKNOWN_OP.search(message)
    if found is None or signature(found.group(1), "", int(found.group(2))) is None:
        return False
    for node in light.graph.node:
        if node.op_type == found.group(1) and node.domain in ("", "ai.onnx"):
            node.domain = SET_ASIDE_DOMAIN
    if not any(o.domain == SET_ASIDE_DOMAIN for o in light.opset_import):
        light.opset_import.append(onnx.helper.make_opsetid(SET_ASIDE_DOMAIN, 1))
    return True


# Graph inputs / outputs declared by name only (old exporters, IR 3): the checker wants a type with a
# shape on each; onnxruntime runs such models and infers what they hold. The checker's copy gets what
# onnx's shape inference finds (an unknown shape where it finds none); the model itself is unchanged.
UNDECLARED_IO = ("Field 'type' of 'value_info' is required", "Field 'shape' of 'type' is required")


def _declare_io_types(light: onnx.ModelProto, message: str) -> bool:
    if not any(text in message for text in UNDECLARED_IO):
        return False
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    except Exception:  # noqa: BLE001 - onnx's inference errors have no common base: declare none
        inferred = light
    known = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    changed = False
    for value in [*light.graph.input, *light.graph.output]:
        if not value.HasField("type") or not value.type.WhichOneof("value"):
            if value.name not in known:
                continue
            value.type.CopyFrom(known[value.name])
            changed = True
        tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
        if tensor is not None and not tensor.HasField("shape"):
            if value.name in known and known[value.name].tensor_type.HasField("shape"):
                tensor.shape.CopyFrom(known[value.name].tensor_type.shape)
            else:
                tensor.shape.dim.add()  # rank unknown to the checker alike: one symbolic dim
                tensor.shape.dim[0].dim_param = "unknown"
            changed = True
    return changed


LARGE_INITIALIZER_BYTES = 1 << 16


def _is_large(tensor: onnx.TensorProto) -> bool:
    return len(tensor.raw_data) >= LARGE_INITIALIZER_BYTES


def _check_weight_sizes(graph: onnx.GraphProto, path: Path) -> None:
    for tensor in graph.initializer:
        if not _is_large(tensor) or tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
            continue
        count = 1
        for d in tensor.dims:
            count *= d
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(tensor.data_type)
        expected = (count * bits + 7) // 8 if bits else count * itemsize
        if len(tensor.raw_data) != expected:
            raise BadInput(f"{path}: initializer '{tensor.name}' holds {len(tensor.raw_data)} bytes for shape "
                           f"{list(tensor.dims)} ({expected} expected): truncated or corrupt")


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model but for its main graph's initializers (which it does not copy)."""
    light = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(light, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(light.graph, field, value)
    return light


def _without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose large top-level initializers are graph inputs of their type and shape."""
    light = _without_initializers(model)
    kept, inputs = weights_as_inputs(model.graph, _is_large)
    light.graph.initializer.extend(kept)
    light.graph.input.extend(inputs)
    return light


def weights_as_inputs(graph: onnx.GraphProto, is_weight) -> tuple[list, list]:
    """(the initializers to keep, typed inputs standing for the others): onnx's checker and shape
    inference read an initializer's type and shape, not its data, which they would otherwise copy.
    An initializer the graph already lists as an input (IR < 4) gets no second one."""
    declared = {i.name for i in graph.input}
    kept, inputs = [], []
    for tensor in graph.initializer:
        if not is_weight(tensor):
            kept.append(tensor)
        elif tensor.name not in declared:
            inputs.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    return kept, inputs


def _copy_field(target, field, value) -> None:
    if hasattr(value, "extend"):  # a repeated field
        getattr(target, field.name).extend(value)
    elif hasattr(value, "CopyFrom"):  # a message
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def _check_acyclic(graph: onnx.GraphProto, path: Path) -> None:
    # The checker reports a cycle as "not topologically sorted", which also hits merely unsorted
    # graphs (which we accept and sort); name the cycle instead.
    producer = {out: node for node in graph.node for out in node.output if out}
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done
    for start in graph.node:
        stack = [(start, iter(start.input))]
        if state.get(id(start)):
            continue
        state[id(start)] = 1
        while stack:
            node, inputs = stack[-1]
            for name in inputs:
                parent = producer.get(name)
                if parent is None:
                    continue
                mark = state.get(id(parent))
                if mark == 1:
                    raise BadInput(f"{path}: the graph has a cycle through node '{parent.name or parent.op_type}' (value '{name}')")
                if mark is None:
                    state[id(parent)] = 1
                    stack.append((parent, iter(parent.input)))
                    break
            else:
                state[id(node)] = 2
                stack.pop()


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write to a temporary name in the target folder, then rename: no partial output on failure."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise BadInput(f"{path}: output folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{path}: output folder '{folder}' is not writable")
    is_large = model.ByteSize() >= EXTERNAL_DATA_THRESHOLD_BYTES if _fits_bytesize(model) else True
    data_name = path.name + ".data"
    try:
        with atomic_path(path) as tmp_model:
            if not is_large:
                onnx.save_model(model, tmp_model)
            else:
                with atomic_path(folder / data_name) as tmp_data:  # renamed first: the model names it
                    # external data paths are relative to the model file: they name the final file
                    _save_with_external_data(model, tmp_model, tmp_data, data_name)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write: {exc.strerror or exc}") from None


EXTERNAL_TENSOR_MIN_BYTES = 1024  # smaller initializers stay in the model file
EXTERNAL_ALIGNMENT = 4096  # each tensor's data starts on a page: onnxruntime can map it


def _save_with_external_data(model: onnx.ModelProto, model_file, data_file, location: str) -> None:
    """The model with its large top-level initializers' bytes in `data_file`, named `location` in the
    model, and `model` left as it was: onnx.save_model's external-data path empties the tensors it
    moves out, and serializing first is not possible past protobuf's 2 GiB."""
    light = _without_initializers(model)
    offset = 0
    with open(data_file, "wb") as data:
        for tensor in model.graph.initializer:
            if len(tensor.raw_data) < EXTERNAL_TENSOR_MIN_BYTES:
                light.graph.initializer.append(tensor)
                continue
            stub = light.graph.initializer.add()
            for field, value in tensor.ListFields():
                if field.name != "raw_data":
                    _copy_field(stub, field, value)
            offset += data.write(bytes((-offset) % EXTERNAL_ALIGNMENT))
            length = data.write(tensor.raw_data)
            stub.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
                entry = stub.external_data.add()
                entry.key, entry.value = key, value
            offset += length
    onnx.save_model(light, model_file)


def _fits_bytesize(model: onnx.ModelProto) -> bool:
    try:
        model.ByteSize()
        return True
    except (ValueError, EncodeError):  # past protobuf's 2 GiB (the pure-Python and upb backends differ)
        return False


def serialized(model: onnx.ModelProto) -> bytes | None:
    """The model's bytes, or None past protobuf's 2 GiB limit (write it with external data instead)."""
    try:
        return model.SerializeToString()
    except (ValueError, EncodeError):
        return None


@contextlib.contextmanager
def as_model_file(model: onnx.ModelProto):
    """A path onnxruntime or onnx can load the model from: a temporary file, its weights in a data
    file beside it (any size)."""
    with tempfile.TemporaryDirectory(prefix="infc-model-") as folder:
        path = os.path.join(folder, "model.onnx")
        _save_with_external_data(model, path, os.path.join(folder, "model.data"), "model.data")
        yield path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
