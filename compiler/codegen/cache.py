"""Compiled cubins named by content: sha256 of (source, compiler flags, compiler version).

CuPy caches loaded modules by file path, so a path must never be reused for other bytes; a
content-hashed name gives that for free and lets plans, builds and tests share one folder. Each
cubin has a JSON sidecar with its ptxas resource report, so a cache hit still answers "does it
spill". Writes go to a temporary name and are renamed: concurrent compiles of one key are safe.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..atomic import write_bytes_atomic

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "cache" / "cubins"


def content_key(source: str, flags: tuple[str, ...], compiler_version: str) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler_version):
        digest.update(part.encode())
        digest.update(b"\x1f")
    return digest.hexdigest()[:24]


class CubinCache:
    def __init__(self, root: Path | str = DEFAULT_ROOT):
        self.root = Path(root)

    def cubin_path(self, key: str) -> Path:
        return self.root / f"{key}.cubin"

    def get(self, key: str) -> tuple[Path, dict] | None:
        cubin, meta = self.cubin_path(key), self.root / f"{key}.json"
        if not (cubin.is_file() and meta.is_file()):
            return None
        try:
            return cubin, json.loads(meta.read_text())
        except (OSError, ValueError):
            return None

    def find_by_source(self, source_sha: str, flags: tuple[str, ...]) -> tuple[Path, dict] | None:
        """A cubin of this source and these flags from any compiler version (for a machine
        without nvcc that was handed a cache folder)."""
        for meta_path in sorted(self.root.glob("*.json")) if self.root.is_dir() else ():
            hit = self.get(meta_path.stem)
            if hit and hit[1].get("source_sha") == source_sha and tuple(hit[1].get("flags", ())) == flags:
                return hit
        return None

    def put(self, key: str, cubin: bytes, meta: dict) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.cubin_path(key), cubin)
        write_bytes_atomic(self.root / f"{key}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        return self.cubin_path(key)
