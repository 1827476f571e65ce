import io
import json

import numpy as np
import pytest
from rich.console import Console

from infc.compiler.autotune.config import Config
from infc.compiler.autotune.key import TuningKey
from infc.compiler.autotune.tuner import (UNTUNED_BUDGET, Candidate, Problem, TuneSettings, check_output, results_table,
                                          tune, tune_all)
from infc.compiler.errors import BadInput

REFERENCE = np.arange(6, dtype=np.float64).reshape(2, 3)
VENDOR = Config("vendor")
FAST, SLOW = Config.of("alt", block=1), Config.of("alt", block=2)


def key(op="Op", m=1):
    return TuningKey(op, (("M", m),), ("float32",), ("row",), "none", "test-target", "src0")


class FakeRun:
    """Runs instantly; `seconds` is what the injected bench reports for it."""

    def __init__(self, seconds, output=None, error=None):
        self.seconds, self.error = seconds, error
        self.output = REFERENCE.astype(np.float32) if output is None else output

    def __call__(self):
        if self.error:
            raise self.error
        return self.output


class FakeBench:
    def __init__(self, clock=None):
        self.calls = []
        self.clock = clock

    def __call__(self, run):
        self.calls.append(run)
        if self.clock is not None:
            self.clock.now += 1.0
        return [run.seconds] * 3


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def problem(runs, problem_key=None, **options):
    candidates = [Candidate(config, run if isinstance(run, FakeRun) else FakeRun(run)) for config, run in runs.items()]
    return Problem.of_candidates(problem_key or key(), VENDOR, candidates, lambda: REFERENCE, out_dtype="float32", **options)


def statuses(result):
    return {str(c.config): c.status for c in result.candidates}


def test_injected_bench_decides_the_winner():
    result = tune(problem({VENDOR: 10.0, FAST: 5.0, SLOW: 7.0}), FakeBench())
    assert result.winner == FAST
    assert result.status == "tuned"
    assert result.percent_of_vendor(result.result_of(FAST)) == pytest.approx(50.0)
    assert all(c.is_ok for c in result.candidates)


def test_wrong_candidate_scores_inf_and_is_never_chosen():
    wrong = FakeRun(1.0, output=(REFERENCE + 0.5).astype(np.float32))
    bench = FakeBench()
    result = tune(problem({VENDOR: 10.0, FAST: wrong, SLOW: 7.0}), bench)
    bad = result.result_of(FAST)
    assert bad.status.startswith("wrong: max error") and "at (" in bad.status
    assert bad.median_s == float("inf")
    assert result.winner == SLOW
    assert wrong not in bench.calls  # numerics come before timing


def test_tolerance_is_relative_for_float32():
    nearly = REFERENCE.astype(np.float32) * np.float32(1 + 5e-5)
    assert check_output(nearly, REFERENCE, 1e-4) is None
    assert check_output(REFERENCE * (1 + 5e-4), REFERENCE, 1e-4).startswith("max error")
    assert check_output(REFERENCE, REFERENCE, 1e-4, "float32") == "dtype float64, expected float32"
    assert check_output(REFERENCE[:1], REFERENCE, 1e-4).startswith("shape")
    with_nan = REFERENCE.copy()
    with_nan[1, 2] = np.nan
    assert check_output(with_nan, REFERENCE, 1e-4) == "non-finite value at (1, 2)"


def test_exception_scores_inf_with_the_reason():
    crashing = FakeRun(1.0, error=RuntimeError("no kernel for this shape"))
    result = tune(problem({VENDOR: 10.0, FAST: crashing}), FakeBench())
    assert result.result_of(FAST).status == "failed: RuntimeError: no kernel for this shape"
    assert result.result_of(FAST).median_s == float("inf")
    assert result.winner == VENDOR


def test_benchmark_failure_scores_inf():
    def bench(run):
        if run.seconds == 1.0:
            raise MemoryError("out of memory")
        return [run.seconds]

    result = tune(problem({VENDOR: 10.0, FAST: 1.0}), bench)
    assert result.result_of(FAST).status == "failed: benchmark: MemoryError: out of memory"
    assert result.winner == VENDOR


def test_tie_goes_to_the_vendor():
    assert tune(problem({VENDOR: 10.0, FAST: 9.8}), FakeBench()).winner == VENDOR  # within 3%
    assert tune(problem({VENDOR: 10.0, FAST: 9.0}), FakeBench()).winner == FAST


def test_tie_between_others_goes_to_the_smaller_config_string():
    result = tune(problem({VENDOR: 20.0, SLOW: 10.0, FAST: 10.1}), FakeBench())
    assert str(FAST) < str(SLOW)
    assert result.winner == FAST


def test_vendor_is_always_a_candidate_and_never_pruned():
    built = []

    def build(config):
        built.append(config)
        return FakeRun({VENDOR: 10.0, FAST: 5.0, SLOW: 1.0}[config])

    prune = lambda config: "too big" if config in (SLOW, VENDOR) else None  # noqa: E731
    result = tune(Problem(key(), VENDOR, [FAST, SLOW], build, lambda: REFERENCE, prune=prune), FakeBench())
    assert [c.config for c in result.candidates] == [VENDOR, FAST, SLOW]
    assert statuses(result) == {"vendor": "ok", str(FAST): "ok", str(SLOW): "pruned: too big"}
    assert SLOW not in built  # pruned before anything is built or prepacked
    assert result.winner == FAST


