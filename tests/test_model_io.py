"""Model loading and saving: external data, the 2 GB path, atomic writes, ORT detection."""

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler import model_io, ort_env
from infc.compiler.errors import BadInput, InfcError
from infc.compiler.optimize import optimize_model
from infc.compiler.testing import assert_matches_ort, make_model

F32 = np.float32


def _weighted_model():
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(F32)
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])]
    return make_model(nodes, [("x", F32, [2, 64])], [("y", F32, [2, 64])], {"w": w})


def test_model_with_external_data_loads_and_round_trips(tmp_path):
    src = tmp_path / "ext.onnx"
    onnx.save_model(_weighted_model(), src, save_as_external_data=True, location="ext.bin", size_threshold=0)
    model = model_io.load_model(src)
    result = optimize_model(model)
    out = tmp_path / "out.onnx"
    model_io.save_model(result.model, out)
    assert_matches_ort(model, model_io.load_model(out))


def test_missing_external_data_file_is_bad_input(tmp_path):
    src = tmp_path / "ext.onnx"
    onnx.save_model(_weighted_model(), src, save_as_external_data=True, location="ext.bin", size_threshold=0)
    (tmp_path / "ext.bin").unlink()  # a model copied without its .data file
    with pytest.raises(BadInput, match=r"ext\.onnx: cannot load external data"):
        model_io.load_model(src)


def test_the_checker_sees_the_graph_and_weight_sizes_are_checked_apart(tmp_path):
    """Large initializers go to onnx's checker as typed inputs (no data to serialize); their byte
    counts are checked here instead, and the rest of the model is still the checker's."""
    model = _weighted_model()
    w = np.random.default_rng(1).standard_normal((256, 256)).astype(F32)  # 256 KiB: large
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "big"))
    light = model_io._without_weight_data(model)
    assert [t.name for t in light.graph.initializer] == ["w"] and "big" in [i.name for i in light.graph.input]
    path = tmp_path / "ok.onnx"
    onnx.save(model, path)
    model_io.load_model(path)
    model.graph.initializer[-1].raw_data = model.graph.initializer[-1].raw_data[:-4]  # truncated
    onnx.save(model, tmp_path / "cut.onnx")
    with pytest.raises(BadInput, match=r"cut\.onnx: initializer 'big' holds 262140 bytes for shape \[256, 256\] \(262144 expected\)"):
        model_io.load_model(tmp_path / "cut.onnx")
    model.graph.initializer[-1].raw_data = w.tobytes()
    model.graph.node.append(helper.make_node("NoSuchOp", ["y"], ["z"]))
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(BadInput, match=r"bad\.onnx: NoSuchOp \(node 'z'\) is neither an ONNX op"):
        model_io.load_model(tmp_path / "bad.onnx")


def test_large_models_are_written_with_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(model_io, "EXTERNAL_DATA_THRESHOLD_BYTES", 1000)  # pretend 16 KB is "over 2 GB"
    out = tmp_path / "big.onnx"
    model_io.save_model(_weighted_model(), out)
    assert (tmp_path / "big.onnx.data").stat().st_size >= 64 * 64 * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
    reloaded = model_io.load_model(out)
    assert_matches_ort(_weighted_model(), reloaded)


def test_written_models_use_an_ir_version_ort_reads(tmp_path):
    model = _weighted_model()
    model.ir_version = 13
    result = optimize_model(model)
    assert result.model.ir_version <= model_io.MAX_IR_VERSION


def test_mixed_onnxruntime_installs_are_reported(monkeypatch):
    monkeypatch.setattr(ort_env, "installed_ort_distributions", lambda: ["onnxruntime==1.31.1", "onnxruntime-gpu==1.31.1"])
    with pytest.raises(InfcError, match="both onnxruntime==1.31.1 and onnxruntime-gpu==1.31.1 are installed"):
        ort_env.require_onnxruntime()


def test_weights_stand_as_typed_inputs_once():
    """For onnx's checker and shape inference: an initializer an IR 3 graph also lists as an input
    gets no second input."""
    model = _weighted_model()
    model.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [64, 64]))
    kept, inputs = model_io.weights_as_inputs(model.graph, lambda t: True)
    assert kept == [] and inputs == []
    del model.graph.input[-1]
    kept, inputs = model_io.weights_as_inputs(model.graph, lambda t: t.name == "w")
    assert kept == [] and [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in inputs] == [("w", [64, 64])]


def test_writing_external_data_leaves_the_model_whole_and_a_model_file_loads_in_ort(tmp_path, monkeypatch):
    # onnx.save_model's external-data path empties the tensors it moves out: the model that was saved
    # must still hold its weights (infc optimize writes it, then verifies or reports on it)
    monkeypatch.setattr(model_io, "EXTERNAL_DATA_THRESHOLD_BYTES", 1000)
    model = _weighted_model()
    model_io.save_model(model, tmp_path / "big.onnx")
    assert all(len(t.raw_data) == t.dims[0] * t.dims[1] * 4 for t in model.graph.initializer if len(t.dims) == 2)
    assert_matches_ort(_weighted_model(), model_io.load_model(tmp_path / "big.onnx"))
    with model_io.as_model_file(model) as path:
        assert_matches_ort(_weighted_model(), model_io.load_model(path))
    assert model.SerializeToString() == _weighted_model().SerializeToString()


