import json
import multiprocessing

import numpy as np
import pytest

from infc.compiler.autotune.config import Config
from infc.compiler.autotune.key import TuningKey
from infc.compiler.autotune.timing_cache import TimingCache
from infc.compiler.autotune.tuner import Candidate, Problem, tune, tune_all
from infc.compiler.errors import BadInput

REFERENCE = np.ones((2, 2))
VENDOR, FAST = Config("vendor"), Config.of("alt", block=1)


def key(name="Op"):
    return TuningKey(name, (("M", 4),), ("float32",), ("row",), "none", "test-target", "src0")


class Run:
    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self):
        return REFERENCE.astype(np.float32)


class CountingBench:
    def __init__(self):
        self.num_calls = 0

    def __call__(self, run):
        self.num_calls += 1
        return [run.seconds]


def problem(name="Op", configs=(VENDOR, FAST)):
    seconds = {VENDOR: 2e-3, FAST: 1e-3, Config("other"): 5e-4}
    return Problem.of_candidates(key(name), VENDOR, [Candidate(c, Run(seconds[c])) for c in configs], lambda: REFERENCE,
                                 out_dtype="float32")


def test_round_trip_through_a_readable_file(tmp_path):
    path = tmp_path / "timing.json"
    cache = TimingCache(path)
    result = tune(problem(), CountingBench())
    cache.put(result)
    cache.save()
    text = path.read_text()
    assert text.startswith('{\n  "entries": {\n    "Op|M=4|')  # indented, keys sorted
    entry = json.loads(text)["entries"][str(key())]
    assert entry["winner"] == {"impl": "alt", "params": {"block": 1}} and entry["date"]
    assert [c["median_s"] for c in entry["candidates"]] == [2e-3, 1e-3]

    loaded = TimingCache(path).get(key())
    assert loaded.status == "cached" and loaded.winner == FAST and loaded.key == result.key
    assert loaded.candidates == result.candidates


def test_second_tune_of_a_key_benchmarks_nothing(tmp_path):
    path = tmp_path / "timing.json"
    first = CountingBench()
    tune_all([problem()], first, cache=TimingCache(path), show_progress=False)
    assert first.num_calls > 0

    second, cache = CountingBench(), TimingCache(path)
    report = tune_all([problem(), problem()], second, cache=cache, show_progress=False)
    assert second.num_calls == 0
    assert report.num_cache_hits == 1 and report.num_cache_misses == 0 and cache.num_hits == 1
    assert report.winner(key()) == FAST and report.results[str(key())].status == "cached"


def test_a_cached_winner_that_is_no_longer_a_candidate_is_retuned(tmp_path):
    path = tmp_path / "timing.json"
    tune_all([problem()], CountingBench(), cache=TimingCache(path), show_progress=False)
    bench = CountingBench()
    report = tune_all([problem(configs=(VENDOR, Config("other")))], bench, cache=TimingCache(path), show_progress=False)
    assert bench.num_calls > 0 and report.winner(key()) == Config("other")


def test_untuned_keys_are_not_cached(tmp_path):
    path = tmp_path / "timing.json"
    cache = TimingCache(path)
    tune_all([problem()], CountingBench(), budget_s=0, cache=cache, show_progress=False)
    assert len(cache) == 0 and not path.exists()


def _writer(path, name, barrier, num_entries):
    cache = TimingCache(path)  # both processes read the (empty) cache before either writes
    barrier.wait()
    for i in range(num_entries):
        cache.put(tune(problem(f"{name}{i}"), CountingBench()))
        cache.save()


def test_two_processes_writing_at_once_keep_both_entries(tmp_path):
    path = tmp_path / "timing.json"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    writers = [context.Process(target=_writer, args=(path, name, barrier, 5)) for name in ("A", "B")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(30)
    assert [writer.exitcode for writer in writers] == [0, 0]
    cache = TimingCache(path)
    assert len(cache) == 10 and all(f"{n}{i}" in {k.split("|")[0] for k in cache.entries} for n in "AB" for i in range(5))
    assert not list(tmp_path.glob(".timing.json.*.tmp"))


def test_a_bad_cache_file_is_bad_input_naming_the_file(tmp_path):
    path = tmp_path / "timing.json"
    path.write_text("{not json")
    with pytest.raises(BadInput, match=r"timing\.json: not a readable timing cache"):
        TimingCache(path)
    path.write_text(json.dumps({"format": "something-else", "entries": {}}))
    with pytest.raises(BadInput, match=r"timing\.json: not an infc timing cache"):
        TimingCache(path)
    path.write_text(json.dumps({"format": "infc-timing-cache", "version": 99, "entries": {}}))
    with pytest.raises(BadInput, match=r"field 'version' is 99"):
        TimingCache(path)


def test_a_malformed_entry_is_a_miss(tmp_path):
    path = tmp_path / "timing.json"
    path.write_text(json.dumps({"format": "infc-timing-cache", "version": 1, "entries": {str(key()): {"winner": 3}}}))
    cache = TimingCache(path)
    assert cache.get(key()) is None and cache.num_misses == 1


def test_in_memory_cache_never_writes(tmp_path):
    cache = TimingCache()
    cache.put(tune(problem(), CountingBench()))
    cache.save()
    assert cache.get(key()).winner == FAST
