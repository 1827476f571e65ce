"""Every file infc writes appears whole or not at all: it is written under a temporary name in the
target folder and renamed into place, so a failure, a crash or a parallel writer never leaves a
partial file behind (a rename within one folder is atomic)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import BadInput

# mkstemp creates files readable by their owner only; a finished output gets the permissions a
# plain open() would give it, so plans and caches can be shared (CI volumes, containers).
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path`: renamed onto `path` if the block succeeds, removed if not."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=folder)
    except OSError as exc:  # a read-only folder, a full disk: the user's path, not an internal error
        raise BadInput(f"{path}: cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = False) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        if durable:  # shared caches: the data reaches the disk before the name does
            handle.flush()
            os.fsync(handle.fileno())


def check_writable(path: str | os.PathLike, make_folder: bool = False) -> None:
    """Before any work: `path` (a file to write, or with make_folder a folder to fill) can be written.
    Tried by creating a temporary file there, since os.access answers yes to root on read-only
    mounts and /sys, and a build would otherwise fail only at its end."""
    path = Path(path)
    folder = path if make_folder else (path.parent if str(path.parent) else Path("."))
    try:
        if make_folder:
            folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".infc-write-check.", dir=folder)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
