"""Loops and sequences as exporters write them: a counted Loop with a loop-carried value and a scan
output, the torch.jit.script form stepping over an axis whose length it reads off Shape, Scan over a
sequence axis, and the sequence ops (SplitToSequence / SequenceAt / SequenceConstruct /
ConcatFromSequence)."""

import numpy as np
from onnx import TensorProto, helper

from .graph import F32


def _float_info(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _scalar_info(name, elem_type):
    return helper.make_tensor_value_info(name, elem_type, [])


def _step(g, state: str, inputs: list, nodes: list) -> str:
    """One recurrence step inside a body: tanh(state * a + inputs...), nodes appended to `nodes`."""
    scaled = g.name("body_mul")
    nodes.append(helper.make_node("Mul", [state, g.const(np.array(g.rng.uniform(0.3, 0.9), F32))], [scaled], name=scaled))
    total = scaled
    for value in inputs:
        added = g.name("body_add")
        nodes.append(helper.make_node("Add", [total, value], [added], name=added))
        total = added
    out = g.name("body_tanh")
    nodes.append(helper.make_node("Tanh", [total], [out], name=out))
    return out


def _loop_counted(g, x, s):
    """for i in range(T): y = tanh(y * a + x), every step's y stacked and averaged."""
    trips = int(g.rng.integers(1, 4))
    i, cond_in, y_in = g.name("iter"), g.name("cond"), g.name("y_in")
    nodes = []
    y_out = _step(g, y_in, [x], nodes)
    cond_out, scan_out = g.name("cond_out"), g.name("scan_out")
    nodes += [helper.make_node("Identity", [cond_in], [cond_out], name=cond_out),
              helper.make_node("Relu" if g.rng.integers(2) else "Identity", [y_out], [scan_out], name=scan_out)]
    body = helper.make_graph(nodes, g.name("loop_body"), [_scalar_info(i, TensorProto.INT64),
                                                           _scalar_info(cond_in, TensorProto.BOOL), _float_info(y_in)],
                             [_scalar_info(cond_out, TensorProto.BOOL), _float_info(y_out), _float_info(scan_out)])
    final, stacked = g.name("loop_y"), g.name("loop_scan")
    g.nodes.append(helper.make_node("Loop", [g.const(np.array(trips, np.int64), "trips"), g.const(np.array(True), "true"), x],
                                    [final, stacked], name=final, body=body))
    g.shapes[final], g.dyn[final] = tuple(s), g.dyn[x]
    mean = g.shape_node("ReduceMean", [stacked], axes=[0], keepdims=0)
    return g.node("Add", [final, mean], s)


def _without(s, axis):
    return tuple(d for a, d in enumerate(s) if a != axis)


def _loop_over_axis(g, x, s):
    """torch.jit.script's RNN loop: for i in range(x.shape[a]): h = tanh(h * c + x[:, i]), the
    steps' h stacked (the trip count read off Shape) and moved back to axis a."""
    if len(s) < 3:
        return None
    a = int(g.rng.integers(1, len(s)))
    trips = g.shape_node("Gather", [g.shape_node("Shape", [x]), g.const(np.array(a, np.int64))], axis=0)
    first = g.shape_node("Gather", [x, g.const(np.array(0, np.int64))], axis=a)
    h0 = g.shape_node("Mul", [first, g.const(np.array(0.0, F32))])
    i, cond_in, h_in = g.name("iter"), g.name("cond"), g.name("h_in")
    x_i = g.name("x_i")
    nodes = [helper.make_node("Gather", [x, i], [x_i], name=x_i, axis=a)]
    h_out = _step(g, h_in, [x_i], nodes)
    cond_out, scan_out = g.name("cond_out"), g.name("scan_out")
    nodes += [helper.make_node("Identity", [cond_in], [cond_out], name=cond_out),
              helper.make_node("Identity", [h_out], [scan_out], name=scan_out)]
    body = helper.make_graph(nodes, g.name("loop_body"), [_scalar_info(i, TensorProto.INT64),
                                                           _scalar_info(cond_in, TensorProto.BOOL), _float_info(h_in)],
                             [_scalar_info(cond_out, TensorProto.BOOL), _float_info(h_out), _float_info(scan_out)])
    final, stacked = g.name("loop_h"), g.name("loop_scan")
    g.nodes.append(helper.make_node("Loop", [trips, g.const(np.array(True), "true"), h0], [final, stacked], name=final,
                                    body=body))
    if len(s) > 3 or g.rng.integers(2):  # the last state is a value too (rank >= 2 with the batch)
        g.shapes[final], g.dyn[final] = _without(s, a), frozenset(d - (d > a) for d in g.dyn[x] if d != a)
    perm = [*range(1, a + 1), 0, *range(a + 1, len(s))]
    return g.node("Transpose", [stacked], s, g.dyn[x], perm=perm)


def _scan(g, x, s):
    """Scan over axis a: state = tanh(state * c + x_t), every step's state out along axis a."""
    if len(s) < 3:
        return None
    a = int(g.rng.integers(1, len(s)))
    first = g.shape_node("Gather", [x, g.const(np.array(0, np.int64))], axis=a)
    state0 = g.shape_node("Mul", [first, g.const(np.array(0.0, F32))])
    state_in, x_t = g.name("state_in"), g.name("x_t")
    nodes = []
    state_out = _step(g, state_in, [x_t], nodes)
    y_t = g.name("y_t")
    nodes.append(helper.make_node("Sigmoid" if g.rng.integers(2) else "Identity", [state_out], [y_t], name=y_t))
    body = helper.make_graph(nodes, g.name("scan_body"), [_float_info(state_in), _float_info(x_t)],
                             [_float_info(state_out), _float_info(y_t)])
    final, ys = g.name("scan_state"), g.name("scan_y")
    g.nodes.append(helper.make_node("Scan", [state0, x], [final, ys], name=final, body=body, num_scan_inputs=1,
                                    scan_input_axes=[a], scan_output_axes=[a]))
    g.shapes[ys], g.dyn[ys] = tuple(s), g.dyn[x]
    return ys


def _sequence(g, x, s):
    """x split into a sequence along a fixed axis, its parts taken back out or concatenated in
    another order (SplitToSequence / SequenceAt / SequenceConstruct / ConcatFromSequence)."""
    axes = [a for a in range(1, len(s)) if s[a] >= 2 and g.fixed(x, a)]
    if not axes:
        return None
    a = int(g.rng.choice(axes))
    k = int(g.rng.integers(1, s[a]))
    parts = g.shape_node("SplitToSequence", [x, g.const(np.array([k, s[a] - k], np.int64), "split")], axis=a)
    first = g.shape_node("SequenceAt", [parts, g.const(np.array(0, np.int64))])
    second = g.shape_node("SequenceAt", [parts, g.const(np.array(-1, np.int64))])
    if g.rng.integers(2):  # rotated: [second, relu(first)]
        relu = g.shape_node("Relu", [first])
        rebuilt = g.shape_node("SequenceConstruct", [second, relu])
        return g.node("ConcatFromSequence", [rebuilt], s, g.dyn[x], axis=a)
    if len(s) < 4 and k == s[a] - k:  # two equal halves stacked on a new axis
        stacked = g.shape_node("SequenceConstruct", [first, g.shape_node("Neg", [second])])
        shape = (*s[:a], 2, k, *s[a + 1:])
        return g.node("ConcatFromSequence", [stacked], shape, {d + (d >= a) for d in g.dyn[x]}, axis=a, new_axis=1)
    whole = g.shape_node("ConcatFromSequence", [parts], axis=a)
    return g.node("Add", [whole, x], s)
