"""A timing measured on a busy machine is stamped with its load and re-timed by a build on a quiet one."""

import json
import os

import pytest

from infc.compiler.autotune.machine_load import BUSY_PER_CORE, busy_load
from infc.compiler.autotune.timing_cache import TimingCache
from infc.compiler.autotune.tuner import tune_all

from .test_timing_cache import FAST, CountingBench, key, problem


@pytest.fixture
def load(monkeypatch):
    """Sets the machine's 1-minute load average, in loads per core."""
    monkeypatch.setenv("INFC_BUSY_CHECK", "1")
    level = {"per_core": 0.0}
    monkeypatch.setattr(os, "getloadavg", lambda: (level["per_core"] * (os.cpu_count() or 1), 0.0, 0.0))
    return level


def test_busy_is_a_load_above_the_threshold_per_core(load, monkeypatch):
    load["per_core"] = BUSY_PER_CORE * 0.9
    assert busy_load() is None
    load["per_core"] = BUSY_PER_CORE * 1.5
    assert busy_load() == pytest.approx(BUSY_PER_CORE * 1.5 * (os.cpu_count() or 1), abs=0.01)
    monkeypatch.setenv("INFC_BUSY_CHECK", "0")
    assert busy_load() is None


def test_a_busy_timing_is_retimed_on_a_quiet_machine_and_kept_on_a_busy_one(tmp_path, load):
    path = tmp_path / "timing.json"
    load["per_core"] = 10.0
    busy_cache = TimingCache(path)
    tune_all([problem()], CountingBench(), cache=busy_cache, show_progress=False)
    entry = json.loads(path.read_text())["entries"][str(key())]
    assert entry["busy_load"] == busy_cache.busy_load > 0

    still_busy, cache = CountingBench(), TimingCache(path)
    report = tune_all([problem()], still_busy, cache=cache, show_progress=False)
    assert still_busy.num_calls == 0 and report.num_cache_hits == 1  # nothing better to measure with

    load["per_core"] = 0.1
    quiet, cache = CountingBench(), TimingCache(path)
    report = tune_all([problem()], quiet, cache=cache, show_progress=False)
    assert quiet.num_calls > 0 and report.num_cache_misses == 1 and cache.num_busy_retimed == 1
    assert report.winner(key()) == FAST
    assert "busy_load" not in json.loads(path.read_text())["entries"][str(key())]  # the quiet timing replaced it
    assert TimingCache(path).get(key()) is not None


def _tiny_gemm_model(path):
    """One MatMul with a constant weight: the build tunes its GEMM."""
    import numpy as np
    import onnx
    from onnx import helper

    from infc.compiler.testing import make_model

    weight = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float32, [8, 64])],
                       [("y", np.float32, [8, 32])], {"w": weight})
    onnx.save(model, path)
    return path


def test_a_build_on_a_busy_machine_says_so_and_a_quiet_one_tunes_again(tmp_path, load):
    from infc.compiler.build import BuildOptions, build

    model = _tiny_gemm_model(tmp_path / "gemm.onnx")
    load["per_core"] = 10.0
    notes = []
    report = build(model, None, tmp_path / "busy.bin", BuildOptions(cache_dir=tmp_path / "cache", show_progress=False),
                   notes.append)
    assert report["timing_cache"]["busy_load"] > 0 and "busy_retimed" not in report["timing_cache"]
    assert any(n.startswith("warning: the machine was busy while tuning") for n in notes)

    load["per_core"] = 0.0
    notes = []
    report = build(model, None, tmp_path / "quiet.bin", BuildOptions(cache_dir=tmp_path / "cache", show_progress=False),
                   notes.append)
    assert report["cache_hit"] is False and "tuned on a busy machine" in report["cache_reason"]
    assert report["timing_cache"]["busy_retimed"] > 0 and "busy_load" not in report["timing_cache"]
    assert not any(n.startswith("warning:") for n in notes)
