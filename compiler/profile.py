"""Shape profiles (`--profile shapes.yaml`): static shapes or min/opt/max ranges per input, named
dims, an optional `tune:` block and, for decoder plans, a `decode:` block. Every error names the
file and the field."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import BadInput

DEFAULT_M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_BUDGET_S = 60.0
TOP_LEVEL_KEYS = {"inputs", "dims", "tune", "decode"}
TUNE_KEYS = {"m_buckets", "budget_s"}
DECODE_KEYS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "max_model_len"}
# YAML 1.1 reads bare on/off/yes/no/true/false as booleans and null/~ as None; no profile field is
# either, but input and dim names can be (an EmbeddingBag's `off`sets input), so they stay text
_NOT_NAMES = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:null")


class _ProfileLoader(yaml.SafeLoader):
    """A safe loader for which mapping keys are names, kept as written (`010:` is '010', not 8)."""

    def construct_mapping(self, node, deep=False):
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key_node.tag = "tag:yaml.org,2002:str"
        return super().construct_mapping(node, deep)


_ProfileLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NOT_NAMES]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


@dataclass(frozen=True)
class InputRange:
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass
class Profile:
    inputs: dict[str, InputRange]
    m_buckets: tuple[int, ...] = DEFAULT_M_BUCKETS
    budget_s: float = DEFAULT_BUDGET_S
    decode: dict = field(default_factory=dict)
    source: str = "<default>"

    def normalized(self) -> dict:
        return {"inputs": {k: {"min": list(v.min), "opt": list(v.opt), "max": list(v.max)} for k, v in sorted(self.inputs.items())},
                "tune": {"m_buckets": list(self.m_buckets), "budget_s": self.budget_s}, "decode": dict(sorted(self.decode.items()))}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.normalized(), sort_keys=True).encode()).hexdigest()

    def shapes(self, which: str) -> dict[str, tuple[int, ...]]:
        return {name: getattr(r, which) for name, r in self.inputs.items()}


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such profile file")
    try:
        data = yaml.load(path.read_text(), Loader=_ProfileLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_profile(data, str(path))


def parse_profile(data, source: str) -> Profile:
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a profile is a mapping with an 'inputs' key")
    unknown = set(data) - TOP_LEVEL_KEYS
    if unknown:
        raise BadInput(f"{source}: unknown key '{sorted(unknown)[0]}' (expected {', '.join(sorted(TOP_LEVEL_KEYS))})")
    dims = _parse_dims(data.get("dims") or {}, source)
    raw_inputs = data.get("inputs")
    if not isinstance(raw_inputs, dict) or not raw_inputs:
        raise BadInput(f"{source}: 'inputs' must map each model input to a shape")
    inputs = {str(name): _parse_input(spec, dims, f"{source}: inputs.{name}") for name, spec in raw_inputs.items()}
    tune = data.get("tune") or {}
    if not isinstance(tune, dict):
        raise BadInput(f"{source}: 'tune' must be a mapping")
    if set(tune) - TUNE_KEYS:  # a typo'd key would be ignored: the build would tune other buckets than asked
        raise BadInput(f"{source}: tune.{sorted(set(tune) - TUNE_KEYS)[0]}: unknown key "
                       f"(expected {', '.join(sorted(TUNE_KEYS))})")
    buckets = tune.get("m_buckets", list(DEFAULT_M_BUCKETS))
    if not isinstance(buckets, list) or not buckets or not all(isinstance(b, int) and b > 0 for b in buckets):
        raise BadInput(f"{source}: tune.m_buckets must be a list of positive integers")
    budget = tune.get("budget_s", DEFAULT_BUDGET_S)
    if not isinstance(budget, (int, float)) or budget < 0:
        raise BadInput(f"{source}: tune.budget_s must be a number >= 0")
    decode = data.get("decode") or {}
    if not isinstance(decode, dict):
        raise BadInput(f"{source}: 'decode' must be a mapping")
    if set(decode) - DECODE_KEYS:
        raise BadInput(f"{source}: decode.{sorted(set(decode) - DECODE_KEYS)[0]}: unknown key "
                       f"(expected {', '.join(sorted(DECODE_KEYS))})")
    for key, value in decode.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0) and not (key == "num_kv_blocks" and value == "auto"):
            raise BadInput(f"{source}: decode.{key} must be a positive integer"
                           + (" or auto" if key == "num_kv_blocks" else "") + f", got {value!r}")
    return Profile(inputs, tuple(sorted(set(buckets))), float(budget), decode, source)


def _parse_dims(raw, source: str) -> dict[str, InputRange]:
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: 'dims' must map dim names to a size or min/opt/max")
    dims = {}
    for name, spec in raw.items():
        where = f"{source}: dims.{name}"
        if isinstance(spec, int):
            spec = {"min": spec, "opt": spec, "max": spec}
        if not isinstance(spec, dict) or set(spec) != {"min", "opt", "max"}:
            raise BadInput(f"{where}: expected an integer or min/opt/max")
        values = tuple(spec[k] for k in ("min", "opt", "max"))
        if not all(isinstance(v, int) and v >= 0 for v in values) or not values[0] <= values[1] <= values[2]:
            raise BadInput(f"{where}: need integers with min <= opt <= max")
        dims[str(name)] = InputRange((values[0],), (values[1],), (values[2],))
    return dims


def _parse_input(spec, dims: dict[str, InputRange], where: str) -> InputRange:
    if isinstance(spec, list):
        shapes = {k: _resolve_shape(spec, dims, k, where) for k in ("min", "opt", "max")}
    elif isinstance(spec, dict):
        if set(spec) != {"min", "opt", "max"}:
            raise BadInput(f"{where}: a range needs exactly min, opt and max")
        shapes = {k: _resolve_shape(spec[k], {}, k, f"{where}.{k}") for k in ("min", "opt", "max")}
    else:
        raise BadInput(f"{where}: expected a shape list or min/opt/max")
    ranks = {len(s) for s in shapes.values()}
    if len(ranks) != 1:
        raise BadInput(f"{where}: min, opt and max have different ranks")
    for lo, mid, hi in zip(shapes["min"], shapes["opt"], shapes["max"]):
        if not lo <= mid <= hi:
            raise BadInput(f"{where}: need min <= opt <= max in every dim, got {list(shapes['min'])}, {list(shapes['opt'])}, {list(shapes['max'])}")
    return InputRange(shapes["min"], shapes["opt"], shapes["max"])


def _resolve_shape(shape, dims: dict[str, InputRange], which: str, where: str) -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise BadInput(f"{where}: expected a list of dims")
    out = []
    for dim in shape:
        if isinstance(dim, bool):
            raise BadInput(f"{where}: dim {dim!r} is not an integer")
        if isinstance(dim, int) and dim >= 0:
            out.append(dim)
        elif isinstance(dim, str) and dim in dims:
            out.append(getattr(dims[dim], which)[0])
        else:
            raise BadInput(f"{where}: dim {dim!r} is neither a non-negative integer nor a name defined under 'dims'")
    return tuple(out)


def check_profile_matches_model(profile: Profile, model_inputs: list[dict], ignorable=lambda name: False,
                                 unused=lambda name: False, defaulted: tuple[str, ...] = ()) -> None:
    """Every model input has a shape of the right rank that agrees with the model's static dims.
    `ignorable`: model inputs the profile may leave out; `unused`: profile inputs the model may lack;
    `defaulted`: inputs the model gives an initializer, which the plan holds as constants."""
    by_name = {i["name"]: i for i in model_inputs}
    for name in profile.inputs:
        if name in defaulted and name not in by_name:
            raise BadInput(f"{profile.source}: inputs.{name}: the model gives '{name}' a default value (an initializer "
                           "it also lists as an input), which infc builds in as a constant: leave it out of the "
                           "profile, or export the model without that initializer to feed it")
        if name not in by_name and not unused(name):
            raise BadInput(f"{profile.source}: inputs.{name}: the model has no input named '{name}' "
                           f"(its inputs: {', '.join(by_name)})")
    for name, info in by_name.items():
        if name not in profile.inputs:
            if ignorable(name):
                continue
            raise BadInput(f"{profile.source}: inputs.{name}: missing (the model needs a shape for every input)")
        declared = info.get("shape")
        shape_range = profile.inputs[name]
        if declared is None:
            continue
        if len(declared) != len(shape_range.opt):
            raise BadInput(f"{profile.source}: inputs.{name}: rank {len(shape_range.opt)} but the model's input has rank {len(declared)}")
        for axis, dim in enumerate(declared):
            if isinstance(dim, int) and dim > 0 and any(s[axis] != dim for s in (shape_range.min, shape_range.opt, shape_range.max)):
                raise BadInput(f"{profile.source}: inputs.{name}: dim {axis} must be {dim} (static in the model)")


def default_profile(model_inputs: list[dict]) -> Profile:
    """A profile from the model's own static shapes (dynamic dims become 1); used without --profile."""
    inputs = {}
    for info in model_inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (info.get("shape") or []))
        inputs[info["name"]] = InputRange(shape, shape, shape)
    return Profile(inputs, source="<model's static shapes>")


def defaulted_dims_note(model_inputs: list[dict]) -> str | None:
    """What default_profile fixed at 1, for the build log (trtexec also says when it overrides a dynamic
    shape), or None when every input is static."""
    dynamic = [f"{info['name']}[{', '.join(str(d) for d in info.get('shape') or [])}]" for info in model_inputs
               if any(not (isinstance(d, int) and d > 0) for d in info.get("shape") or [])]
    if not dynamic:
        return None
    return (f"no --profile: the dynamic dims of {', '.join(dynamic)} are built at 1; other shapes still run, "
            "untuned and with a warning (pass --profile SHAPES.yaml with min/opt/max to tune for them)")


def feeds_profile(feeds: dict) -> Profile:
    """A static profile at the shapes of given inputs (`infc build --inputs` without --profile)."""
    return Profile({name: InputRange(*(tuple(array.shape),) * 3) for name, array in feeds.items()},
                   source="<the shapes of --inputs>")
