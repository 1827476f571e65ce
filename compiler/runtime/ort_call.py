"""Calling an onnxruntime session with as little Python around it as it needs.

`InferenceSession.run` does Python work on every call before it reaches the bound C++ run: a
WebGPU graph-capture check, a walk over the session's input metadata looking for missing feeds (two
pybind property reads per input), an OrtValue ownership check, and a try around the call for an
execution-provider fallback. The executor's sessions are CPU sessions that it built itself and feeds
NumPy arrays under their own input names, so none of those can fire; on a trivial session that
Python is 3-4 of its 15 us a call, and a tiny model's whole-model island or a program's dozens of
tactic sessions pay it on every run. Where this onnxruntime has the bound run (`_sess.run`, the
call `run` ends in since onnxruntime 1.0) and the session runs on the CPU provider alone, the
executor calls it directly; anywhere else it calls `run` as it stands.

A feed the session does not know or a missing one still fails, in onnxruntime's C++ checks instead
of its Python ones; the executor checks its own inputs before any step runs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def session_runner(session) -> Callable[[list[str], dict], list]:
    """`(output_names, feeds) -> outputs` for `session`, the bound C++ run where it is safe (above)."""
    bound = getattr(session, "_sess", None)
    bound_run = getattr(bound, "run", None)
    if bound_run is None or list(session.get_providers()) != ["CPUExecutionProvider"]:
        return session.run

    def run(output_names, feeds):
        return bound_run(output_names, feeds, None)

    return run


def as_feed(value):
    """onnxruntime takes arrays only: a NumPy scalar some kernel made (np.take with a 0-d index, a ufunc
    of 0-d arrays give one) becomes the 0-d array it stands for. Tactic sessions and islands feed through it."""
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def named_feeds(names, values) -> dict:
    """The feeds of a session whose inputs are `names`, from `values` in that order (as_feed inlined:
    this runs for every input of every session call)."""
    ndarray = np.ndarray
    return {name: value if type(value) is ndarray else as_feed(value) for name, value in zip(names, values)}
