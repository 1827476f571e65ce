"""Inputs and outputs of `infc run`: .npz files keyed by name, or seeded random inputs."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import BadInput


def load_feeds(path: str) -> dict[str, np.ndarray]:
    if not Path(path).is_file():
        raise BadInput(f"{path}: no such inputs file")
    if not zipfile.is_zipfile(path):  # np.load would read a .npy as one array, or try to unpickle text
        raise BadInput(f"{path}: not an .npz archive (np.savez writes one, keyed by input name)")
    try:
        with np.load(path, allow_pickle=False) as data:  # never unpickle: inputs are data
            return {name: data[name] for name in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{path}: not a readable .npz of arrays: {str(exc).splitlines()[0]}") from None


def feeds_digest(feeds: dict) -> str:
    """sha256 over names, dtypes, shapes and bytes: part of a cache key when inputs shape a build."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def check_feeds(inputs: list[dict], feeds: dict, source: str, what: str,
                defaulted: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Feeds by name against declared inputs ({name, dtype, shape}): every input and nothing else,
    each of the declared dtype and static dims; `what` names the declaring side in errors;
    `defaulted`: the model's inputs that also have an initializer, a constant of the plan."""
    expected = {i["name"]: i for i in inputs}
    fixed = sorted(set(feeds) & set(defaulted) - set(expected))
    if fixed:
        raise BadInput(f"{source}: input '{fixed[0]}' has a default value in the model (an initializer it also "
                       f"lists as an input), which infc builds in as a constant, so {what} takes no '{fixed[0]}'; "
                       "export the model without that initializer to feed it")
    unknown = sorted(set(feeds) - set(expected))
    missing = sorted(set(expected) - set(feeds))
    if unknown or missing:
        raise BadInput(f"{source}: inputs do not match {what}: " + "; ".join(
            ([f"unknown {', '.join(unknown)}"] if unknown else []) + ([f"missing {', '.join(missing)}"] if missing else []))
            + f" ({what} takes {', '.join(expected)})")
    checked = {}
    for name, array in feeds.items():
        info = expected[name]
        array = np.asarray(array)
        if info.get("dtype") == "object" and array.dtype.kind in "US":
            array = array.astype(object)  # an ONNX string input: .npz files hold text as <U / S arrays, never objects
        if info.get("dtype") and array.dtype != np.dtype(info["dtype"]):
            raise BadInput(f"{source}: input '{name}' has dtype {array.dtype}, {what} takes {info['dtype']}")
        declared = info.get("shape")
        if declared is not None and (len(declared) != array.ndim or any(
                isinstance(d, int) and d != s for d, s in zip(declared, array.shape))):
            raise BadInput(f"{source}: input '{name}' has shape {list(array.shape)}, {what} takes {declared}")
        checked[name] = array
    return checked


def save_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    with atomic_path(path, suffix=".npz") as tmp:  # np.savez appends .npz to names without it
        np.savez(tmp, **{name: _storable(array) for name, array in outputs.items()})


def _storable(array) -> np.ndarray:
    """ONNX strings come back as object arrays, which np.savez pickles and np.load then refuses
    (allow_pickle=False, its default): they are written as text arrays (<U, or S for bytes)."""
    array = np.asarray(array)
    if array.dtype != object:
        return array
    items = array.reshape(-1).tolist()  # empty: text, as all() of nothing holds
    if all(isinstance(item, str) for item in items):
        return array.astype(str)
    if all(isinstance(item, bytes) for item in items):
        return array.astype(bytes)
    return array


def random_inputs(inputs: list[dict], shapes: dict[str, list[int]], table_rows: dict[str, int], seed: int = 0) -> dict:
    """Seeded random inputs: normal floats; integer ids inside the embedding table they index
    (`table_rows`); masks are ones; position ids count up."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in inputs:
        name, dtype = info["name"], np.dtype(info["dtype"] or "float32")
        shape = list(shapes[name])
        if "position" in name.lower() and dtype.kind in "iu" and shape:
            feeds[name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        elif dtype.kind in "iu":
            low, high = (1, 2) if "mask" in name.lower() else (0, table_rows.get(name, 2))
            feeds[name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def gather_table_rows(steps: list[dict], weight_shapes: dict[str, list[int]]) -> dict[str, int]:
    """Inputs that index a constant table through Gather, with the table's row count."""
    return {step["inputs"][1]: int(weight_shapes[step["inputs"][0]][0]) for step in steps
            if step["op"] == "Gather" and len(step["inputs"]) > 1 and step["inputs"][0] in weight_shapes}


def random_plan_feeds(session, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs at the profile's opt shapes."""
    meta = session.plan.meta
    shapes = {i["name"]: meta["profile"]["inputs"].get(i["name"], {}).get("opt")
              or [d if isinstance(d, int) else 1 for d in i["shape"] or []] for i in meta["inputs"]}
    rows = gather_table_rows(meta["program"], {n: w["shape"] for n, w in meta["weights"].items()})
    return random_inputs(meta["inputs"], shapes, rows, seed)
