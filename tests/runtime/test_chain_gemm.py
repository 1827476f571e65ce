"""The chain kernel (runtime/chain_gemm.py): decode-sized GEMMs of decoder plans computed as the BLAS
blocked GEMM computes them, bit for bit, without packing the weight. The probe finds a simulated
BLAS's cut of K, refuses a BLAS no cut reproduces, and on this machine's OpenBLAS the chain rows
equal the blocked GEMM's whatever the row count, with compiled kernels on or off."""

import multiprocessing

import numpy as np
import pytest
import threadpoolctl

from infc.compiler.runtime import chain_gemm, invariant_gemm, jit


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_MIN_ROWS", {})
    monkeypatch.setattr(invariant_gemm, "_CHAIN_EDGES", {})
    monkeypatch.setattr(invariant_gemm, "_LAST_RULE", [None])


needs_jit = pytest.mark.skipif(not jit.enabled(), reason="compiled kernels are off or numba is missing")


def test_the_k_rule_is_openblas_and_never_overruns():
    assert chain_gemm.k_blocks(1536, 448, 1) == (0, 448, 896, 1216, 1536)  # 640 left: two halves
    assert chain_gemm.k_blocks(576, 448, 1) == (0, 288, 576)
    assert chain_gemm.k_blocks(300, 448, 8) == (0, 300)
    assert chain_gemm.k_blocks(450, 448, 64) == (0, 256, 450)  # the half rounded up to the unroll
    for k in range(1, 3000, 37):
        for depth in (8, 24, 448):
            for unroll in chain_gemm.UNROLLS:
                edges = chain_gemm.k_blocks(k, depth, unroll)
                assert edges[0] == 0 and edges[-1] == k and all(b > a for a, b in zip(edges, edges[1:]))


@needs_jit
@pytest.mark.parametrize("depth, unroll", [(200, 8), (96, 1), (2048, 1)])
def test_the_probe_finds_a_simulated_blas_k_blocking(depth, unroll, monkeypatch):
    k, n = 1000, 96
    cut = np.asarray(chain_gemm.k_blocks(k, depth, unroll), np.int64)

    def fake_blas(a, w, out):  # sums as a blocked GEMM with this cut would
        return chain_gemm.chain_product(np.ascontiguousarray(a), w, cut, invariant_gemm.column_blocks(k, n), out)

    monkeypatch.setattr(invariant_gemm, "_product", fake_blas)
    w = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    assert invariant_gemm.min_rows(w) == 1
    assert np.array_equal(invariant_gemm._CHAIN_EDGES[(w.shape, w.strides)], cut)
    assert "1-8 rows on the chain kernel" in invariant_gemm.gemm_invariance_report()[f"{k}x{n}"]


@needs_jit
def test_a_blas_no_cut_reproduces_keeps_the_recipe(monkeypatch):
    def float64_blas(a, w, out):  # rounds once per element: no chain of float32 multiply-adds does
        out[...] = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
        return out

    monkeypatch.setattr(invariant_gemm, "_product", float64_blas)
    w = np.random.default_rng(2).standard_normal((300, 64)).astype(np.float32)
    assert invariant_gemm.min_rows(w) == 1
    assert invariant_gemm._CHAIN_EDGES[(w.shape, w.strides)] is None
    a = np.random.default_rng(3).standard_normal((3, 300)).astype(np.float32)
    assert np.array_equal(invariant_gemm.row_invariant_product(a, w, 1), float64_blas(a, w, np.empty((3, 64), np.float32)))


def test_a_zero_weight_does_not_decide_for_its_shape(rng):
    """Sums of zeros agree in any order; the probe runs on a random weight of the same layout."""
    zeros = np.zeros((1536, 576), np.float32)
    rows_from = invariant_gemm.min_rows(zeros)
    if rows_from is None:
        pytest.skip("this BLAS has no row-invariant recipe at all")
    w = rng.standard_normal(zeros.shape).astype(np.float32)
    x = rng.standard_normal((40, 1536)).astype(np.float32)
    full = invariant_gemm.row_invariant_product(x, w, rows_from)
    for m in (1, 2, 5, 8, 13):
        assert np.array_equal(invariant_gemm.row_invariant_product(x[:m], w, rows_from), full[:m])


def _openblas_skylakex() -> bool:
    return any(lib.get("internal_api") == "openblas" and lib.get("architecture") == "SkylakeX"
               for lib in threadpoolctl.threadpool_info())


