"""The timing cache: measured winners by tuning key, in one JSON file that every build on a machine shares.

Human-readable (indented, sorted keys): one entry per key string with the winner, every candidate's
median time and status, and the date. Keys name only the GEMM problem and the target, so the next
model with the same problem is served from here without benchmarking.

An entry timed on a busy machine carries the load it was timed under (`busy_load`, machine_load.py):
a build on a quiet machine does not trust it but times the key again, counted as a miss with
that reason (`num_busy_retimed`); a build on a busy machine uses it, having nothing better.

Two builds may save at once. Each save holds an exclusive flock on a side lock file while it
re-reads the cache, lays its own new entries over what it finds and renames a temporary file over
the cache: neither build loses the other's entries, and readers never see a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from ..atomic import write_text_atomic
from ..errors import BadInput
from .key import TuningKey
from .machine_load import busy_load
from .tuner import TuneResult

try:
    import fcntl
except ImportError:  # not POSIX: saves still rename atomically, but concurrent builds may drop entries
    fcntl = None  # type: ignore[assignment]

FORMAT = "infc-timing-cache"
FORMAT_VERSION = 1


class TimingCache:
    """`path=None` keeps the cache in memory only."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, dict[str, Any]] = _read(self.path) if self.path is not None else {}
        self._unsaved: dict[str, dict[str, Any]] = {}
        self.num_hits = 0
        self.num_misses = 0
        self.num_busy_retimed = 0  # entries timed on a busy machine, not trusted on this quiet one
        self.busy_load: float | None = None  # the highest load this build stamped on an entry it wrote

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: TuningKey | str) -> bool:
        return str(key) in self.entries

    def get(self, key: TuningKey | str) -> TuneResult | None:
        entry = self.entries.get(str(key))
        result = None
        if entry is not None and entry.get("busy_load") is not None and busy_load() is None:
            self.num_busy_retimed += 1
            entry = None
        if entry is not None:
            try:
                result = TuneResult.from_json(entry, status="cached")
            except (ValueError, KeyError, TypeError, AttributeError):
                result = None  # a malformed entry is a miss; the fresh measurement replaces it
        if result is None:
            self.num_misses += 1
        else:
            self.num_hits += 1
        return result

    def put(self, result: TuneResult) -> None:
        entry = result.to_json()
        entry.pop("status", None)  # an entry is always a finished measurement; whoever reads it back calls it "cached"
        load = busy_load()
        if load is not None:
            entry["busy_load"] = load
            self.busy_load = max(load, self.busy_load or 0.0)
        self.entries[str(result.key)] = entry
        self._unsaved[str(result.key)] = entry

    def save(self) -> None:
        if self.path is None or not self._unsaved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            merged = _read(self.path)
            merged.update(self._unsaved)
            _write_atomic(self.path, {"format": FORMAT, "version": FORMAT_VERSION, "entries": merged})
        self.entries = merged  # now holds what other builds saved meanwhile, too
        self._unsaved = {}


def _read(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable timing cache ({exc}); delete it to start a new one") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("entries"), dict):
        raise BadInput(f"{path}: not an infc timing cache (field 'format' must be '{FORMAT}', 'entries' an object)")
    version = document.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BadInput(f"{path}: timing cache field 'version' is {version!r}; this infc reads version {FORMAT_VERSION}")
    return document["entries"]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    # The lock file is never deleted: removing it would let a third build lock a fresh inode meanwhile.
    fd = os.open(path.with_name(path.name + ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_atomic(path: Path, document: dict[str, Any]) -> None:
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n"
    write_text_atomic(path, text, durable=True)
