"""numba's disk cache goes stale only when a kernel's own file changes. A kernel that calls kernels
of other files (`calls=`) has their code compiled into it, so its cache name carries a digest of
that code (runtime/jit.py): an edit of a callee in another file (or an upgrade that rewrote only
that file) compiles the caller again instead of loading machine code built from the old callee."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.runtime import jit


def _callee_v1(u):
    return u + 1


def _callee_v2(u):
    return u + 2


def _caller(u):
    return _callee(u) * 2  # noqa: F821 - bound by `calls`


def _kernels(callee):
    callee.__name__ = "_callee"
    inner = jit.jit(callee)
    return inner, jit.jit(_caller, calls=(inner,))


def test_the_cache_name_changes_with_a_callee_code():
    _, first = _kernels(_callee_v1)
    _, second = _kernels(_callee_v2)
    _, same = _kernels(_callee_v1)
    assert jit._callees_digest(first.calls) != jit._callees_digest(second.calls)
    assert jit._callees_digest(first.calls) == jit._callees_digest(same.calls)
    assert jit._callees_digest(()) == ""


def test_callees_of_callees_count():
    leaf_v1, leaf_v2 = jit.jit(_callee_v1), jit.jit(_callee_v2)
    middle_v1 = jit.jit(_caller, calls=(leaf_v1,))
    middle_v2 = jit.jit(_caller, calls=(leaf_v2,))
    assert jit._callees_digest((middle_v1,)) != jit._callees_digest((middle_v2,))


def test_a_caller_compiles_with_the_callee_it_names():
    if not jit.enabled():
        pytest.skip("compiled kernels are off")
    for callee, expected in ((_callee_v1, 4), (_callee_v2, 6)):
        _, caller = _kernels(callee)
        assert caller.get()(np.int64(1)) == expected
