"""The tuning key: everything a measured winner depends on, and nothing about the model it came from.

Two models with the same GEMM problem (shape bucket, dtypes, layouts, epilogue) on the same target
with the same kernel sources share a key, so one model's timing cache serves the next. Changing a
kernel's source changes `source_hash` and so invalidates its old measurements.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

_SEPARATOR = "|"
SOURCE_HASH_CHARS = 12


@dataclass(frozen=True)
class TuningKey:
    op: str
    shape: tuple[tuple[str, int], ...]  # the bucketed problem dims in the op's own order: (("M", 64), ("N", 768), ("K", 768))
    dtypes: tuple[str, ...]
    layouts: tuple[str, ...]
    epilogue: str
    target: str  # the target fingerprint string
    source_hash: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple((str(name), int(size)) for name, size in self.shape))
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        object.__setattr__(self, "layouts", tuple(self.layouts))
        # The string form must stay one-to-one: '|' splits fields, ',' and '=' split list items.
        for text in (self.op, self.epilogue, self.target, self.source_hash):
            if _SEPARATOR in text:
                raise ValueError(f"tuning key field {text!r} may not contain '|'")
        for text in (*self.dtypes, *self.layouts, *(name for name, _ in self.shape)):
            if any(c in text for c in "|,="):
                raise ValueError(f"tuning key item {text!r} may not contain '|', ',' or '='")

    def dim(self, name: str) -> int:
        return dict(self.shape)[name]

    def __str__(self) -> str:
        """The cache key: stable, readable, one line."""
        shape = ",".join(f"{name}={size}" for name, size in self.shape)
        return _SEPARATOR.join([self.op, shape, ",".join(self.dtypes), ",".join(self.layouts),
                                f"epilogue={self.epilogue}", f"target={self.target}", f"src={self.source_hash}"])

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "shape": {name: size for name, size in self.shape}, "dtypes": list(self.dtypes),
                "layouts": list(self.layouts), "epilogue": self.epilogue, "target": self.target, "source_hash": self.source_hash}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuningKey:
        try:
            return cls(data["op"], tuple(data["shape"].items()), tuple(data["dtypes"]), tuple(data["layouts"]),
                       data["epilogue"], data["target"], data["source_hash"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"tuning key: missing or malformed field {exc}") from None


def source_hash(*sources: ModuleType | str | Path) -> str:
    """A short sha256 over the source files of the kernels a key's candidates run."""
    digest = hashlib.sha256()
    for source in sources:
        path = Path(source.__file__) if isinstance(source, ModuleType) else Path(source)
        digest.update(path.read_bytes())
    return digest.hexdigest()[:SOURCE_HASH_CHARS]


@functools.cache  # keys are made per step and shape: read and hash the files once a process
def vendor_source_hash(*sources: ModuleType | str | Path) -> str:
    """source_hash of infc's kernels together with onnxruntime's version: a timing of infc against
    onnxruntime's kernel (an onnxruntime tactic) holds while neither changes."""
    import onnxruntime  # noqa: PLC0415 - only builds that time onnxruntime tactics need it

    return hashlib.sha256(f"{source_hash(*sources)}|onnxruntime={onnxruntime.__version__}".encode()).hexdigest()[
        :SOURCE_HASH_CHARS]
