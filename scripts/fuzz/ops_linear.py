"""MatMul and Gemm forms: projections with weights, products of a value with itself, plain attention."""

import numpy as np

from .graph import F32


def _matmul(g, x, s):
    if not g.fixed(x, -1):
        return None
    n = int(g.rng.choice([4, 8, 16, 24]))
    y = g.node("MatMul", [x, g.weight(s[-1], n)], (*s[:-1], n))
    if g.rng.integers(2):
        y = g.node("Add", [y, g.const(g.rng.standard_normal(n).astype(F32))], (*s[:-1], n))
    return y


def _gemm(g, x, s):
    if len(s) != 2 or not g.fixed(x, 1):
        return None
    n = int(g.rng.choice([4, 8, 16]))
    trans_b = int(g.rng.integers(2))
    w = g.weight(*((n, s[1]) if trans_b else (s[1], n)))
    return g.node("Gemm", [x, w, g.const(g.rng.standard_normal(n).astype(F32))], (s[0], n), transB=trans_b,
                  alpha=float(g.rng.choice([1.0, 0.5])), beta=float(g.rng.choice([1.0, 2.0])))


def _matmul_self(g, x, s):
    if len(s) < 3:
        return None
    perm = list(range(len(s)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    dyn = {perm.index(a) for a in g.dyn[x]}
    xt = g.node("Transpose", [x], tuple(s[p] for p in perm), dyn, perm=perm)
    rows = (s[-2], s[-2])
    out_dyn = {a for a in g.dyn[x] if a < len(s) - 2} | ({len(s) - 2, len(s) - 1} if len(s) - 2 in g.dyn[x] else set())
    scaled = g.node("Mul", [x, g.const(np.array(1 / np.sqrt(s[-1]), F32))], s)
    return g.node("MatMul", [scaled, xt], (*s[:-2], *rows), out_dyn)


def _attention(g, x, s):
    if len(s) != 3 or not g.fixed(x, -1):
        return None
    d = s[-1]
    q, k, v = (g.node("MatMul", [x, g.weight(d, d)], s) for _ in range(3))
    both = {1, 2} if 1 in g.dyn[x] else set()
    kt = g.node("Transpose", [k], (s[0], d, s[1]), {2} & both or set(), perm=[0, 2, 1])
    scores = g.node("Mul", [g.node("MatMul", [q, kt], (s[0], s[1], s[1]), both),
                            g.const(np.array(1 / np.sqrt(d), F32))], (s[0], s[1], s[1]))
    return g.node("MatMul", [g.node("Softmax", [scores], (s[0], s[1], s[1]), axis=-1), v], s)
