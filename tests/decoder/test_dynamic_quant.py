"""Dynamically quantized decoders (onnxruntime's quantize_dynamic, as transformers.js ships
model_quantized.onnx: MatMulInteger + DynamicQuantizeLinear, uint8 / int8 weights, per tensor or per
channel): the build quantizes each GEMM's activations per row instead of over the whole step
(decoder/dynamic_quant.py, runtime/row_quantized_gemm.py), so a plan's tokens and logits match
onnxruntime on that per-row counterpart of the file, stay near onnxruntime's on the quantized file
itself, and are bitwise the same alone, batched and chunked."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from infc.compiler.decoder.dynamic_quant import fold_dynamic_quantization
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.plan_report import plan_report
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import (PROFILES, assert_invariant_to_batch_and_chunks, build_plan, ort_greedy,
                       prompts, runner_greedy)

NUM_TOKENS = 24
EXACT_IN_FLOAT32 = 1 << 24
# (fixture, weight type, per channel): TorchScript (opset 17), dynamo and Optimum (opset 18) exports
CASES = [("llama_ts", QuantType.QUInt8, False), ("llama_dynamo", QuantType.QInt8, True),
         ("hf/qwen2_optimum", QuantType.QUInt8, True)]


def quantized(name: str, weight_type, per_channel: bool, folder) -> str:
    path = folder / f"{name.replace('/', '_')}_quantized.onnx"
    quantize_dynamic(str(FIXTURES / f"{name}.onnx"), str(path), weight_type=weight_type, per_channel=per_channel)
    return str(path)


def per_row_counterpart(path: str, out) -> str:
    """The file with each dynamically quantized MatMul quantizing its activations per row, in plain
    ONNX ops computing what runtime/row_quantized_gemm.py does (onnxruntime's MatMulInteger takes one
    zero point for all of x: the rows' zero points are subtracted from its sums instead)."""
    codes: dict = {}
    model = fold_dynamic_quantization(onnx.load(path), codes)
    graph = model.graph
    nodes = []
    for node in graph.node:
        parts = codes.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if parts is None:
            nodes.append(node)
            continue
        p = node.output[0] + "/rq/"
        x = node.input[0]
        centered = parts.codes.astype(np.int64) - parts.zero.astype(np.int64)
        graph.initializer.extend([
            numpy_helper.from_array(parts.codes, p + "codes"), numpy_helper.from_array(parts.zero.reshape(-1), p + "w_zero"),
            numpy_helper.from_array(centered.sum(axis=0, keepdims=True).astype(np.int32), p + "sums"),
            numpy_helper.from_array(parts.scale.reshape(1, -1), p + "w_scale"),
            numpy_helper.from_array(np.float32(0), p + "0"), numpy_helper.from_array(np.float32(1), p + "1"),
            numpy_helper.from_array(np.float32(255), p + "255")])
        n = lambda op, ins, out, **kw: nodes.append(helper.make_node(op, [i if i == "" or i == x else p + i for i in ins], [p + out], **kw))
        n("ReduceMin", [x], "rmin", axes=[-1]), n("Min", ["rmin", "0"], "low")
        n("ReduceMax", [x], "rmax", axes=[-1]), n("Max", ["rmax", "0"], "high")
        n("Sub", ["high", "low"], "range"), n("Div", ["range", "255"], "s0"), n("Equal", ["s0", "0"], "flat")
        n("Where", ["flat", "1", "s0"], "scale"), n("Neg", ["low"], "nlow"), n("Div", ["nlow", "scale"], "z0")
        n("Round", ["z0"], "z1"), n("Clip", ["z1", "0", "255"], "zero"), n("Div", [x, "scale"], "q0")
        n("Round", ["q0"], "q1"), n("Add", ["q1", "zero"], "q2"), n("Clip", ["q2", "0", "255"], "q3")
        if EXACT_IN_FLOAT32 >= 255 * int(np.abs(centered).max()) * centered.shape[0]:
            # every partial sum an integer float32 holds: exact on any CPU (onnxruntime's MatMulInteger
            # is not on x86 without VNNI, whose u8 x s8 kernel saturates 16-bit pair sums)
            graph.initializer.append(numpy_helper.from_array(centered.astype(np.float32), p + "centered"))
            n("Sub", ["q3", "zero"], "qc"), n("MatMul", ["qc", "centered"], "accf")
        else:
            n("Cast", ["q3"], "q", to=onnx.TensorProto.UINT8), n("MatMulInteger", ["q", "codes", "", "w_zero"], "raw")
            n("Cast", ["zero"], "zi", to=onnx.TensorProto.INT32), n("Mul", ["zi", "sums"], "fix")
            n("Sub", ["raw", "fix"], "acc"), n("Cast", ["acc"], "accf", to=onnx.TensorProto.FLOAT)
        n("Mul", ["scale", "w_scale"], "scales"), n("Mul", ["accf", "scales"], "y")
        nodes.append(helper.make_node("Identity", [p + "y"], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    opset = next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset.version >= 18:  # ReduceMin / ReduceMax take their axes as an input there
        for node in graph.node:
            if node.op_type in ("ReduceMin", "ReduceMax") and node.attribute:
                axes = node.output[0] + "/axes"
                graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
                del node.attribute[:]
                node.input.append(axes)
    onnx.save(model, out)
    return str(out)


@pytest.mark.parametrize("name,weight_type,per_channel", CASES)
def test_quantize_dynamic_decoder_matches_its_per_row_counterpart(name, weight_type, per_channel, tmp_path):
    path = quantized(name, weight_type, per_channel, tmp_path)
    plan = build_plan(path, PROFILES / "llama_decode.yaml", tmp_path)
    program = read_plan(plan).meta["program"]
    assert not any(s["op"] in ("DynamicQuantizeLinear", "MatMulInteger") for s in program)
    quantized_steps = [s for s in program if s["attrs"].get("row_quantized")]  # every row quantized on its own
    assert quantized_steps and all(s["inputs"][1] == "" for s in quantized_steps)  # they read the codes alone
    assert plan_report(plan)["decoder"]["gemms_quantizing_rows"] == len(quantized_steps)  # what inspect says
    made = {o for s in program for o in s["outputs"]} | set(read_plan(plan).meta["weights"])
    assert not {s["inputs"][2].removesuffix("/codes") for s in quantized_steps} & made  # nor is their float32 weight
    counterpart = per_row_counterpart(path, tmp_path / "per_row.onnx")
    runner = load_model_runner(plan)
    requests = prompts(3, runner.spec.vocab_size, seed=2, max_len=12)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS)
    exact = steps = 0
    for prompt, our_tokens, our_logits in zip(requests, tokens, logits):
        ref_tokens, ref_logits = ort_greedy(counterpart, prompt, NUM_TOKENS)
        for ours, ref, token, ref_token in zip(our_logits, ref_logits, our_tokens, ref_tokens):
            # a code flips where x / scale sits on a half and the two computations of x differ in its
            # last bit: one code's worth, against the ~1% the activations' rounding itself moves
            assert np.abs(ours - ref).max() < 1e-2 * np.abs(ref).max()
            exact, steps = exact + int(np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()), steps + 1
            if token != ref_token:
                break
    assert exact >= 0.6 * steps, f"{exact} of {steps} steps equal to the per-row counterpart's"
    for prompt, our_logits in zip(requests, logits):  # the quantized file: one scale over all of x apart
        _, ref_logits = ort_greedy(path, prompt, 1)
        assert np.abs(our_logits[0] - ref_logits[0]).max() < 0.25 * np.abs(ref_logits[0]).max()


def test_quantize_dynamic_decoder_is_batch_and_chunk_invariant(tmp_path):
    path = quantized("llama_ts", QuantType.QUInt8, False, tmp_path)
    runner = load_model_runner(build_plan(path, PROFILES / "llama_decode.yaml", tmp_path))
    requests = prompts(4, runner.spec.vocab_size, seed=3)
    assert_invariant_to_batch_and_chunks(runner, requests, 8, num_alone=2, chunk_sizes=[7, 5, 16, 3], budget=24)


def test_a_dynamic_quantizer_read_outside_a_matmul_is_refused(tmp_path):
    model = onnx.load(quantized("llama_ts", QuantType.QUInt8, False, tmp_path))
    quantizer = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
    model.graph.node.append(helper.make_node("Identity", [quantizer.output[0]], ["leaked"], name="leak"))
    model.graph.output.append(helper.make_tensor_value_info("leaked", onnx.TensorProto.UINT8, None))
    with pytest.raises(BadInput, match=rf"DynamicQuantizeLinear '{quantizer.name}' is read by 'leak' \(Identity\)"):
        fold_dynamic_quantization(model, {})
