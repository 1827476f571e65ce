"""onnxruntime islands of nodes the exporter left unnamed (skl2onnx and hand-built graphs): each
copy in the island gets a name of its own, since onnxruntime refuses two nodes of one name."""

import numpy as np
from onnx import TensorProto, helper

from infc.compiler.graph import import_graph
from infc.compiler.lower import ISLAND_OP, lower_graph
from infc.compiler.runtime.executor import Executor
from infc.compiler.runtime.kernels import has_kernel
from infc.compiler.verify import ort_session


def test_an_island_of_unnamed_nodes_runs_and_matches_onnxruntime():
    # two ai.onnx.ml Scalers (no native kernel) in a row, neither named: one island
    nodes = [helper.make_node("Scaler", ["x"], ["a"], domain="ai.onnx.ml", offset=[1.0, 2.0], scale=[0.5, 3.0]),
             helper.make_node("Scaler", ["a"], ["y"], domain="ai.onnx.ml", offset=[-1.0, 0.0], scale=[2.0, 0.25])]
    graph = helper.make_graph(nodes, "unnamed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                              ir_version=8)
    program = lower_graph(import_graph(model), has_kernel)
    assert [s["op"] for s in program.steps] == [ISLAND_OP]
    executor = Executor(program.steps, program.weights, program.opset, program.islands, output_names=["y"])
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)}
    np.testing.assert_allclose(executor.run(feeds)["y"], ort_session(model).run(["y"], feeds)[0], rtol=1e-6)
