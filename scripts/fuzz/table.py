"""The op table, as data: name -> (ranks of the value it applies to, builder). A seed draws names
from it uniformly among those that take the current value's rank; a name listed twice (conv2, mha2,
embeddings2) is drawn twice as often. The order is part of a seed's meaning: append, never reorder.

The profile levels sit here too: the start shapes, how far a varying axis moves at min and max."""

from .ops_attention import _embeddings, _masked_fill, _mha
from .ops_control import _if
from .ops_dtypes import _bit_ops, _bool_logic, _cast_chain, _float_stretch, _int_arith
from .ops_corners import _empty_parts, _negative_axes, _outer_broadcast, _scalar_stat
from .ops_elementwise import (_binary_const, _clip, _gelu_erf, _gelu_tanh, _powers, _prelu, _residual, _silu, _unary,
                              _variadic)
from .ops_image import _conv, _conv1d, _conv_transpose, _depth_space, _pool, _resize
from .ops_index import (_argmax, _expand_to_shape, _gather_nd, _nonzero, _range_ramp, _scatter_elements,
                        _scatter_nd, _where_broadcast)
from .ops_linear import _attention, _gemm, _matmul, _matmul_self
from .ops_loop import _loop_counted, _loop_over_axis, _scan, _sequence
from .ops_more import (_conv_transpose_grouped, _einsum, _group_norm_op, _half_island, _pad_crop, _resize_modes,
                       _rms_norm_op)
from .ops_nested import _if_with_loop, _loop_with_if, _scan_with_if
from .ops_norm import (_batchnorm, _group_norm_decomposed, _instance_norm, _layernorm, _layernorm_decomposed, _reduce,
                       _reduce_spatial, _rmsnorm, _softmax)
from .ops_quant import _matmul_integer, _qdq_add, _qdq_conv, _qdq_matmul, _qlinear_conv, _qlinear_matmul
from .ops_shape import (_concat, _cumsum, _expand, _flatten, _gather, _pad, _reshape_merge, _reshape_split, _shape_reshape,
                        _slice, _split, _tile, _topk, _transpose, _unsqueeze_squeeze, _where)

ANY = (2, 3, 4)

OPS = {
    "relu": (ANY, _unary("Relu")), "sigmoid": (ANY, _unary("Sigmoid")), "tanh": (ANY, _unary("Tanh")),
    "leaky": (ANY, _unary("LeakyRelu", alpha=0.1)), "hardswish": (ANY, _unary("HardSwish")),
    "hardsigmoid": (ANY, _unary("HardSigmoid", alpha=0.2, beta=0.5)), "softplus": (ANY, _unary("Softplus")),
    "abs": (ANY, _unary("Abs")), "neg": (ANY, _unary("Neg")), "elu": (ANY, _unary("Elu", alpha=1.0)),
    "add": (ANY, _binary_const("Add")), "mul": (ANY, _binary_const("Mul")), "sub": (ANY, _binary_const("Sub")),
    "div": (ANY, _binary_const("Div")), "residual": (ANY, _residual), "matmul": (ANY, _matmul),
    "gemm": ((2,), _gemm), "transpose": ((3, 4), _transpose), "merge": ((3, 4), _reshape_merge),
    "split": ((2, 3), _reshape_split), "softmax": (ANY, _softmax), "ln_decomposed": (ANY, _layernorm_decomposed),
    "layernorm": (ANY, _layernorm), "gelu": (ANY, _gelu_erf), "silu": (ANY, _silu), "reduce": ((3, 4), _reduce),
    "concat": (ANY, _concat), "slice": (ANY, _slice), "unsqueeze": ((2, 3), _unsqueeze_squeeze),
    "where": (ANY, _where), "clip": (ANY, _clip), "attention": ((3,), _attention),
    "conv": ((4,), _conv), "conv2": ((4,), _conv), "batchnorm": ((4,), _batchnorm), "pool": ((4,), _pool),
    "resize": ((4,), _resize), "flatten": ((3, 4), _flatten), "pad": (ANY, _pad),
    "shape_reshape": ((3, 4), _shape_reshape), "split_halves": (ANY, _split), "expand": (ANY, _expand),
    "tile": (ANY, _tile), "gather": (ANY, _gather), "matmul_self": ((3, 4), _matmul_self),
    "conv_transpose": ((4,), _conv_transpose), "instance_norm": ((3, 4), _instance_norm),
    "group_norm": ((4,), _group_norm_decomposed), "prelu": (ANY, _prelu), "variadic": (ANY, _variadic),
    "powers": (ANY, _powers), "depth_space": ((4,), _depth_space), "reduce_spatial": ((4,), _reduce_spatial),
    "conv1d": ((3,), _conv1d), "gelu_tanh": (ANY, _gelu_tanh), "rmsnorm": (ANY, _rmsnorm), "cumsum": (ANY, _cumsum),
    "topk": (ANY, _topk), "mha": ((3,), _mha), "mha2": ((3,), _mha), "masked_fill": ((3,), _masked_fill),
    "if": (ANY, _if), "embeddings": ((3,), _embeddings), "embeddings2": ((3,), _embeddings),
}