@needs_jit
@pytest.mark.parametrize("k, n", [(576, 960), (1536, 576), (64, 4096), (2500, 128)])
def test_chain_rows_are_the_blocked_gemm_rows_on_this_blas(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows_from = invariant_gemm.min_rows(w)
    edges = invariant_gemm._CHAIN_EDGES[(w.shape, w.strides)]
    if edges is None:
        assert not _openblas_skylakex(), "OpenBLAS's SkylakeX SGEMM is reproduced on this project's machines"
        pytest.skip("this BLAS's blocked GEMM is not reproduced here: the padded recipe serves")
    x = rng.standard_normal((300, k)).astype(np.float32)
    blocked = invariant_gemm._product(x, w, np.empty((300, n), np.float32))  # past every threshold
    for m in (1, 2, 3, 7, 8):
        start = (m * 11) % 200
        chained = invariant_gemm.row_invariant_product(x[start:start + m], w, rows_from)
        assert np.array_equal(chained, blocked[start:start + m]), f"{m} rows"
        with jit.disabled():  # the recipe gives the same bits
            assert np.array_equal(invariant_gemm.row_invariant_product(x[start:start + m], w, rows_from), chained)


class _NoParallelBuild:
    def get_parallel(self):
        return None


@needs_jit
def test_numba_threads_and_the_helper_thread_give_the_same_bits(monkeypatch):
    """The parallel build (numba's threads, jit.py) runs the serial kernel on each column block, so
    it must equal the parallel_for split bit for bit, for every row count the chain kernel serves."""
    if chain_gemm._chain_blocks.get_parallel() is None:
        pytest.skip("no thread-safe numba threading layer (OpenMP or TBB) here")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((640, 1536), dtype=np.float32)
    edges = np.asarray(chain_gemm.k_blocks(640, 448, 1), np.int64)
    blocks = invariant_gemm.column_blocks(*w.shape)
    assert len(blocks) == 2
    for rows in (1, 2, 3, 8):
        a = rng.standard_normal((rows, 640), dtype=np.float32)
        threads = chain_gemm.chain_product(a, w, edges, blocks, np.empty((rows, 1536), np.float32))
        with monkeypatch.context() as patch:
            patch.setattr(chain_gemm, "_chain_blocks", _NoParallelBuild())
            helper = chain_gemm.chain_product(a, w, edges, blocks, np.empty((rows, 1536), np.float32))
        assert np.array_equal(threads, helper), rows


@needs_jit
def test_a_threading_layer_the_user_chose_that_is_not_thread_safe_turns_parallel_builds_off(monkeypatch):
    numba = jit._numba()
    monkeypatch.setattr(jit, "_LAYER", [])
    monkeypatch.setattr(numba.config, "THREADING_LAYER", "workqueue")
    assert not jit.threadsafe_layer()
    assert chain_gemm._chain_blocks.get_parallel() is None
    monkeypatch.setattr(jit, "_LAYER", [])  # the probe runs again for the rest of the session


def _child_has_a_parallel_build(answer):
    answer.put(chain_gemm._chain_blocks.get_parallel() is not None)


@needs_jit
def test_a_forked_process_keeps_to_the_helper_thread():
    """GNU OpenMP's threads do not survive a fork: a child of a process that launched parallel
    loops must not launch any (numba would end it)."""
    if chain_gemm._chain_blocks.get_parallel() is None:
        pytest.skip("no thread-safe numba threading layer (OpenMP or TBB) here")
    chain_gemm._chain_blocks.get_parallel()(*_tiny_blocks_call())  # the parent launches one
    context = multiprocessing.get_context("fork")
    answer = context.SimpleQueue()
    child = context.Process(target=_child_has_a_parallel_build, args=(answer,))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and answer.get() is False


def _tiny_blocks_call():
    a, w = np.ones((1, 8), np.float32), np.ones((8, 256), np.float32)
    return a, w, np.array([0, 8], np.int64), chain_gemm.block_array(((0, 128), (128, 256))), np.empty((1, 256), np.float32)


def test_a_fresh_process_probes_the_threading_layer_first_without_deadlock():
    """threadsafe_layer() may be the first thing a process asks (it imports numba under the same
    lock); it also shortens GNU OpenMP's spin unless the user set one."""
    import os
    import subprocess
    import sys

    code = ("import os; from infc.compiler.runtime import jit; "
            "print(jit.threadsafe_layer(), os.environ.get('GOMP_SPINCOUNT'))")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    usable, spin = done.stdout.split()
    if usable == "True" and jit.enabled():
        assert spin == str(jit.GOMP_SPIN)
    env["GOMP_SPINCOUNT"] = "77"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.split()[1] == "77"



class _Clock:
    """chain_gemm's `time` for the backoff tests: a parallel call advances the wall clock by `wall`
    and this thread's CPU clock by `own` (no real timing)."""

    def __init__(self):
        self.wall = self.own = 0.0

    def perf_counter(self):
        return self.wall

    def thread_time(self):
        return self.own


def _calls_with(monkeypatch, waits: list[bool], count: int) -> list:
    """`count` calls of over_column_blocks; the parallel ones wait (or not) as `waits` says in turn."""
    clock, calls, order = _Clock(), [], iter(waits)
    monkeypatch.setattr(chain_gemm, "time", clock)
    monkeypatch.setattr(chain_gemm, "_SPREAD_BACKOFF", chain_gemm.Backoff())

    class Kernel:
        def get_parallel(self):
            return "spread"

    def spread(build, blocks):
        calls.append("spread")
        clock.wall += 0.002
        clock.own += 0.0002 if next(order) else 0.002  # idle while the other thread started late, or busy

    for _ in range(count):
        chain_gemm.over_column_blocks(((0, 64), (64, 100)), 100, lambda n0, n1: calls.append((n0, n1)), Kernel(), spread)
    return calls


def test_a_parallel_call_left_waiting_for_the_other_thread_keeps_the_next_calls_on_this_thread(monkeypatch):
    """On a loaded machine numba's second thread may start late and the loop's join waits for it:
    after such a call (wall time far past this thread's own CPU time) the next 2 calls run on this
    thread alone, then two threads are tried again."""
    assert _calls_with(monkeypatch, [True, False, False], 5) == ["spread", (0, 100), (0, 100), "spread", "spread"]


def test_parallel_calls_that_keep_this_thread_busy_stay_parallel(monkeypatch):
    assert _calls_with(monkeypatch, [False, False, False], 3) == ["spread", "spread", "spread"]
