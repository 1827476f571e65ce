"""The plan file: magic, version, JSON header, 64-byte aligned raw sections with a sha256 each.

Plans are data, never code: nothing here unpickles, evals or execs. Shared by the compiler (which
writes plans) and the runtime (which reads them), so it imports neither.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_path
from ..errors import BadInput
from .meta_schema import header_problem

MAGIC = b"INFCPLAN"
FORMAT_VERSION = 2  # 2: weight table entries may carry an `encoding` (plan/weight_encoding.py)
ALIGNMENT = 64
_PREFIX = struct.Struct("<8sIQ32s")  # magic, format version, header length, header sha256


@dataclass
class Plan:
    path: Path
    meta: dict
    sections: dict[str, memoryview]


def _aligned(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class ArraySection:
    """A section of arrays at given offsets (zero bytes between), written from the arrays themselves:
    joining a model's weights into one bytes object first held two more copies of them at the end
    of a build (a 2 GB decoder peaked 4.4 GB higher)."""

    def __init__(self, parts: list[tuple[int, object]], size: int):
        self.parts = parts  # (offset, a 1-D bytes-like object, e.g. a uint8 view of an array), offsets increasing
        self.size = size

    def __len__(self) -> int:
        return self.size

    def pieces(self):
        """(offset, bytes-like) of every part, then the zero padding up to the end, in order."""
        position = 0
        for offset, array in self.parts:
            if offset > position:
                yield position, bytes(offset - position)
            view = memoryview(array)
            yield offset, view
            position = offset + view.nbytes
        if self.size > position:
            yield position, bytes(self.size - position)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for _, piece in self.pieces():
            digest.update(piece)
        return digest.hexdigest()


def _digest(data) -> str:
    return data.sha256() if isinstance(data, ArraySection) else hashlib.sha256(data).hexdigest()


def write_plan(path: str | os.PathLike, meta: dict, sections: dict[str, bytes | ArraySection]) -> None:
    """Atomic: written under a temporary name in the same folder, then renamed."""
    path = Path(path)
    table, offset = [], 0
    for name, data in sections.items():
        offset = _aligned(offset)
        table.append({"name": name, "offset": offset, "size": len(data), "sha256": _digest(data)})
        offset += len(data)
    header = json.dumps({"meta": meta, "sections": table}, separators=(",", ":")).encode()
    data_start = _aligned(_PREFIX.size + len(header))
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), hashlib.sha256(header).digest()))
        handle.write(header)
        for entry, data in zip(table, sections.values()):
            if isinstance(data, ArraySection):
                for at, piece in data.pieces():
                    handle.seek(data_start + entry["offset"] + at)
                    handle.write(piece)
            else:
                handle.seek(data_start + entry["offset"])
                handle.write(data)
        handle.truncate(data_start + offset)


def read_plan(path: str | os.PathLike, verify: bool = True, check_meta: bool = True) -> Plan:
    """`verify`: check every section's sha256 (the header's is always checked); `check_meta`: check
    the meta against the layout infc's readers rely on (plan/meta_schema.py)."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such plan file")
    with open(path, "rb") as handle:
        prefix = handle.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
            raise BadInput(f"{path}: not an infc plan (bad magic)")
        _, version, header_len, header_sha = _PREFIX.unpack(prefix)
        if version > FORMAT_VERSION:
            raise BadInput(f"{path}: plan format version {version} is newer than this infc reads ({FORMAT_VERSION}); upgrade infc")
        if version < 1:
            raise BadInput(f"{path}: corrupt plan (format version {version})")
        size = os.fstat(handle.fileno()).st_size
        if _PREFIX.size + header_len > size:
            raise BadInput(f"{path}: truncated or corrupt plan (header length {header_len} exceeds the file)")
        header_bytes = handle.read(header_len)
        if hashlib.sha256(header_bytes).digest() != header_sha:
            raise BadInput(f"{path}: the plan header fails its sha256 check (the file is corrupt)")
        try:
            header = json.loads(header_bytes)
        except ValueError:
            raise BadInput(f"{path}: corrupt plan header") from None
        found = header_problem(header, check_meta)
        if found:
            raise BadInput(f"{path}: inconsistent plan header ({found}); rebuild the plan")
        meta, table = header["meta"], header["sections"]
        data_start = _aligned(_PREFIX.size + header_len)
        end = data_start + max((e["offset"] + e["size"] for e in table), default=0)
        if size < end:
            raise BadInput(f"{path}: truncated plan ({size} bytes, sections need {end})")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    view = memoryview(mapped) if mapped is not None else memoryview(b"")
    sections = {}
    for entry in table:
        chunk = view[data_start + entry["offset"]: data_start + entry["offset"] + entry["size"]]
        if verify and hashlib.sha256(chunk).hexdigest() != entry["sha256"]:
            raise BadInput(f"{path}: section '{entry['name']}' fails its sha256 check (the file is corrupt)")
        sections[entry["name"]] = chunk
    return Plan(path, meta, sections)


def release_mapped_pages(array) -> bool:
    """Give back this process's resident pages of a weight read straight from a plan's mapping, once
    its reader keeps its own copy in another layout (the panel kernel's packed weights): the file
    stays mapped and a later read brings the pages back. True when pages were released."""
    base = array
    while getattr(base, "base", None) is not None and not isinstance(base, memoryview):
        base = base.base
    if not isinstance(base, memoryview) or not isinstance(base.obj, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    mapped = base.obj
    import numpy as np  # noqa: PLC0415 - the compiler's writer does not need it here

    offset = array.ctypes.data - np.frombuffer(mapped, np.uint8, count=1).ctypes.data
    first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages of the array only
    last = (offset + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last <= first:
        return False
    try:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)
    except (OSError, ValueError):
        return False
    return True
