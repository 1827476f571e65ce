"""Running onnxruntime where a crash cannot take infc with it.

Some sessions kill the process: a segfault in one of onnxruntime's graph optimizers, a SIGFPE in a
kernel fed a signal shorter than its window (WeSpeaker's front end). No `try` catches that; a build
or an `optimize --verify` would die with exit 136 or 139 and no word of why. So a session whose
inputs infc made up runs first in a forked child: the child's death is a reason the caller can act
on (try other inputs, drop a variant), and what the child computed comes back as an .npz (no
pickle). The child builds its own session: threads do not survive a fork, so a parent's session
would wait forever on workers the child does not have.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from typing import Callable

import numpy as np

CHILD_TIMEOUT_S = 300.0
RAISED = 3  # the child's exit code when `fn` raised: an ordinary error, which a run in the parent reports


def run_in_child(fn: Callable[[], dict | None], timeout_s: float = CHILD_TIMEOUT_S) -> tuple[dict | None, str | None]:
    """(what `fn` returned, None) when it ran in a forked child, its arrays read back; (None, why)
    when the child died of a signal, raised, or ran past `timeout_s`. Without fork (Windows), `fn`
    runs here."""
    if not hasattr(os, "fork"):
        try:
            return fn(), None
        except Exception as exc:  # noqa: BLE001
            return None, f"it raised {type(exc).__name__}"
    with tempfile.TemporaryDirectory(prefix="infc-child-") as folder:
        path = os.path.join(folder, "result.npz")
        pid = os.fork()
        if pid == 0:  # the child never returns into the caller
            code = RAISED
            try:
                result = fn()
                if result is not None:
                    np.savez(path, **{name: _storable(value) for name, value in result.items()})
                code = 0
            finally:
                os._exit(code)
        status = _wait(pid, timeout_s)
        if status is None:
            return None, f"it did not finish within {timeout_s:g} s"
        if os.WIFSIGNALED(status):
            return None, f"onnxruntime died of {signal.Signals(os.WTERMSIG(status)).name}"
        if os.WEXITSTATUS(status) != 0:
            return None, "it raised an error"
        if not os.path.exists(path):
            return None, None
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}, None


def _wait(pid: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.02)


def _storable(value) -> np.ndarray:
    """An output as .npz stores it without pickle: strings as fixed-width unicode."""
    array = np.asarray(value)
    return array.astype(str) if array.dtype == object else array
