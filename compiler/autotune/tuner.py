"""The generic autotuner: prune -> check numerics -> benchmark -> pick.

It knows nothing about GEMMs. A problem is a tuning key, the configs to try (the vendor's among
them, always), a `build` that turns a config into a callable running it once and returning its
output, and a float64 reference output. A candidate that raises or disagrees with the reference
scores infinity and is reported with why; the rest are timed by an injectable `bench_fn(run) ->
list of seconds` and compared by median. Ties within `tie_rtol` go to the vendor, then to the
smallest config string, so the pick is deterministic and never slower than the vendor as measured;
a winner other than the vendor must beat it once more head-to-head, since on a shared machine one
burst of load can flatter a candidate or sink the vendor.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import BadInput
from .buckets import DEFAULT_M_BUCKETS, parse_m_buckets
from .config import Config
from .key import TuningKey

if TYPE_CHECKING:
    from .timing_cache import TimingCache

INF = math.inf
TIE_RTOL = 0.03
ROUNDS = 3
CONFIRM_ROUNDS = 2
# Allowed max |out - ref| relative to max |ref|, by output dtype (GEMM errors grow with K, so the
# scale is the whole output's, not each element's).
TOLERANCES = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
STATUS_OK = "ok"
UNTUNED_BUDGET = "untuned (budget)"

Run = Callable[[], Any]
BenchFn = Callable[[Run], Sequence[float]]


def _keep_all(config: Config) -> str | None:
    return None


@dataclass(frozen=True)
class Candidate:
    config: Config
    run: Run


@dataclass(frozen=True)
class Problem:
    key: TuningKey
    vendor: Config
    configs: Sequence[Config]
    build: Callable[[Config], Run]  # may prepack weights, so it is called only for configs that survive pruning
    reference: Callable[[], np.ndarray]  # float64, computed once per tune
    prune: Callable[[Config], str | None] = _keep_all  # a reason to skip a config without running it
    out_dtype: str | None = None  # the expected output dtype; picks the tolerance unless rtol is given
    rtol: float | None = None

    @classmethod
    def of_candidates(cls, key: TuningKey, vendor: Config, candidates: Sequence[Candidate],
                      reference: Callable[[], np.ndarray], **options: Any) -> Problem:
        """For candidates whose callables already exist (nothing to prepack)."""
        runs = {candidate.config: candidate.run for candidate in candidates}
        return cls(key, vendor, tuple(runs), runs.__getitem__, reference, **options)


@dataclass(frozen=True)
class CandidateResult:
    config: Config
    status: str  # "ok", "wrong: <why>", "failed: <why>", "pruned: <why>" or "untuned (budget)"
    median_s: float = INF  # what the pick compares
    num_runs: int = 0
    min_s: float = INF  # the unloaded speed: far below the median means the machine was busy

    @property
    def is_ok(self) -> bool:
        return self.status == STATUS_OK

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "status": self.status,
                "median_s": _finite(self.median_s), "min_s": _finite(self.min_s), "num_runs": self.num_runs}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateResult:
        median, fastest = data.get("median_s"), data.get("min_s")
        return cls(Config.from_json(data["config"]), str(data["status"]), INF if median is None else float(median),
                   int(data.get("num_runs", 0)), INF if fastest is None else float(fastest))


@dataclass(frozen=True)
class TuneResult:
    key: TuningKey
    vendor: Config
    winner: Config
    candidates: tuple[CandidateResult, ...]
    status: str  # "tuned", "cached", "partial (budget)" or "untuned (budget)"
    date: str  # when it was measured (UTC, ISO 8601)
    note: str = ""  # how the pick was confirmed

    def result_of(self, config: Config) -> CandidateResult | None:
        return next((c for c in self.candidates if c.config == config), None)

    @property
    def vendor_s(self) -> float:
        vendor = self.result_of(self.vendor)
        return vendor.median_s if vendor else INF

    @property
    def winner_s(self) -> float:
        winner = self.result_of(self.winner)
        return winner.median_s if winner else INF

    def percent_of_vendor(self, candidate: CandidateResult) -> float | None:
        if not (math.isfinite(candidate.median_s) and math.isfinite(self.vendor_s) and self.vendor_s > 0):
            return None
        return 100.0 * candidate.median_s / self.vendor_s

    def to_json(self) -> dict[str, Any]:
        winner = self.result_of(self.winner)
        return {"key": str(self.key), "key_fields": self.key.to_json(), "status": self.status, "date": self.date,
                "vendor": self.vendor.to_json(), "winner": self.winner.to_json(), "note": self.note,
                "winner_percent_of_vendor": _round(self.percent_of_vendor(winner)) if winner else None,
                "candidates": [dict(c.to_json(), percent_of_vendor=_round(self.percent_of_vendor(c))) for c in self.candidates]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], status: str | None = None) -> TuneResult:
        """Raises ValueError, KeyError or TypeError on a malformed entry."""
        return cls(TuningKey.from_json(data["key_fields"]), Config.from_json(data["vendor"]),
                   Config.from_json(data["winner"]), tuple(CandidateResult.from_json(c) for c in data["candidates"]),
                   status or str(data["status"]), str(data["date"]), str(data.get("note", "")))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def check_output(out: Any, reference: np.ndarray, rtol: float, out_dtype: str | None = None) -> str | None:
    """None when `out` matches the float64 reference, else why not (with where the worst difference is)."""
    out = np.asarray(out)
    if out.shape != reference.shape:
        return f"shape {out.shape}, expected {reference.shape}"
    if out_dtype is not None and str(out.dtype) != out_dtype:
        return f"dtype {out.dtype}, expected {out_dtype}"
    if out.size == 0:
        return None
    diff = np.abs(out.astype(np.float64) - reference)
    if not np.all(np.isfinite(diff)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(diff))[0])
        return f"non-finite value at {where}"
    error = float(diff.max()) / max(float(np.abs(reference).max()), np.finfo(np.float64).tiny)
    if error > rtol:
        where = tuple(int(i) for i in np.unravel_index(int(diff.argmax()), diff.shape))
        return f"max error {error:.1e} of max |ref| at {where} > {rtol:.0e}"
    return None


def _short_error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:160] if text else type(exc).__name__


def pick_winner(results: Sequence[CandidateResult], vendor: Config, tie_rtol: float = TIE_RTOL) -> Config:
    ok = [c for c in results if c.is_ok]
    if not ok:
        return vendor  # nothing measured right: the vendor is still the safest thing to run
    best = min(c.median_s for c in ok)
    tied = [c for c in ok if c.median_s <= best * (1.0 + tie_rtol)]
    if any(c.config == vendor for c in tied):
        return vendor
    return min(tied, key=lambda c: str(c.config)).config


def _configs_with_vendor(problem: Problem) -> list[Config]:
    configs = [problem.vendor] + [c for c in problem.configs if c != problem.vendor]
    return list(dict.fromkeys(configs))  # drop repeats, keep order


def tune(problem: Problem, bench_fn: BenchFn, *, rounds: int = ROUNDS, confirm_rounds: int = CONFIRM_ROUNDS,
         tie_rtol: float = TIE_RTOL, key_budget_s: float | None = None,
         clock: Callable[[], float] = time.perf_counter) -> TuneResult:
    """Tune one key: `rounds` bench_fn calls per candidate, the median over all their times; a winner
    other than the vendor must then beat it again in `confirm_rounds` alternating head-to-head calls.
    Past `key_budget_s` no further candidates are timed (the vendor always is)."""
    start = clock()
    results: dict[Config, CandidateResult] = {}
    survivors = []
    for config in _configs_with_vendor(problem):
        reason = None if config == problem.vendor else problem.prune(config)
        if reason is not None:
            results[config] = CandidateResult(config, f"pruned: {reason}")
        else:
            survivors.append(config)

    reference = np.asarray(problem.reference(), dtype=np.float64)
    out_dtype = problem.out_dtype
    rtol = problem.rtol if problem.rtol is not None else TOLERANCES.get(out_dtype or "float32", TOLERANCES["float32"])
    runs: dict[Config, Run] = {}
    for config in survivors:
        try:
            run = problem.build(config)
            reason = check_output(run(), reference, rtol, out_dtype)
        except Exception as exc:  # a candidate's failure is a result, never a crash of the build
            results[config] = CandidateResult(config, f"failed: {_short_error(exc)}")
            continue
        if reason is not None:
            results[config] = CandidateResult(config, f"wrong: {reason}")
        else:
            runs[config] = run

    # Rounds interleave the candidates in time, so a burst of load from another process spreads
    # over all of them instead of sinking the one being timed.
    times: dict[Config, list[float]] = {config: [] for config in runs}
    for _ in range(rounds):
        for config, run in runs.items():
            if config in results:
                continue  # failed in an earlier round
            if config != problem.vendor and key_budget_s is not None and clock() - start >= key_budget_s:
                continue
            try:
                measured = list(bench_fn(run))
            except Exception as exc:
                results[config] = CandidateResult(config, f"failed: benchmark: {_short_error(exc)}")
                continue
            if not measured:
                results[config] = CandidateResult(config, "failed: benchmark returned no times")
                continue
            times[config].extend(measured)
    is_partial = False
    for config, measured in times.items():
        if config in results:
            continue
        if measured:
            results[config] = CandidateResult(config, STATUS_OK, float(statistics.median(measured)), len(measured),
                                              float(min(measured)))
        else:
            results[config] = CandidateResult(config, UNTUNED_BUDGET)
            is_partial = True

    ordered = tuple(results[c] for c in _configs_with_vendor(problem))
    winner = pick_winner(ordered, problem.vendor, tie_rtol)
    note = ""
    if winner != problem.vendor and problem.vendor in runs and confirm_rounds > 0:
        winner, note = _head_to_head(runs, problem.vendor, winner, bench_fn, confirm_rounds, tie_rtol)
    return TuneResult(problem.key, problem.vendor, winner, ordered, "partial (budget)" if is_partial else "tuned",
                      _now(), note)


def _head_to_head(runs: Mapping[Config, Run], vendor: Config, winner: Config, bench_fn: BenchFn, num_rounds: int,
                  tie_rtol: float) -> tuple[Config, str]:
    """Times the winner against the vendor once more, alternating: a burst of load that flattered the
    winner (or sank the vendor) in the main rounds rarely repeats, so the pick stays no slower than the vendor."""
    times: dict[Config, list[float]] = {vendor: [], winner: []}
    try:
        for _ in range(num_rounds):
            for config in times:
                times[config].extend(bench_fn(runs[config]))
        ratio = statistics.median(times[winner]) / statistics.median(times[vendor])
    except Exception as exc:  # also statistics.StatisticsError on an empty list of times
        return vendor, f"head-to-head failed ({_short_error(exc)}): vendor kept"
    if ratio * (1.0 + tie_rtol) < 1.0:
        return winner, f"head-to-head: {winner} at {100 * ratio:.0f}% of vendor"
    return vendor, f"head-to-head: {winner} at {100 * ratio:.0f}% of vendor: vendor kept"


def untuned(problem: Problem) -> TuneResult:
    return TuneResult(problem.key, problem.vendor, problem.vendor,
                      tuple(CandidateResult(c, UNTUNED_BUDGET) for c in _configs_with_vendor(problem)), UNTUNED_BUDGET, _now())


@dataclass(frozen=True)
class WallClockBench:
    """The real CPU benchmark: warm-up runs, then timed runs (perf_counter) until the budget is spent."""

    warmup: int = 1
    min_runs: int = 3
    max_runs: int = 200
    budget_s: float = 0.03  # per call: one candidate in one round

    def __call__(self, run: Run) -> list[float]:
        for _ in range(self.warmup):
            run()
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < self.max_runs and (len(times) < self.min_runs or time.perf_counter() - start < self.budget_s):
            begin = time.perf_counter()
            run()
            times.append(time.perf_counter() - begin)
        return times


@dataclass(frozen=True)
class TuneSettings:
    """The profile's `tune:` section."""

    budget_s: float | None = 120.0  # for the whole build; None: no limit
    m_buckets: tuple[int, ...] = DEFAULT_M_BUCKETS
    candidate_budget_s: float = 0.1  # split over the rounds
    tie_rtol: float = TIE_RTOL

    def bench(self, rounds: int = ROUNDS) -> WallClockBench:
        return WallClockBench(budget_s=self.candidate_budget_s / rounds)

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | None, source: str = "profile") -> TuneSettings:
        tune_section = (profile or {}).get("tune") or {}
        if not isinstance(tune_section, Mapping):
            raise BadInput(f"{source}: tune: expected a mapping")
        values: dict[str, Any] = {}
        for name in ("budget_s", "candidate_budget_s", "tie_rtol"):
            if name in tune_section:
                value = tune_section[name]
                is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
                if not (is_number or (name == "budget_s" and value is None)):
                    raise BadInput(f"{source}: tune.{name}: expected a non-negative number, got {value!r}")
                values[name] = value
        try:
            values["m_buckets"] = parse_m_buckets(tune_section.get("m_buckets"))
        except ValueError as exc:
            raise BadInput(f"{source}: {exc}") from None
        return cls(**values)


