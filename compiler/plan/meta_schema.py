"""The shape of a plan's header, as data, checked when a plan is read.

The section checksums vouch for the bytes and the header's own sha256 for the header; neither
vouches for a header that was edited and re-hashed, or written by an infc whose layout differs.
Readers index the header freely (`step["inputs"]`, `info["offset"] <= ...`), so a field of the
wrong type surfaced as an internal error deep in a kernel or in `inspect`. Checking the fields
readers use here turns every such plan into one error naming the plan and the field.

Records list the keys readers rely on; a key ending in "?" may be absent; keys not listed are
allowed (newer builders add report fields freely). Only fields some reader uses are described.
"""

from __future__ import annotations

# A type is a name ("str", "int", "size" (an int >= 0), "count" (an int >= 1), "number", "bool", "dtype", "any", "null"), a record (a dict of
# key -> type), or a tuple: ("list", T), ("map", T) (str keys), ("either", T1, T2, ...).
DIM = ("either", "int", "str", "null")  # a fixed or symbolic dimension (null: unknown)
SIZES = ("list", "size")
VALUE_SPEC = {"name": "str", "dtype": "dtype", "shape?": ("either", ("list", DIM), "null")}
STEP = {"op": "str", "domain?": "str", "name?": "str", "inputs": ("list", "str"), "outputs": ("list", "str"),
        "attrs?": ("map", "any"), "section?": "str", "ops?": ("list", "str"),
        "tactic?": "str", "tactic_threads?": ("either", "count", "null"), "tactic_ratio?": ("either", "number", "null"),
        "tactic_group?": "int", "tactic_dtypes?": ("map", "dtype"), "tactic_lengths?": ("map", "size"),
        # a session input's rank, or (a graph input the model fixes) its dims: runtime/vendor_op.py
        "tactic_ranks?": ("map", ("either", "size", ("list", ("either", "size", "null")))), "kernel?": "str", "bf16_tiles?": "bool"}
WEIGHT = {"section": "str", "offset": "size", "dtype": "dtype", "shape": SIZES, "encoding?": "str"}
RANGE = {"min": SIZES, "opt": SIZES, "max": SIZES}  # the builder writes every input's profile as a range
DECODER = {"num_layers": "count", "num_heads": "count", "num_kv_heads": "count", "head_dim": "count",
           "max_model_len": "count", "block_size": "count", "logits": "str", "vocab_size": "count",
           "gathers_logits?": "bool",
           "eos_token_ids?": ("list", "int"), "chat_template?": ("either", "str", "null")}
PLAN = {
    "kind?": "str",
    "opset?": "int",
    "target": {"kind": "str"},
    "model?": {"name?": "str", "sha256?": "str"},
    "inputs": ("list", VALUE_SPEC),
    "outputs": ("list", VALUE_SPEC),
    "program": ("list", STEP),
    "weights": ("map", WEIGHT),
    "profile?": {"inputs?": ("map", RANGE),
                 "decode?": {"max_num_seqs?": "count", "max_num_batched_tokens?": "count", "block_size?": "count",
                             "num_kv_blocks?": ("either", "count", "str"), "max_model_len?": "count"}},
    "precision?": ("either", "null", ("map", "any")),
    "memory?": {"arena_bytes": "size", "sum_activation_bytes": "size", "offsets?": ("map", "size"),
                "sizes?": ("map", "size")},
    "defaulted_inputs?": ("list", "str"),
    "decoder?": DECODER,
    "tuning?": ("list", {"shape?": "str", "winner?": ("either", "str", "null"),
                         "winner_pct_of_vendor?": ("either", "number", "null"),
                         "candidates?": ("list", {"config": "str", "pct_of_vendor?": ("either", "number", "null")})}),
    "fallback_ops?": ("list", "str"),
    "conv_tactics?": {"program_ms?": ("map", ("either", "number", "null"))},
}


SECTION = {"name": "str", "offset": "size", "size": "size", "sha256": "str"}
HEADER = {"meta": PLAN, "sections": ("list", SECTION)}


def _where(path: tuple) -> str:
    text = ""
    for part in path:
        text = f"{text}[{part}]" if isinstance(part, int) else (f"{text}.{part}" if text else part)
    return text or "the header"


def _describe(kind) -> str:
    if isinstance(kind, str):
        return {"str": "a string", "int": "an integer", "size": "an integer >= 0", "count": "an integer >= 1", "number": "a number", "bool": "true or false",
                "dtype": "a dtype name", "null": "null", "any": "any value"}[kind]
    if isinstance(kind, dict):
        return "an object"
    if kind[0] == "list":
        return "a list"
    if kind[0] == "map":
        return "an object"
    return " or ".join(_describe(k) for k in kind[1:])


def _is_dtype(value) -> bool:
    import numpy as np  # noqa: PLC0415 - the plan reader stays importable without NumPy's cost until here

    try:
        np.dtype(value)
    except TypeError:
        return False
    return True


SCALARS = {"str": lambda v: isinstance(v, str), "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
           "size": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
           "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
           "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
           "bool": lambda v: isinstance(v, bool), "null": lambda v: v is None, "any": lambda v: True,
           "dtype": lambda v: isinstance(v, str) and _is_dtype(v)}


def problem(value, kind, path: tuple = ()) -> str | None:
    """The first place `value` departs from `kind`, in words, or None."""
    if isinstance(kind, str):
        return None if SCALARS[kind](value) else f"{_where(path)} is {value!r:.60}, expected {_describe(kind)}"
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return f"{_where(path)} is {value!r:.60}, expected an object"
        for key, inner in kind.items():
            name, optional = key.rstrip("?"), key.endswith("?")
            if name not in value:
                if optional:
                    continue
                return f"{_where(path)} has no '{name}'"
            found = problem(value[name], inner, (*path, name))
            if found:
                return found
        return None
    if kind[0] == "either":
        if any(problem(value, option, path) is None for option in kind[1:]):
            return None
        return f"{_where(path)} is {value!r:.60}, expected {_describe(kind)}"
    container = list if kind[0] == "list" else dict
    if not isinstance(value, container):
        return f"{_where(path)} is {value!r:.60}, expected {_describe(kind)}"
    items = enumerate(value) if container is list else value.items()
    for key, item in items:
        found = problem(item, kind[1], (*path, key))
        if found:
            return found
    return None


def unbound_read(meta: dict) -> str | None:
    """The first value read that nothing gives (no graph input, weight or earlier step's output):
    the runtime would hand a kernel, or the caller, nothing. Subgraph bodies resolve their own names."""
    known = {spec["name"] for spec in meta["inputs"]} | set(meta["weights"]) | {""}
    for index, step in enumerate(meta["program"]):
        for name in step["inputs"]:
            if name not in known:
                return f"meta.program[{index}] ('{step.get('name', step['op'])}') reads '{name}', which no input, weight or earlier step gives"
        known.update(step["outputs"])
    for index, spec in enumerate(meta["outputs"]):
        if not spec["name"] or spec["name"] not in known:
            return f"meta.outputs[{index}] is '{spec['name']}', which no step gives"
    logits = meta.get("decoder", {}).get("logits")
    if logits is not None and logits not in {spec["name"] for spec in meta["outputs"]}:
        return f"meta.decoder.logits is '{logits}', which is not one of the plan's outputs"
    return None


def header_problem(header, check_meta: bool = True) -> str | None:
    """What is wrong with a plan's parsed header (its section table and, unless told not to, its
    meta), in words, or None."""
    if not check_meta:
        return problem(header, {"meta": ("map", "any"), "sections": ("list", SECTION)})
    return problem(header, HEADER) or unbound_read(header["meta"])
