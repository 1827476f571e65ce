"""One generated CUDA kernel per elementwise chain (infc.cpu.ElementwiseChain, compiler/lower_fuse.py):
the chain's ops become float expressions in registers (templates/chain.cuh indexes and broadcasts),
so the chain reads each input once and writes its output once instead of one launch per op.

Expressions follow the CPU chain kernel (runtime/kernels/chain.py) op for op: Sigmoid in its tanh form,
HardSigmoid / HardSwish / Clip as clamps, LeakyRelu as max(x, alpha x) (lowering fuses 0 <= alpha <= 1).
Clip bounds are inputs (opset 11+, scalars broadcast like any input) or attributes (older opsets).
float32 only: a chain run on other dtypes takes the op-by-op array path (runtime/cuda/ops_elementwise.py).
"""

from __future__ import annotations

import hashlib
import json

from .generate import template_text

BLOCK = 256
FORMS = {  # op -> C expression over the operand expressions a, b, c and attrs
    "Add": lambda a, b, at: f"({a} + {b})", "Sub": lambda a, b, at: f"({a} - {b})",
    "Mul": lambda a, b, at: f"({a} * {b})", "Div": lambda a, b, at: f"({a} / {b})",
    "Relu": lambda a, b, at: f"fmaxf({a}, 0.0f)", "Neg": lambda a, b, at: f"(-{a})",
    "Abs": lambda a, b, at: f"fabsf({a})", "Exp": lambda a, b, at: f"expf({a})",
    "Sqrt": lambda a, b, at: f"sqrtf({a})", "Tanh": lambda a, b, at: f"tanhf({a})",
    "Sigmoid": lambda a, b, at: f"(0.5f * tanhf({a} * 0.5f) + 0.5f)",
    "HardSigmoid": lambda a, b, at: f"chain_clip({a} * {_f(at.get('alpha', 0.2))} + {_f(at.get('beta', 0.5))}, 0.0f, 1.0f)",
    "HardSwish": lambda a, b, at: f"({a} * chain_clip({a} * {_f(1 / 6)} + 0.5f, 0.0f, 1.0f))",
    "LeakyRelu": lambda a, b, at: f"fmaxf({a}, {a} * {_f(at.get('alpha', 0.01))})",
}


# Standalone activation steps that are several array launches op by op (a sigmoid is a tanh, a multiply
# and an add); the build gives each a one-op chain kernel, so it is one launch (compile_chains).
SINGLE_OP_CHAINS = {("", "Sigmoid"), ("", "HardSigmoid"), ("", "HardSwish"), ("", "LeakyRelu"),
                    ("com.microsoft", "QuickGelu")}


class UnsupportedChain(ValueError):
    pass


def chain_ops(step: dict) -> list[dict] | None:
    """The ops a chain kernel would compute for this program step: an ElementwiseChain's own list, a
    one-op list for a standalone activation of SINGLE_OP_CHAINS, else None."""
    domain = step.get("domain") or ""
    if (domain, step["op"]) == ("infc.cpu", "ElementwiseChain"):
        return step["attrs"]["ops"]
    if (domain, step["op"]) in SINGLE_OP_CHAINS and len(step["inputs"]) == 1:
        return [{"op": step["op"], "domain": domain, "attrs": dict(step.get("attrs") or {}), "args": [0]}]
    return None


def _f(value: float) -> str:
    return f"{float(value)!r}f".replace("inf", "INFINITY")


def _expression(op: dict, operands: list[str | None]) -> str:
    name, attrs = op["op"], op.get("attrs") or {}
    if (op.get("domain") or "", name) == ("com.microsoft", "QuickGelu"):  # x * sigmoid(alpha x), sigmoid as above
        a, alpha = operands[0], _f(attrs.get("alpha", 1.702))
        return f"({a} * (0.5f * tanhf({a} * {alpha} * 0.5f) + 0.5f))"
    if (op.get("domain") or "") != "":
        raise UnsupportedChain(f"chain op {op.get('domain')}.{name}")
    if name == "Clip":
        if len(operands) == 1:  # opset < 11: attributes
            low, high = attrs.get("min"), attrs.get("max")
            low, high = (None if low is None else _f(low)), (None if high is None else _f(high))
        else:
            low, high = operands[1], (operands[2] if len(operands) > 2 else None)
        value = operands[0]
        value = value if low is None else f"fmaxf({value}, {low})"
        return value if high is None else f"fminf({value}, {high})"
    if name not in FORMS:
        raise UnsupportedChain(f"chain op {name}")
    return FORMS[name](operands[0], operands[1] if len(operands) > 1 else None, attrs)


def chain_entry(ops: list[dict], num_inputs: int) -> str:
    """The kernel's name: the chain's content, so identical chains share one cubin."""
    digest = hashlib.sha256(json.dumps([ops, num_inputs], sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"infc_chain_{digest}"


def arg_types(num_inputs: int) -> list[tuple[str, str]]:
    """(C type, name) of the kernel arguments, in launch order (the launcher and the emulator use it)."""
    return ([("const float*", f"in{k}") for k in range(num_inputs)]
            + [("float*", "out"), ("const long long*", "layout"), ("long long", "n"), ("int", "rank")])


def render_chain(ops: list[dict], num_inputs: int) -> tuple[str, str]:
    """(source, entry) of the chain's kernel. Raises UnsupportedChain for an op it has no form for."""
    lines = []
    for k, op in enumerate(ops):
        operands = [None if a is None else f"x{a}" if a >= 0 else f"r{-1 - a}" for a in op["args"]]
        lines.append(f"        const float r{k} = {_expression(op, operands)};")
    entry = chain_entry(ops, num_inputs)
    loads = "\n".join(f"        const float x{k} = in{k}[offset[{k}]];" for k in range(num_inputs))
    signature = ", ".join(f"{t} {n}" for t, n in arg_types(num_inputs))
    body = (f'extern "C" __global__ void __launch_bounds__({BLOCK})\n{entry}({signature}) {{\n'
            f"    const long long step = (long long)gridDim.x * blockDim.x;\n"
            f"    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{\n"
            f"        long long offset[{num_inputs}];\n"
            f"        chain_offsets<{num_inputs}>(i, layout, rank, offset);\n"
            f"{loads}\n" + "\n".join(lines) + f"\n        out[i] = r{len(ops) - 1};\n    }}\n}}\n")
    source = "\n".join((f"// generated by infc.compiler.codegen for an elementwise chain of {len(ops)} ops",
                        "#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif",
                        template_text("chain.cuh"), body))
    return source, entry