# forms added after the first ~60: drawn by default, left out with --forms classic (whose seeds then
# build the models they always built)
NEW_OPS = {
    "qdq_matmul": (ANY, _qdq_matmul), "qdq_conv": ((4,), _qdq_conv), "qdq_add": (ANY, _qdq_add),
    "qlinear_matmul": (ANY, _qlinear_matmul), "qlinear_conv": ((4,), _qlinear_conv),
    "matmul_integer": (ANY, _matmul_integer), "loop_counted": (ANY, _loop_counted),
    "loop_over_axis": ((3, 4), _loop_over_axis), "scan": ((3, 4), _scan), "sequence": (ANY, _sequence),
    "argmax": ((3, 4), _argmax), "gather_nd": ((3, 4), _gather_nd), "scatter_elements": (ANY, _scatter_elements),
    "where_broadcast": (ANY, _where_broadcast), "expand_to_shape": (ANY, _expand_to_shape),
    "range_ramp": (ANY, _range_ramp), "nonzero": (ANY, _nonzero), "einsum": (ANY, _einsum),
    "group_norm_op": ((3, 4), _group_norm_op), "rms_norm_op": (ANY, _rms_norm_op), "resize_modes": ((4,), _resize_modes),
    "conv_transpose_grouped": ((4,), _conv_transpose_grouped), "pad_crop": (ANY, _pad_crop),
    "half_island": (ANY, _half_island), "scatter_nd": ((3, 4), _scatter_nd),
}
# forms beyond float32 and the broadcasting corners: drawn by default; --forms wide leaves them out
# (its seeds build the models "all" built before them), --forms edge draws them beside the first table
EDGE_OPS = {
    "int_arith": (ANY, _int_arith), "bit_ops": (ANY, _bit_ops), "bool_logic": (ANY, _bool_logic),
    "float_stretch": (ANY, _float_stretch), "cast_chain": (ANY, _cast_chain),
    "scalar_stat": (ANY, _scalar_stat), "outer_broadcast": (ANY, _outer_broadcast), "empty_parts": (ANY, _empty_parts),
    "negative_axes": (ANY, _negative_axes), "loop_with_if": (ANY, _loop_with_if), "scan_with_if": ((3, 4), _scan_with_if),
    "if_with_loop": (ANY, _if_with_loop),
}
# forms whose ops opsets 7-12 have (their seeds written there: builder.OPSETS_BY_FORMS["old"])
OLD_FORMS = ("relu", "sigmoid", "tanh", "leaky", "abs", "neg", "elu", "add", "mul", "sub", "div", "residual", "matmul",
             "gemm", "transpose", "merge", "split", "softmax", "ln_decomposed", "gelu", "silu", "reduce", "concat",
             "slice", "unsqueeze", "where", "clip", "conv", "batchnorm", "pool", "resize", "flatten", "pad",
             "shape_reshape", "split_halves", "expand", "tile", "gather", "matmul_self", "conv_transpose",
             "instance_norm", "prelu", "variadic", "powers", "depth_space", "reduce_spatial", "conv1d", "gelu_tanh",
             "rmsnorm", "topk", "mha", "masked_fill", "embeddings", "scalar_stat", "outer_broadcast", "empty_parts")
FORMS = {"classic": OPS, "wide": {**OPS, **NEW_OPS}, "all": {**OPS, **NEW_OPS, **EDGE_OPS},
         "edge": {**OPS, **EDGE_OPS, **{f"{k}2": v for k, v in EDGE_OPS.items()}}}
FORMS["old"] = {k: FORMS["all"][k] for k in OLD_FORMS}
# forms a seed does not mix, by the flag the first one drawn sets: onnxruntime computes a float16
# stretch between Casts in float32 on the CPU (its inserted Casts cancel the model's), so a
# QuantizeLinear after one rounds its ties one way there and the other way in infc, which follows
# the model; neither reference can judge that
# the same holds for a Floor that makes a float exact for the integer forms (ops_dtypes.py)
EXACT_FORMS = {"int_arith", "bit_ops", "bool_logic", "cast_chain"}
EXCLUDED_BY_FLAG = {"fp16": {"qdq_matmul", "qdq_conv", "qdq_add", "qlinear_matmul", "qlinear_conv", "matmul_integer",
                             *EXACT_FORMS, *(f"{k}2" for k in EXACT_FORMS)},
                    "quantized": {"half_island"}, "exact_ints": {"half_island"}}

# (shape at the opt level, the axes that may vary): images of any height and width, sequences of any length
START_SHAPES = (((1, 6, 10, 12), {2, 3}), ((1, 4, 8, 8), {2, 3}), ((1, 12, 16), {1}), ((1, 7, 24), {1}), ((1, 20), set()))

AXIS_LEVELS = {"min": -2, "opt": 0, "max": 3}  # a varying axis' size at each level, from its opt size

DIM_NAMES = {1: "len", 2: "height", 3: "width"}

MAX_ELEMENTS = 1 << 16  # per value at batch 1: keeps a graph's build and run well under a second
BATCHES = {"min": 1, "opt": 2, "max": 3}  # the batch at each profile level
