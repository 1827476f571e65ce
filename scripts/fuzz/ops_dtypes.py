"""Forms beyond float32: integer arithmetic (int32 / int64, and the unsigned types bit shifts need),
bool logic and comparisons feeding Where, float64 and float16 elementwise stretches, and Cast chains
between them. Each starts from the float value it is given, made exact first (Floor of a power-of-two
multiple, so every type down to uint8 and float16 holds it), and ends back in float32 so the walk
goes on; the typed value itself is sometimes a graph output too, so its dtype is checked.

A Floor of a value one ulp apart in infc and onnxruntime can land one integer apart: such seeds carry
the flag "exact_ints" and are judged on three feeds (check.py), as the quantized ones are."""

import numpy as np
from onnx import TensorProto

from .graph import F32

INT_TYPES = {"int32": (TensorProto.INT32, np.int32), "int64": (TensorProto.INT64, np.int64)}
UINT_TYPES = {"uint8": (TensorProto.UINT8, np.uint8), "uint16": (TensorProto.UINT16, np.uint16),
              "uint32": (TensorProto.UINT32, np.uint32), "uint64": (TensorProto.UINT64, np.uint64)}

# integer binary ops with a constant: (op, attrs, the constant's range); divisors never 0, Mod with
# fmod=0 follows the divisor's sign (Python's %), fmod=1 the dividend's (C's fmod)
INT_BINARY = (("Add", {}, (-9, 10)), ("Sub", {}, (-9, 10)), ("Mul", {}, (-4, 5)), ("Div", {}, (1, 6)),
              ("Div", {}, (-6, 0)), ("Mod", {"fmod": 0}, (1, 6)), ("Mod", {"fmod": 0}, (-6, 0)),
              ("Mod", {"fmod": 1}, (1, 6)), ("Mod", {"fmod": 1}, (-6, 0)), ("Max", {}, (-3, 4)), ("Min", {}, (-3, 4)))
INT_UNARY = ("Abs", "Neg", "Sign", "Identity")
# bitwise ops are opset 18: written in the LATE domain, the seed then goes to opset 23
BITWISE = ("BitwiseAnd", "BitwiseOr", "BitwiseXor")
# float stretches: elementwise ops in float64 or float16 between Casts
FLOAT_CHAIN = ("Relu", "Tanh", "Sigmoid", "Abs", "Neg", "Exp", "Floor", "Ceil", "Round")  # no Erf: onnxruntime has it in float32 only
FLOAT_TYPES = {"float64": (TensorProto.DOUBLE, np.float64), "float16": (TensorProto.FLOAT16, np.float16)}
# a Cast chain walks these types; the values are small whole numbers >= 0, exact in every one
CAST_TYPES = (TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT16,
              TensorProto.UINT32, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.BOOL)


def _exact(g, x, scale: float, non_negative: bool = False) -> str:
    g.flags.add("exact_ints")
    y = g.shape_node("Floor", [g.shape_node("Mul", [x, g.const(np.array(scale, F32))])])
    return g.shape_node("Abs", [y]) if non_negative else y


def _int_const(g, rng_range, s, np_type):
    """A constant broadcasting against s: rank 0, [last], or the last two axes with size-1 leads."""
    low, high = rng_range
    kind = int(g.rng.integers(3))
    shape = () if kind == 0 else (s[-1],) if kind == 1 else (1,) * (len(s) - 2) + tuple(s[-2:])
    value = g.rng.integers(low, high, size=shape)
    return g.const(value.astype(np_type), "ci")


def _back_to_float(g, typed: str, x: str, s, elem: int) -> str:
    """typed as float32, scaled to x's size and added to x; sometimes typed is an output too."""
    if g.rng.integers(3) == 0:
        g.typed_outputs.append((typed, elem, tuple(s), g.dyn[x]))
    as_float = g.shape_node("Cast", [typed], to=TensorProto.FLOAT)
    scaled = g.shape_node("Mul", [as_float, g.const(np.array(0.125, F32))])
    return g.node("Add", [x, scaled], s)


def _int_arith(g, x, s):
    """x as int32 / int64, then 1-3 integer ops (constants, Abs / Neg / Sign, x with itself)."""
    name = str(g.rng.choice(list(INT_TYPES)))
    elem, np_type = INT_TYPES[name]
    v = g.shape_node("Cast", [_exact(g, x, float(g.rng.choice([4.0, 16.0])))], to=elem)
    for _ in range(int(g.rng.integers(1, 4))):
        pick = int(g.rng.integers(len(INT_BINARY) + len(INT_UNARY) + 1))
        if pick < len(INT_BINARY):
            op, attrs, span = INT_BINARY[pick]
            if not g.fixed(x, -1, -2):
                const = g.const(g.rng.integers(*span, size=()).astype(np_type), "ci")
            else:
                const = _int_const(g, span, s, np_type)
            v = g.shape_node(op, [v, const], **attrs)
        elif pick < len(INT_BINARY) + len(INT_UNARY):
            v = g.shape_node(INT_UNARY[pick - len(INT_BINARY)], [v])
        else:  # with itself: v * v stays far inside int32 for |v| < 2^15
            v = g.shape_node(str(g.rng.choice(["Mul", "Add", "Max", "Sub"])), [v, v])
        v = g.shape_node("Clip", [v, g.const(np.array(-1000, np_type)), g.const(np.array(1000, np_type))]) \
            if g.rng.integers(4) == 0 else v
    return _back_to_float(g, v, x, s, elem)


