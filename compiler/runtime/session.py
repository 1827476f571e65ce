"""Loading a plan and running it: weights straight from the memory-mapped file, inputs checked
against the plan, shapes outside the profile run on the generic kernels with one warning."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from ..errors import BadInput, InfcError
from ..plan import weight_encoding
from ..plan.format import read_plan
from ..target import check_target
from .executor import Executor
from .feeds_io import check_feeds


WEIGHT_ALIGN = 64  # the builder's layout (build.weights_section): each weight 64-byte aligned, in order


def _check_tiling(plan, spans: dict[str, list[tuple[int, int, str]]]) -> None:
    """The weights of each section lie one after the other, each at the next 64-byte boundary, the
    last ending where the section does: how the builder writes them. A weight's shape edited in a
    re-hashed header (its bytes then cover less or more than its own) fails here, with the weight
    named, instead of as a kernel's error deep in a run (an edit within the 64-byte padding is not
    seen here; the kernel reading it then names its step)."""
    for section_name, entries in spans.items():
        size = len(plan.sections[section_name])
        expected = 0
        for offset, nbytes, name in sorted(entries):
            if offset != expected:
                raise BadInput(f"{plan.path}: corrupt plan (weight '{name}' at offset {offset} does not follow the weight "
                               f"before it, which ends at {expected}: its shape or offset was edited)")
            expected = offset + nbytes + (-(offset + nbytes)) % WEIGHT_ALIGN
        last = max(entries)
        if last[0] + last[1] != size:
            raise BadInput(f"{plan.path}: corrupt plan (weight '{last[2]}' ends at {last[0] + last[1]}, its section "
                           f"'{section_name}' at {size}: its shape was edited)")


def _weights(plan) -> dict[str, np.ndarray]:
    weights, spans = {}, {}
    for name, info in plan.meta["weights"].items():
        dtype, section = _weight_dtype(plan, name, info), plan.sections.get(info.get("section"))
        if not weight_encoding.known(info):
            raise BadInput(f"{plan.path}: corrupt plan (weight '{name}' has encoding {info.get('encoding')!r})")
        stored = np.dtype(np.uint16) if weight_encoding.stored_itemsize(info) == 2 else dtype
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        # the checksums vouch for the bytes, not for a table edited and re-hashed: its entries stay in their section
        if section is None or not 0 <= info["offset"] <= len(section) - count * stored.itemsize:
            raise BadInput(f"{plan.path}: corrupt plan (weight '{name}' lies outside its section)")
        spans.setdefault(info["section"], []).append((info["offset"], count * stored.itemsize, name))
        array = weight_encoding.decode(np.frombuffer(section, dtype=stored, count=count, offset=info["offset"]), info)
        weights[name] = array.reshape(info["shape"])
    _check_tiling(plan, spans)
    return weights


def _weight_dtype(plan, name: str, info: dict) -> np.dtype:
    try:
        return np.dtype(info["dtype"])
    except TypeError:
        raise BadInput(f"{plan.path}: corrupt plan (weight '{name}' has dtype "
                       f"{info['dtype']!r})") from None


class PlanSession:
    def __init__(self, path: str | Path, check_fingerprint: bool = True):
        self.path = Path(path)
        self.plan = read_plan(self.path)
        meta = self.plan.meta
        for key in ("program", "weights", "inputs", "outputs", "target"):
            if key not in meta:
                raise BadInput(f"{self.path}: corrupt plan (no '{key}' in its metadata)")
        if check_fingerprint:
            check_target(meta["target"], str(self.path), meta.get("model", {}).get("name"))
        self.inputs = meta["inputs"]
        self.output_names = [o["name"] for o in meta["outputs"]]
        islands = {name: bytes(view) for name, view in self.plan.sections.items() if name.startswith("island")}
        if meta["target"].get("kind") == "cuda":  # the GPU executor (runtime/cuda/), CuPy loaded only here
            from .cuda.plan_loader import device_executor  # noqa: PLC0415

            self.executor = device_executor(self.plan, _weights(self.plan))
        else:
            weights = _weights(self.plan)
            try:
                self.executor = Executor(meta["program"], weights, meta.get("opset", 17), islands,
                                         output_names=self.output_names)
            except BadInput as exc:  # a step this runtime has no kernel for, say: name the plan
                raise BadInput(f"{self.path}: {exc}") from None
        self._warned_outside_profile = False

    def check_feeds(self, feeds: dict[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
        checked = check_feeds(self.inputs, feeds, source, "the plan", tuple(self.plan.meta.get("defaulted_inputs", ())))
        self._warn_if_outside_profile(checked)
        return checked

    def _outside_profile(self, feeds) -> str | None:
        """How the first input outside the profile's range lies, or None."""
        profile = self.plan.meta.get("profile", {}).get("inputs", {})
        for name, array in feeds.items():
            bounds = profile.get(name)
            shape = getattr(array, "shape", ())
            if bounds and any(not lo <= s <= hi for s, lo, hi in zip(shape, bounds["min"], bounds["max"])):
                return f"input '{name}' shape {list(shape)} is outside the profile [{bounds['min']} .. {bounds['max']}]"
        return None

    def _warn_if_outside_profile(self, feeds) -> None:
        outside = self._outside_profile(feeds)
        if outside and not self._warned_outside_profile:
            print(f"warning: {outside}: running with generic (untuned) kernels", file=sys.stderr)
            self._warned_outside_profile = True

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self.executor.run(feeds)
        except BadInput:
            raise
        except InfcError as exc:
            # The build checked the model at the profile's shapes only. Past them, a model's own shapes
            # often give out (position tables, fixed reshapes: onnxruntime fails the same way), so a
            # failure there is reported as the input it is, with the kernel's words.
            outside = self._outside_profile(feeds)
            if outside is None:
                raise
            raise BadInput(f"the plan does not run at these inputs ({outside}, where the build never ran it): {exc}") from exc

    def benchmark(self, feeds, iterations: int, warmup: int = 2) -> list[float]:
        for _ in range(warmup):
            self.run(feeds)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.run(feeds)
            times.append((time.perf_counter() - start) * 1e3)
        return times