def test_nothing_right_falls_back_to_the_vendor():
    wrong = (REFERENCE + 1).astype(np.float32)
    result = tune(problem({VENDOR: FakeRun(10.0, output=wrong), FAST: FakeRun(5.0, output=wrong)}), FakeBench())
    assert result.winner == VENDOR
    assert not any(c.is_ok for c in result.candidates)


def test_rounds_call_the_bench_per_candidate_and_take_the_median():
    bench = FakeBench()
    result = tune(problem({VENDOR: 10.0, FAST: 5.0}), bench, rounds=2, confirm_rounds=0)
    assert len(bench.calls) == 4
    assert result.result_of(FAST).num_runs == 6


def test_a_winner_must_beat_the_vendor_again_head_to_head():
    flattered = FakeRun(5.0)
    calls = []

    def bench(run):  # the candidate looked fast during the main rounds only
        calls.append(run)
        return [run.seconds if len(calls) <= 6 or run is not flattered else 12.0]

    result = tune(problem({VENDOR: 10.0, FAST: flattered}), bench, rounds=3, confirm_rounds=2)
    assert len(calls) == 6 + 4
    assert result.winner == VENDOR
    assert result.note == "head-to-head: alt(block=1) at 120% of vendor: vendor kept"
    assert result.result_of(FAST).median_s == 5.0  # the table still shows what the main rounds measured

    confirmed = tune(problem({VENDOR: 10.0, FAST: 5.0}), FakeBench())
    assert confirmed.winner == FAST and confirmed.note == "head-to-head: alt(block=1) at 50% of vendor"


def test_budget_exhaustion_gives_the_vendor_untuned():
    clock = FakeClock()
    bench = FakeBench(clock)
    problems = [problem({VENDOR: 10.0, FAST: 5.0}, key(m=m)) for m in (1, 2, 4)]
    report = tune_all(problems, bench, budget_s=1.0, show_progress=False, clock=clock)
    first, *rest = report.results.values()
    # The first key starts inside the budget: the vendor is timed, the rest is out of time.
    assert first.status == "partial (budget)"
    assert statuses(first) == {"vendor": "ok", str(FAST): UNTUNED_BUDGET}
    for result in rest:
        assert result.status == UNTUNED_BUDGET and result.winner == VENDOR
        assert {c.status for c in result.candidates} == {UNTUNED_BUDGET}
    assert report.count(UNTUNED_BUDGET) == 2
    assert all(run.seconds == 10.0 for run in bench.calls)  # only vendors were timed


def test_tune_all_tunes_each_key_once():
    bench = FakeBench()
    report = tune_all([problem({VENDOR: 10.0, FAST: 5.0}), problem({VENDOR: 10.0, FAST: 5.0})], bench,
                      show_progress=False)
    assert len(report.results) == 1
    assert len(bench.calls) == 2 * 3 + 2 * 2  # two candidates, three rounds, two head-to-head rounds
    assert report.winner(key()) == FAST


def test_table_and_json_show_every_candidate():
    crashing = FakeRun(1.0, error=ValueError("bad"))
    report = tune_all([problem({VENDOR: 10e-6, FAST: 4e-6, SLOW: crashing})], FakeBench(), show_progress=False)
    text = json.dumps(report.to_json(), allow_nan=False)  # inf is written as null
    data = json.loads(text)
    assert data["num_tuned"] == 1
    entry = data["results"][0]
    assert entry["winner"] == FAST.to_json() and entry["winner_percent_of_vendor"] == 40.0
    assert [c["status"] for c in entry["candidates"]] == ["ok", "ok", "failed: ValueError: bad"]
    assert entry["candidates"][2]["median_s"] is None
    console = Console(file=io.StringIO(), width=200)
    console.print(results_table(report.results.values()))
    printed = console.file.getvalue()
    assert "4.0 µs" in printed and "40%" in printed and "winner" in printed and "failed: ValueError: bad" in printed


def test_progress_can_be_disabled():
    stream = io.StringIO()
    tune_all([problem({VENDOR: 1.0})], FakeBench(), show_progress=False, console=Console(file=stream))
    assert stream.getvalue() == ""


def test_settings_from_profile():
    settings = TuneSettings.from_profile({"tune": {"budget_s": 30, "m_buckets": [1, 16, 256]}})
    assert settings.budget_s == 30 and settings.m_buckets == (1, 16, 256)
    assert TuneSettings.from_profile(None) == TuneSettings()
    with pytest.raises(BadInput, match=r"^cpu\.yaml: tune\.m_buckets: buckets must be strictly increasing"):
        TuneSettings.from_profile({"tune": {"m_buckets": [4, 2]}}, source="cpu.yaml")
    with pytest.raises(BadInput, match=r"^cpu\.yaml: tune\.budget_s: expected a non-negative number"):
        TuneSettings.from_profile({"tune": {"budget_s": "soon"}}, source="cpu.yaml")
