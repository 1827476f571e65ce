import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from infc.compiler.passes.engine import Rule
from infc.compiler.passes.pattern import const, op, var
from infc.compiler.testing import assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32


def _relu_of_add_rule(check=lambda m: None, exposed=()):
    def rewrite(m):
        hidden = m.value("sum", like=m.outputs[0])
        return [gs.Node("Sum", inputs=[m["x"], m["c"]], outputs=[hidden]), gs.Node("Relu", inputs=[hidden], outputs=m.outputs)]

    return Rule("add_relu", op.Relu(op.Add(var("x"), const("c"), name="add")), rewrite, check, exposed)


def _model(commuted=False, extra_use=False):
    add_inputs = ["c", "x"] if commuted else ["x", "c"]
    nodes = [helper.make_node("Add", add_inputs, ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    outputs = [("y", F32, [2, 3])]
    if extra_use:
        nodes.append(helper.make_node("Neg", ["s"], ["z"]))
        outputs.append(("z", F32, [2, 3]))
    return make_model(nodes, [("x", F32, [2, 3])], outputs, {"c": np.arange(3, dtype=F32)})


def test_rule_matches_and_keeps_numerics():
    model = _model()
    result = run_rules(model, [_relu_of_add_rule()])
    assert rule_stats(result, "add_relu") == (1, {})
    assert ops_of(result.model) == ["Sum", "Relu"]
    assert result.model.graph.node[1].name.startswith("add_relu/")  # provenance tag
    assert_matches_ort(model, result.model)


def test_commuted_inputs_match():
    result = run_rules(_model(commuted=True), [_relu_of_add_rule()])
    assert rule_stats(result, "add_relu")[0] == 1


def test_interior_value_used_outside_is_rejected_with_reason():
    result = run_rules(_model(extra_use=True), [_relu_of_add_rule()])
    assert rule_stats(result, "add_relu") == (0, {"an interior Add output is used outside the pattern": 1})
    assert sorted(ops_of(result.model)) == ["Add", "Neg", "Relu"]


def test_check_reason_is_counted():
    result = run_rules(_model(), [_relu_of_add_rule(check=lambda m: "not today")])
    assert rule_stats(result, "add_relu") == (0, {"not today": 1})


def test_exposed_interior_value_is_kept():
    def rewrite(m):
        return [gs.Node("Sum", inputs=[m["x"], m["c"]], outputs=m.exposed["add"]),
                gs.Node("Relu", inputs=m.exposed["add"], outputs=m.outputs)]

    model = _model(extra_use=True)
    rule = Rule("add_relu", op.Relu(op.Add(var("x"), const("c"), name="add")), rewrite, exposed=("add",))
    result = run_rules(model, [rule])
    assert rule_stats(result, "add_relu")[0] == 1
    assert_matches_ort(model, result.model)


def test_same_capture_name_must_bind_same_value():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"])]
    model = make_model(nodes, [("x", F32, [4]), ("w", F32, [4])], [("y", F32, [4])])
    rule = Rule("square", op.Mul(var("x"), var("x")), lambda m: [gs.Node("Neg", inputs=[m["x"]], outputs=m.outputs)])
    assert rule_stats(run_rules(model, [rule]), "square")[0] == 0


def test_a_pattern_in_an_if_branch_does_not_take_a_node_of_the_main_graph():
    # the Add before the If also feeds a ReduceSum out of the branch's sight: fused from inside the
    # branch, it was deleted and the ReduceSum read nothing (found by scripts/fuzz_graphs.py)
    from onnx import TensorProto

    def branch(name, op_type):
        return helper.make_graph([helper.make_node(op_type, ["s"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])])

    nodes = [helper.make_node("Add", ["x", "c"], ["s"]),
             helper.make_node("ReduceSum", ["s"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg"))]
    model = make_model(nodes, [("x", F32, [2, 3])], [("y", F32, [2, 3]), ("total", F32, [])],
                       {"c": np.arange(3, dtype=F32), "zero": np.array(0.0, F32)})
    result = run_rules(model, [_relu_of_add_rule()])
    matched, rejected = rule_stats(result, "add_relu")
    assert matched == 0 and rejected == {"the pattern reaches into an enclosing graph": 1}
    for x in (np.ones((2, 3), F32), -np.ones((2, 3), F32) * 5):
        assert_matches_ort(model, result.model, feeds={"x": x})


def _expand_rule():
    """Relu(Add(x, c)) written as Relu(Add(x, Expand(c, Shape(x)))): Expand is opset 8, and its
    Unsqueeze of the shape takes the axes as an input only from opset 13."""
    def rewrite(m):
        shape, axes_up, wide, total = (m.value(h) for h in ("shape", "up", "wide", "total"))
        up = gs.Node("Unsqueeze", inputs=[m["c"], m.constant("axes", np.array([0], np.int64))], outputs=[axes_up])
        return [gs.Node("Shape", inputs=[m["x"]], outputs=[shape]),
                gs.Node("Expand", inputs=[axes_up, shape], outputs=[wide]), up,
                gs.Node("Add", inputs=[m["x"], wide], outputs=[total]), gs.Node("Relu", inputs=[total], outputs=m.outputs)]

    return Rule("expand_add", op.Relu(op.Add(var("x"), const("c"))), rewrite)


def _model_at(opset):
    nodes = [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return make_model(nodes, [("x", F32, [2, 3])], [("y", F32, [2, 3])], {"c": np.arange(3, dtype=F32)}, opset=opset)


def test_a_replacement_the_opset_cannot_express_is_declined_and_undone():
    # an attention fusion wrote Expand into an opset-7 model, which onnxruntime then refused to load
    # (fuzz_graphs --forms old seed 128)
    for opset, reason in ((7, "Expand does not exist at opset 7"), (11, "Unsqueeze takes at most 1 inputs at opset 11")):
        model = _model_at(opset)
        result = run_rules(model, [_expand_rule()])
        assert rule_stats(result, "expand_add") == (0, {reason: 1})
        assert ops_of(result.model) == ["Add", "Relu"]
        assert_matches_ort(model, result.model)  # the declined build left no reader or writer behind
    result = run_rules(_model_at(13), [_expand_rule()])
    assert rule_stats(result, "expand_add") == (1, {})
    assert_matches_ort(_model_at(13), result.model)
