"""Control flow nested one level, as scripted exports write it: a Loop whose body holds an If on the
iteration number, a Scan whose body holds an If on an outer condition, an If whose branch holds a
Loop. The inner bodies read values two scopes up (the main graph's value and its initializers) and
change shapes inside (Flatten / Reshape through Shape, Transpose, a reduced scan output), coming
back to the carried value's shape."""

import numpy as np
from onnx import TensorProto, helper

from .graph import F32
from .ops_loop import _float_info, _scalar_info


def _n(g, nodes, op, inputs, **attrs) -> str:
    out = g.name(f"in_{op.lower()}")
    nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
    return out


def _reshaped_softmax(g, nodes, y: str, outer: str) -> str:
    """tanh(y + outer) flattened past the batch, softmax over it, reshaped back to y's shape."""
    t = _n(g, nodes, "Tanh", [_n(g, nodes, "Add", [y, outer])])
    flat = _n(g, nodes, "Flatten", [t], axis=1)
    soft = _n(g, nodes, "Softmax", [flat], axis=-1)
    return _n(g, nodes, "Reshape", [soft, _n(g, nodes, "Shape", [y])])


def _transposed_scale(g, nodes, y: str, rank: int) -> str:
    """y with its last two axes swapped, scaled by an initializer of the main graph, swapped back."""
    perm = [*range(rank - 2), rank - 1, rank - 2]
    swapped = _n(g, nodes, "Transpose", [y], perm=perm)
    scaled = _n(g, nodes, "Mul", [swapped, g.const(np.array(g.rng.uniform(0.5, 1.5), F32))])
    return _n(g, nodes, "Transpose", [_n(g, nodes, "Relu", [scaled])], perm=perm)


def _branch(g, k: int, build) -> helper.GraphProto:
    nodes = []
    out = build(nodes)
    named = g.name(f"nested_branch{k}_out")
    nodes.append(helper.make_node("Identity", [out], [named], name=named))
    return helper.make_graph(nodes, g.name("nested_branch"), [], [_float_info(named)])


def _loop_with_if(g, x, s):
    """for i in range(T): y = (i < k) ? reshaped_softmax(y, x) : transposed_scale(y); the steps'
    y summed over the last axis stacked, averaged and added back."""
    trips, k = int(g.rng.integers(1, 4)), int(g.rng.integers(0, 3))
    i, cond_in, y_in = g.name("iter"), g.name("cond"), g.name("y_in")
    nodes = []
    pick = _n(g, nodes, "Less", [i, g.const(np.array(k, np.int64))])
    then_branch = _branch(g, 0, lambda inner: _reshaped_softmax(g, inner, y_in, x))
    else_branch = _branch(g, 1, lambda inner: _transposed_scale(g, inner, y_in, len(s)))
    y_out = _n(g, nodes, "If", [pick], then_branch=then_branch, else_branch=else_branch)
    cond_out = _n(g, nodes, "Identity", [cond_in])
    summed = _n(g, nodes, "ReduceSum", [y_out, g.const(np.array([-1], np.int64), "axes")], keepdims=0)
    body = helper.make_graph(nodes, g.name("loop_body"), [_scalar_info(i, TensorProto.INT64),
                                                           _scalar_info(cond_in, TensorProto.BOOL), _float_info(y_in)],
                             [_scalar_info(cond_out, TensorProto.BOOL), _float_info(y_out), _float_info(summed)])
    final, stacked = g.name("nested_loop_y"), g.name("nested_loop_sums")
    g.nodes.append(helper.make_node("Loop", [g.const(np.array(trips, np.int64), "trips"), "", x], [final, stacked],
                                    name=final, body=body))
    g.shapes[final], g.dyn[final] = tuple(s), g.dyn[x]
    mean = g.shape_node("Unsqueeze", [g.shape_node("ReduceMean", [stacked], axes=[0], keepdims=0),
                                      g.const(np.array([-1], np.int64), "axes")])
    return g.node("Add", [final, mean], s)


def _scan_with_if(g, x, s):
    """Scan over axis 1; in the body, on an outer condition (the graph input's sum), the state is
    either tanh(state * c + x_t) or x_t's flatten-and-back plus the state."""
    if len(s) < 3:
        return None
    cond = g.shape_node("Greater", [g.shape_node("ReduceSum", ["x"], keepdims=0), g.const(np.array(0.0, F32))])
    first = g.shape_node("Gather", [x, g.const(np.array(0, np.int64))], axis=1)
    state0 = g.shape_node("Mul", [first, g.const(np.array(0.0, F32))])
    state_in, x_t = g.name("state_in"), g.name("x_t")
    nodes = []

    def then_(inner):
        return _n(g, inner, "Tanh", [_n(g, inner, "Add", [_n(g, inner, "Mul", [state_in, g.const(
            np.array(g.rng.uniform(0.3, 0.9), F32))]), x_t])])

    def else_(inner):
        flat = _n(g, inner, "Flatten", [x_t], axis=1)
        back = _n(g, inner, "Reshape", [_n(g, inner, "Sigmoid", [flat]), _n(g, inner, "Shape", [state_in])])
        return _n(g, inner, "Add", [back, state_in])

    state_out = _n(g, nodes, "If", [cond], then_branch=_branch(g, 0, then_), else_branch=_branch(g, 1, else_))
    y_t = _n(g, nodes, "Identity", [state_out])
    # onnxruntime's Scan wants its body's outputs ranked, and an If's output is not
    step_rank = [None] * (len(s) - 1)
    body = helper.make_graph(nodes, g.name("scan_body"), [_float_info(state_in), _float_info(x_t)],
                             [helper.make_tensor_value_info(v, TensorProto.FLOAT, step_rank) for v in (state_out, y_t)])
    final, ys = g.name("nested_scan_state"), g.name("nested_scan_y")
    g.nodes.append(helper.make_node("Scan", [state0, x], [final, ys], name=final, body=body, num_scan_inputs=1,
                                    scan_input_axes=[1], scan_output_axes=[1]))
    g.shapes[ys], g.dyn[ys] = tuple(s), g.dyn[x]
    return ys


def _if_with_loop(g, x, s):
    """If (graph input's sum > 0): a counted Loop over x in the then branch (reading x two scopes
    up), a Reshape through Shape in the else branch."""
    cond = g.shape_node("Greater", [g.shape_node("ReduceSum", ["x"], keepdims=0), g.const(np.array(0.0, F32))])

    def then_(inner):
        i, cond_in, y_in = g.name("iter"), g.name("cond"), g.name("y_in")
        body_nodes = []
        y_out = _n(g, body_nodes, "Tanh", [_n(g, body_nodes, "Add", [_n(g, body_nodes, "Mul", [y_in, g.const(
            np.array(0.5, F32))]), x])])
        cond_out = _n(g, body_nodes, "Identity", [cond_in])
        body = helper.make_graph(body_nodes, g.name("loop_body"), [_scalar_info(i, TensorProto.INT64),
                                                                   _scalar_info(cond_in, TensorProto.BOOL), _float_info(y_in)],
                                 [_scalar_info(cond_out, TensorProto.BOOL), _float_info(y_out)])
        return _n(g, inner, "Loop", [g.const(np.array(int(g.rng.integers(1, 4)), np.int64), "trips"), "", x], body=body)

    def else_(inner):
        return _reshaped_softmax(g, inner, x, g.const(np.array(0.25, F32)))

    return g.node("If", [cond], s, g.dyn[x], then_branch=_branch(g, 0, then_), else_branch=_branch(g, 1, else_))