def _bit_ops(g, x, s):
    """Unsigned values shifted (BitShift) and masked (BitwiseAnd / Or / Xor / Not, opset 18)."""
    from .ops_more import _late

    name = str(g.rng.choice(list(UINT_TYPES)))
    elem, np_type = UINT_TYPES[name]
    v = g.shape_node("Cast", [_exact(g, x, 8.0, non_negative=True)], to=elem)
    for _ in range(int(g.rng.integers(1, 4))):
        pick = int(g.rng.integers(3))
        if pick == 0:
            shift = g.const(g.rng.integers(0, 3, size=() if not g.fixed(x, -1) else (s[-1],)).astype(np_type), "shift")
            v = g.shape_node("BitShift", [v, shift], direction=str(g.rng.choice(["LEFT", "RIGHT"])))
        elif pick == 1:
            mask = g.const(np.array(int(g.rng.integers(1, 256)), np_type), "mask")
            g.nodes.append(_typed_node(g, str(g.rng.choice(BITWISE)), [v, mask], **_late(g)))
            v = g.nodes[-1].output[0]
        else:
            g.nodes.append(_typed_node(g, "BitwiseNot", [v], **_late(g)))
            inverted = g.nodes[-1].output[0]
            # the top bits of Not(v) are all set: keep the low byte, so any width means the same
            g.nodes.append(_typed_node(g, "BitwiseAnd", [inverted, g.const(np.array(255, np_type), "mask")], **_late(g)))
            v = g.nodes[-1].output[0]
    return _back_to_float(g, v, x, s, elem)


def _typed_node(g, op, inputs, **attrs):
    from onnx import helper

    out = g.name(op.lower())
    return helper.make_node(op, inputs, [out], name=out, **attrs)


def _bool_logic(g, x, s):
    """Comparisons of x (float and exact integer) combined by And / Or / Xor / Not, then Where."""
    ints = g.shape_node("Cast", [_exact(g, x, 2.0)], to=TensorProto.INT64)
    conditions = [g.shape_node("Greater", [x, g.const(np.array(g.rng.uniform(-0.5, 0.5), F32))]),
                  g.shape_node("Less", [x, g.const(np.array(g.rng.uniform(-0.5, 0.5), F32))]),
                  g.shape_node("Equal", [ints, g.const(np.array(int(g.rng.integers(-2, 3)), np.int64))]),
                  g.shape_node(str(g.rng.choice(["GreaterOrEqual", "LessOrEqual"])),
                               [ints, g.const(np.array(int(g.rng.integers(-2, 3)), np.int64))])]
    order = g.rng.permutation(len(conditions))
    v = conditions[order[0]]
    for k in order[1:int(g.rng.integers(2, 5))]:
        v = g.shape_node(str(g.rng.choice(["And", "Or", "Xor"])), [v, conditions[k]])
        if g.rng.integers(3) == 0:
            v = g.shape_node("Not", [v])
    if g.rng.integers(3) == 0:
        g.typed_outputs.append((v, TensorProto.BOOL, tuple(s), g.dyn[x]))
    if g.rng.integers(2):  # the other side x scaled, not a constant: rows all false would be constant
        # rows, whose layer norm is all rounding noise (fuzz_graphs --forms edge seed 2186)
        other = g.shape_node("Mul", [x, g.const(np.array(g.rng.uniform(-1, 1), F32))])
        return g.node("Where", [v, x, other], s)
    return g.node("Add", [x, g.shape_node("Cast", [v], to=TensorProto.FLOAT)], s)


def _float_stretch(g, x, s):
    """Elementwise ops in float64 or float16 between Casts (float16 seeds carry its tolerance)."""
    name = str(g.rng.choice(list(FLOAT_TYPES)))
    if "exact_ints" in g.flags:  # onnxruntime's float16 stretch is float32 inside: a Floor after it flips
        name = "float64"
    elem, np_type = FLOAT_TYPES[name]
    if name == "float16":
        g.flags.add("fp16")
    v = g.shape_node("Cast", [x], to=elem)
    for _ in range(int(g.rng.integers(1, 4))):
        pick = int(g.rng.integers(3))
        if pick == 0:
            v = g.shape_node(str(g.rng.choice(FLOAT_CHAIN)), [v])
        elif pick == 1:
            op = str(g.rng.choice(["Add", "Mul", "Sub", "Max", "Min", "Pow"]))
            value = g.rng.uniform(0.5, 1.5) if op != "Pow" else 2.0
            v = g.shape_node(op, [v, g.const(np.array(value, np_type))])
        else:
            v = g.shape_node("Div", [v, g.shape_node("Add", [g.shape_node("Abs", [v]), g.const(np.array(1.0, np_type))])])
    if g.rng.integers(3) == 0:
        g.typed_outputs.append((v, elem, tuple(s), g.dyn[x]))
    return g.node("Cast", [v], s, g.dyn[x], to=TensorProto.FLOAT)


def _cast_chain(g, x, s):
    """Small whole numbers >= 0 through 2-4 Casts among the integer, float and bool types."""
    v = _exact(g, x, 4.0, non_negative=True)
    elem = TensorProto.FLOAT
    for _ in range(int(g.rng.integers(2, 5))):
        elem = int(g.rng.choice([t for t in CAST_TYPES if t != elem]))
        v = g.shape_node("Cast", [v], to=elem)
    if elem not in (TensorProto.FLOAT, TensorProto.BOOL) and g.rng.integers(2):
        g.typed_outputs.append((v, elem, tuple(s), g.dyn[x]))
    return g.node("Add", [x, g.shape_node("Cast", [v], to=TensorProto.FLOAT)], s)
