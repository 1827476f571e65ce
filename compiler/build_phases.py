"""What a build is doing between its tuning bars: a transient spinner naming the phase.

A build spends seconds to minutes outside the tuner (optimizing, precision repair, sample runs at
the profile's shapes, the in-context check of onnxruntime tactics, --verify); without a word on the
terminal it looks hung. The spinner shows only on a terminal and never under --json, and it is gone
once the phase ends, so logs and pipes get exactly the lines they got before. Phases never nest a
tuning bar (rich allows one live display at a time): tune_all runs between them.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console


@contextlib.contextmanager
def phase(text: str, enabled: bool) -> Iterator[Callable[[str], None]]:
    """Yields update(text), which renames the phase (a no-op where nothing shows)."""
    console = Console(stderr=True) if enabled else None
    if console is None or not console.is_terminal:
        yield lambda text: None
        return
    with console.status(text) as status:
        yield status.update
