"""Control flow forms: If with branches over outer values."""

import numpy as np
from onnx import TensorProto, helper

from .graph import F32


BRANCH_OPS = ("relu", "sigmoid", "tanh", "add", "mul", "gelu", "silu", "softmax", "layernorm", "abs", "leaky",
              "hardswish", "powers", "clip", "rmsnorm")


def _if(g, x, s):
    """If on a value-dependent condition, each branch a short chain over x (an outer value); with
    even odds both branches name their output alike, as Optimum's merged decoders do."""
    # on the graph input: a sum of intermediate values can sit within rounding of 0 (a normalized
    # row sums to 0), and then infc and onnxruntime rightly take different branches
    from .table import OPS  # the table lists _if itself

    total = g.shape_node("ReduceSum", ["x"], keepdims=0)
    cond = g.shape_node("Greater", [total, g.const(np.array(0.0, F32))])
    shared = f"{g.name('branch')}_out" if g.rng.integers(2) else None
    branches = []
    for k in range(2):
        start, known = len(g.nodes), set(g.shapes)
        y = x
        for _ in range(int(g.rng.integers(1, 4))):
            made = OPS[str(g.rng.choice(BRANCH_OPS))][1](g, y, s)
            if made is not None and g.shapes[made] == tuple(s):
                y = made
        inner = g.nodes[start:]
        del g.nodes[start:]
        for name in set(g.shapes) - known:  # the branch's values are not the main graph's
            del g.shapes[name], g.dyn[name]
        out = shared or g.name(f"branch{k}_out")
        inner.append(helper.make_node("Identity", [y], [out], name=out))
        branches.append(helper.make_graph(inner, f"branch{k}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]))
    return g.node("If", [cond], s, g.dyn[x], then_branch=branches[0], else_branch=branches[1])