def test_models_past_two_gib_are_reported_as_such_not_crashed_on(monkeypatch):
    from google.protobuf.message import EncodeError

    model = _weighted_model()

    class TooLarge:  # what protobuf's upb backend raises past 2 GiB
        def __getattr__(self, name):
            return getattr(model, name)

        def ByteSize(self):
            raise EncodeError("Failed to serialize proto")

        def SerializeToString(self):
            raise EncodeError("Failed to serialize proto")

    assert model_io.serialized(TooLarge()) is None and not model_io._fits_bytesize(TooLarge())
    assert model_io.serialized(model) == model.SerializeToString()


def test_local_functions_are_expanded_on_load_and_a_plan_runs_them(tmp_path):
    """A model calling its own FunctionProto twice (onnxscript's style): loaded as plain nodes, so the
    build lowers it (an onnxruntime island without the function failed: 'not a registered function/op')."""
    from onnx import TensorProto, numpy_helper

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    function = helper.make_function("local", "TanhGate", ["a", "w"], ["o"], [
        helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("Mul", ["t", "m"], ["o"])], opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("TanhGate", ["x", "w1"], ["h"], domain="local"), helper.make_node("TanhGate", ["h", "w2"], ["y"], domain="local")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), name) for name in ("w1", "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[function], ir_version=8)
    path = tmp_path / "f.onnx"
    onnx.save(model, path)
    loaded = model_io.load_model(path)
    assert not loaded.functions and [n.op_type for n in loaded.graph.node].count("Tanh") == 2
    build(str(path), None, str(tmp_path / "f.plan"), BuildOptions(target="cpu", cache_dir=tmp_path / "c", show_progress=False))
    x = rng.standard_normal((1, 8)).astype(np.float32)
    np.testing.assert_allclose(PlanSession(tmp_path / "f.plan").run({"x": x})["y"], ort_session(model).run(["y"], {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("declared", ["type without shape", "name only"])
def test_outputs_declared_without_a_shape_or_type_load_as_onnxruntime_runs_them(tmp_path, declared):
    """Old exporters (IR 3) declare graph outputs without a shape, or by name alone; onnx's checker
    wants both, onnxruntime runs the model. The checker sees them inferred; a plan runs the model."""
    from onnx import TensorProto

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None) if declared == "type without shape" \
        else onnx.ValueInfoProto(name="y")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])], [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=3)
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    assert model_io.load_model(path).graph.output[0] == output  # the model as it was: only the checker's copy is typed
    build(str(path), None, str(tmp_path / "old.plan"), BuildOptions(target="cpu", cache_dir=tmp_path / "c", show_progress=False))
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(PlanSession(tmp_path / "old.plan").run({"x": x})["y"], ort_session(model).run(["y"], {"x": x})[0],
                               rtol=1e-6, atol=1e-7)


def test_graphs_with_nodes_out_of_order_load_sorted_and_a_plan_runs_them(tmp_path):
    """onnxconverter's float16 conversion (ultralytics' export(half=True) on the CPU) appends the Casts
    of the graph's inputs and outputs after the nodes that read them. onnxruntime sorts and runs such a
    graph; infc refused it ("the ONNX checker rejects the model: Nodes in a graph must be
    topologically sorted"). Now it loads sorted (a sorted graph keeps its order) and builds."""
    from onnx import TensorProto, numpy_helper

    from infc.compiler.build import BuildOptions, build
    from infc.compiler.runtime.session import PlanSession
    from infc.compiler.verify import ort_session

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float16), "w")
    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT16, None)
    then_branch = helper.make_graph([helper.make_node("Neg", ["s"], ["b"])], "then", [], [branch_out])  # reads outer 's'
    else_branch = helper.make_graph([helper.make_node("Identity", ["s"], ["b"])], "else", [], [branch_out])
    nodes = [
        helper.make_node("Conv", ["x16", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("If", ["flag"], ["y16"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("ReduceMax", ["c"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["flag"]),
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),  # appended last, read first
        helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [w, numpy_helper.from_array(np.array(0, np.float16), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "half.onnx"
    onnx.save(model, path)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(model)
    loaded = model_io.load_model(path)
    assert [n.op_type for n in loaded.graph.node] == ["Cast", "Conv", "Sigmoid", "ReduceMax", "Greater", "If", "Cast"]
    build(str(path), None, str(tmp_path / "half.plan"), BuildOptions(target="cpu", cache_dir=tmp_path / "c", show_progress=False))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(PlanSession(tmp_path / "half.plan").run({"x": x})["y"], ort_session(model).run(["y"], {"x": x})[0],
                               rtol=2e-3, atol=2e-3)


def test_a_sorted_graph_keeps_its_order():
    from infc.compiler.graph_order import sort_topologically

    model = _weighted_model()
    before = list(model.graph.node)
    assert not sort_topologically(model.graph) and list(model.graph.node) == before


def test_metadata_keys_repeated_by_onnxruntimes_quantizers_load_once(tmp_path):
    """quantize_dynamic (on a Llama export, onnxruntime 1.32) wrote ['onnx.infer', 'eos_token_ids',
    'eos_token_ids']: the model's metadata copied onto its own copy. The first of each key stays."""
    path = tmp_path / "model_quantized.onnx"
    model = _weighted_model()
    for key, value in (("onnx.infer", "onnxruntime.quant"), ("eos_token_ids", "[2]"), ("eos_token_ids", "[2]")):
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, path)
    loaded = model_io.load_model(path)
    assert [(p.key, p.value) for p in loaded.metadata_props] == [("onnx.infer", "onnxruntime.quant"), ("eos_token_ids", "[2]")]
