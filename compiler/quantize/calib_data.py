"""Calibration data: an `.npz` file or a folder of them, read lazily, one sample at a time.

Each `.npz` holds arrays keyed by graph input name. An array of the input's rank is one sample; an
array with one more leading axis is a stack of samples (every input in that file must then have the
same stack length). Files in a folder are read in name order; only one file is open at a time and
`np.load` reads each array when asked, so memory does not grow with the amount of data.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from ..errors import BadInput


def _input_ranks(model: onnx.ModelProto) -> dict[str, int]:
    initializers = {t.name for t in model.graph.initializer}
    return {v.name: len(v.type.tensor_type.shape.dim) for v in model.graph.input if v.name not in initializers}


def calibration_files(path: str | Path) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
        if not files:
            raise BadInput(f"{path}: no .npz files in the calibration folder")
        return files
    if path.is_file():
        return [path]
    raise BadInput(f"{path}: no such calibration file or folder")


def _samples_in(file: Path, ranks: dict[str, int]) -> Iterator[dict[str, np.ndarray]]:
    if not zipfile.is_zipfile(file):  # np.load would read a .npy as one array, or try to unpickle text
        raise BadInput(f"{file}: not an .npz archive (np.savez writes one, keyed by input name)")
    try:
        data = np.load(file, allow_pickle=False)  # never unpickle: calibration data is data
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{file}: not a readable .npz of arrays: {str(exc).splitlines()[0]}") from None
    with data:
        missing = sorted(set(ranks) - set(data.files))
        if missing:
            raise BadInput(f"{file}: no array for model input(s) {', '.join(missing)}")
        arrays = {name: data[name] for name in ranks}  # one file's arrays at a time
        shapes = {name: array.shape for name, array in arrays.items()}
        stacked = {name for name, shape in shapes.items() if len(shape) == ranks[name] + 1}
        wrong = [name for name, shape in shapes.items() if len(shape) not in (ranks[name], ranks[name] + 1)]
        if wrong:
            raise BadInput(f"{file}: array '{wrong[0]}' has rank {len(shapes[wrong[0]])}, the input has rank {ranks[wrong[0]]}")
        if not stacked:
            yield arrays
            return
        if stacked != set(ranks) or len({shapes[n][0] for n in stacked}) != 1:
            raise BadInput(f"{file}: either every input is a stack of samples with the same count or none is")
        for index in range(shapes[next(iter(ranks))][0]):
            yield {name: arrays[name][index] for name in ranks}


def iter_calibration(path: str | Path, model: onnx.ModelProto) -> Iterator[dict[str, np.ndarray]]:
    """Feeds dicts, one sample at a time, from an `.npz` file or a folder of them."""
    ranks = _input_ranks(model)
    for file in calibration_files(path):
        yield from _samples_in(file, ranks)
