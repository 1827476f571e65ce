"""Round trips through the low type in fp16 / bf16 programs, as one rounding step.

A reduced-precision program (compiler/build_precision.py) computes in fp32 and stores in the low
type, so between two ops it says `y = Cast(x, to=low)` then `z = Cast(y, to=float32)`. Each Cast is a
step and a pass over memory; where `y` feeds nothing but Casts back (and Shape / Size, which see the
same shape in `z`), the pair is the single op `z = RoundTo(x, to=low)`: fp32 in, fp32 out, every
value rounded to the nearest low-type value (ties to even, NaN kept, overflow to inf), exactly what
the two Casts give. Each backend names its own op (`round_op`): the CPU's is kernels/cast.py's
`infc.cpu.RoundTo`, the device's runtime/cuda/cast_fold.py's `infc.cuda.RoundTo`.

Rounding is idempotent, so a RoundTo whose input already holds low-type values is dropped and its
readers read the input (elide_repeated_rounding): a RoundTo's own output, a value the backend knows
is rounded (a 16-bit GEMM site's output on the device), and data movement of such values (a reshape
or transpose between two casts). In a bf16 BERT-style encoder that is 10 of the 17 roundings a layer.

Both run where a program is loaded, on the steps as planned: plans keep their Casts.
"""

from __future__ import annotations

LOW_TYPES = {10: "float16", 16: "bfloat16"}  # ONNX TensorProto codes
LOW_CODES = {name: code for code, name in LOW_TYPES.items()}
TO_FLOAT32 = 1
SHAPE_READERS = {"Shape", "Size"}  # read a value's shape only: the rounded fp32 value has the same
NAMED_INPUT_OPS = {"__island__"}  # runtime/executor.ISLAND_OP: an onnxruntime subgraph fed by value name

def fold_cast_pairs(placed: list[tuple[int, dict]], host_values: set[str], keep: set[str],
                    round_op: tuple[str, str]) -> list[tuple[int, dict]]:
    """`placed` (program index, step) with every foldable pair merged into the first Cast's slot; the
    Casts back are dropped and Shape / Size readers of the low value read the rounded one. `host_values`
    stay as they are (shape arithmetic runs on the host) and so do values in `keep` (graph outputs).
    Casts the build gave to onnxruntime (`tactic`) stay: they run inside its sessions."""
    consumers: dict[str, list[int]] = {}
    for position, (_, step) in enumerate(placed):
        for name in step["inputs"]:
            if name:
                consumers.setdefault(name, []).append(position)
    folded, dropped, renamed = {}, set(), {}
    for position, (_, step) in enumerate(placed):
        to = (step.get("attrs") or {}).get("to")
        if not (_is_cast(step) and to in LOW_TYPES and step["inputs"][0] not in host_values) or step.get("tactic"):
            continue
        low = step["outputs"][0]
        users = consumers.get(low, [])
        backs = [u for u in users if _is_cast(placed[u][1]) and not placed[u][1].get("tactic")
                 and (placed[u][1].get("attrs") or {}).get("to") == TO_FLOAT32]
        shape_readers = [u for u in users if _domain(placed[u][1]) == "" and placed[u][1]["op"] in SHAPE_READERS]
        if len(backs) != 1 or len(backs) + len(shape_readers) != len(users) or low in keep:
            continue
        back = placed[backs[0]][1]
        folded[position] = {"op": round_op[1], "domain": round_op[0], "name": step.get("name", ""),
                            "inputs": [step["inputs"][0]], "outputs": list(back["outputs"]), "attrs": {"to": to}}
        dropped.add(backs[0])
        renamed.update((u, (low, back["outputs"][0])) for u in shape_readers)
    result = []
    for position, (index, step) in enumerate(placed):
        if position in dropped:
            continue
        if position in renamed:
            low, rounded = renamed[position]
            step = {**step, "inputs": [rounded if name == low else name for name in step["inputs"]]}
        result.append((index, folded.get(position, step)))
    return result


# Ops that only move or select values: their outputs hold values of their data inputs (by position;
# None: every input). The other inputs are shapes, axes or indexes.
MOVEMENT_DATA_INPUTS = {"Reshape": (0,), "Transpose": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,),
                        "Split": (0,), "Slice": (0,), "Identity": (0,), "Expand": (0,), "Gather": (0,),
                        "Tile": (0,), "Concat": None}


def elide_repeated_rounding(placed: list[tuple[int, dict]], rounded: dict[str, int], keep: set[str],
                            round_op: tuple[str, str]) -> list[tuple[int, dict]]:
    """`placed` without the RoundTo steps whose input already holds values of their type; their
    readers read that input instead. `rounded`: values known to hold low-type values (name -> type
    code), such as GEMM outputs rounded by cuBLAS. Values in `keep` (graph outputs) stay."""
    # an island's session names its inputs as the program did: a value it reads is never renamed
    keep = set(keep) | {name for _, step in placed if step["op"] in NAMED_INPUT_OPS for name in step["inputs"]}
    rounded, rename, kept = dict(rounded), {}, []
    for index, step in placed:
        inputs = [rename.get(name, name) for name in step["inputs"]]
        if inputs != list(step["inputs"]):
            step = {**step, "inputs": inputs}
        domain, op = step.get("domain") or "", step["op"]
        if (domain, op) == round_op:
            to, source, target = step["attrs"]["to"], inputs[0], step["outputs"][0]
            if rounded.get(source) == to and target not in keep:
                rename[target] = source
                continue
            rounded[target] = to
        elif domain == "" and op in MOVEMENT_DATA_INPUTS:
            positions = MOVEMENT_DATA_INPUTS[op]
            data = [n for n in inputs if n] if positions is None else [inputs[i] for i in positions if i < len(inputs)]
            types = {rounded.get(name) for name in data}
            if data and len(types) == 1 and None not in types:
                to = types.pop()
                rounded.update((name, to) for name in step["outputs"] if name)
        kept.append((index, step))
    return kept


def _domain(step: dict) -> str:
    domain = step.get("domain") or ""
    return "" if domain == "ai.onnx" else domain


def _is_cast(step: dict) -> bool:
    return _domain(step) == "" and step["op"] == "Cast"


CPU_ROUND_OP = ("infc.cpu", "RoundTo")  # kernels/cast.py round_to


def fold_rounding(steps: list[dict], keep: set[str]) -> list[dict]:
    """The CPU executor's program: Cast pairs folded into RoundTo, repeated roundings dropped (a
    tuned GEMM with `round_to` rounds its own output: kernels/tuned_gemm.py; not in onnxruntime)."""
    if not any(_is_cast(step) and (step.get("attrs") or {}).get("to") in LOW_TYPES for step in steps):
        return steps
    placed = fold_cast_pairs(list(enumerate(steps)), set(), keep, CPU_ROUND_OP)
    rounded = {step["outputs"][0]: step["attrs"]["round_to"] for step in steps
               if (step.get("domain"), step["op"]) == ("infc.cpu", "TunedMatMul") and not step.get("tactic")
               and (step.get("attrs") or {}).get("round_to") in LOW_TYPES}
    return [step for _, step in elide_repeated_rounding(placed, rounded, keep, CPU_ROUND_OP)]