@dataclass
class TuneReport:
    results: dict[str, TuneResult]  # by key string, in the order first asked for
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    time_s: float = 0.0

    def winner(self, key: TuningKey) -> Config:
        return self.results[str(key)].winner

    def count(self, status: str) -> int:
        return sum(1 for r in self.results.values() if r.status == status)

    def to_json(self) -> dict[str, Any]:
        return {"num_keys": len(self.results), "num_cache_hits": self.num_cache_hits, "num_cache_misses": self.num_cache_misses,
                "num_tuned": self.count("tuned"), "num_partial": self.count("partial (budget)"),
                "num_untuned": self.count(UNTUNED_BUDGET), "time_s": round(self.time_s, 3),
                "results": [r.to_json() for r in self.results.values()]}


def _describe(key: TuningKey) -> str:
    return f"{key.op} " + " ".join(f"{name}={size}" for name, size in key.shape)


def tune_all(problems: Iterable[Problem], bench_fn: BenchFn | None = None, *, budget_s: float | None = None,
             key_budget_s: float | None = None, rounds: int = ROUNDS, confirm_rounds: int = CONFIRM_ROUNDS,
             tie_rtol: float = TIE_RTOL, cache: TimingCache | None = None, show_progress: bool = True, console: Console | None = None,
             clock: Callable[[], float] = time.perf_counter) -> TuneReport:
    """Tune every distinct key once: cache hits are free, and once `budget_s` is spent the remaining
    keys get the vendor config, marked "untuned (budget)" (and are not cached, so a later build tunes them)."""
    bench_fn = bench_fn or WallClockBench()
    unique: dict[str, Problem] = {}
    for problem in problems:
        unique.setdefault(str(problem.key), problem)
    report = TuneReport({})
    start = clock()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console or Console(stderr=True), disable=not show_progress, transient=True) as progress:
            task = progress.add_task("tuning", total=len(unique))
            for key_text, problem in unique.items():
                progress.update(task, description=f"tuning {_describe(problem.key)}")
                cached = cache.get(problem.key) if cache is not None else None
                if cached is not None and cached.winner in _configs_with_vendor(problem):
                    report.num_cache_hits += 1
                    report.results[key_text] = cached
                else:
                    report.num_cache_misses += 1
                    remaining = None if budget_s is None else budget_s - (clock() - start)
                    if remaining is not None and remaining <= 0:
                        report.results[key_text] = untuned(problem)
                    else:
                        limits = [b for b in (key_budget_s, remaining) if b is not None]
                        result = tune(problem, bench_fn, rounds=rounds, confirm_rounds=confirm_rounds,
                                      tie_rtol=tie_rtol, key_budget_s=min(limits) if limits else None, clock=clock)
                        report.results[key_text] = result
                        if cache is not None and result.status == "tuned":
                            cache.put(result)
                progress.advance(task)
    finally:
        if cache is not None:
            cache.save()
    report.time_s = clock() - start
    return report


def _format_s(seconds: float, status: str) -> str:
    if not math.isfinite(seconds):
        return "inf" if status.startswith(("wrong", "failed")) else "-"  # wrong and failed score infinity; the rest never ran
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def results_table(results: Iterable[TuneResult], title: str = "autotuning") -> Table:
    table = Table(title=title)
    for column, justify in (("key", "left"), ("candidate", "left"), ("median", "right"), ("% of vendor", "right"),
                            ("min", "right"), ("status", "left"), ("", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for result in results:
        for i, candidate in enumerate(result.candidates):
            percent = result.percent_of_vendor(candidate)
            mark = "winner" if candidate.config == result.winner else ""
            heading = f"{_describe(result.key)} {result.key.dtypes[-1]} ({result.status})"
            heading += f"\n{result.note}" if result.note else ""
            table.add_row(heading if i == 0 else "",
                          str(candidate.config), _format_s(candidate.median_s, candidate.status),
                          "" if percent is None else f"{percent:.0f}%", _format_s(candidate.min_s, candidate.status),
                          candidate.status, mark, end_section=i == len(result.candidates) - 1)
    return table
