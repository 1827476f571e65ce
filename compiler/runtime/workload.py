"""Workloads for `infc run`: a JSONL trace, or synthetic requests with Poisson arrivals.

A trace line is {"prompt": TEXT} or {"prompt_ids": [...]}, with optional max_tokens, arrival_s,
ignore_eos, temperature, top_k, top_p, seed and stop. A line that cannot be used becomes a request
carrying its error; every request carries its source (file:line). The engine serves the others, but
`infc run` refuses a whole trace with any request it cannot serve before running any of it."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..errors import BadInput
from .sampler import SamplingParams
from .sequence import Request
from .text import unicode_problem

PARAM_KEYS = {"max_tokens": int, "ignore_eos": bool, "temperature": (int, float), "top_k": int,
              "top_p": (int, float), "seed": int, "stop": (str, list)}
KEYS = {"prompt", "prompt_ids", "arrival_s", *PARAM_KEYS}


STDIN = "-"  # `--workload -`: the trace comes down a pipe (`gen_trace.py | infc run PLAN --workload -`)


def parse_trace(path: str | Path, defaults: SamplingParams = SamplingParams()) -> list[Request]:
    """The requests of a JSONL trace file, or of standard input when path is "-"; errors name
    file:line ("<stdin>:line")."""
    try:
        if str(path) == STDIN:
            path = "<stdin>"
            text = sys.stdin.buffer.read().decode("utf-8-sig")  # a leading BOM (Windows editors) is no JSON
        else:
            path = Path(path)
            text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the trace ({exc.__class__.__name__})") from None
    lines = text.splitlines()
    requests = [parse_line(line, defaults, f"{path}:{number}")
                for number, line in enumerate(lines, start=1) if line.strip()]
    if not requests:
        raise BadInput(f"{path}: the trace has no requests")
    return requests


def parse_line(line: str, defaults: SamplingParams, where: str) -> Request:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        return Request(error=f"{where}: not JSON ({exc.msg})", source=where)
    if not isinstance(data, dict):
        return Request(error=f"{where}: a trace line is a JSON object", source=where)
    problem = _line_problem(data)
    if problem:
        return Request(error=f"{where}: {problem}", source=where)
    changes = {k: data[k] for k in PARAM_KEYS if k in data}
    if isinstance(changes.get("stop"), str):
        changes["stop"] = [changes["stop"]]
    if "stop" in changes:
        changes["stop"] = tuple(changes["stop"])
    return Request(prompt=data.get("prompt"), prompt_ids=data.get("prompt_ids"),
                   params=dataclasses.replace(defaults, **changes), arrival_s=float(data.get("arrival_s", 0.0)),
                   source=where)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _line_problem(data: dict) -> str | None:
    unknown = sorted(set(data) - KEYS)
    if unknown:
        return f"unknown key '{unknown[0]}' (expected {', '.join(sorted(KEYS))})"
    if ("prompt" in data) == ("prompt_ids" in data):
        return "give exactly one of 'prompt' and 'prompt_ids'"
    if "prompt" in data and not isinstance(data["prompt"], str):
        return "'prompt' must be a string"
    if "prompt" in data and unicode_problem(data["prompt"]):
        return f"'prompt': {unicode_problem(data['prompt'])}"
    if "prompt_ids" in data and not (isinstance(data["prompt_ids"], list) and all(map(_is_int, data["prompt_ids"]))):
        return "'prompt_ids' must be a list of integers"
    arrival = data.get("arrival_s", 0.0)
    if not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or not 0 <= arrival < math.inf:
        return "'arrival_s' must be a number >= 0"
    for key, kind in PARAM_KEYS.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            return f"'{key}' has the wrong type ({type(value).__name__})"
    stops = data.get("stop", [])
    if not all(isinstance(s, str) and s for s in (stops if isinstance(stops, list) else [stops])):
        return "'stop' must be a non-empty string or a list of non-empty strings"  # "" is found at once
    return None


def parse_length(text: str, option: str) -> tuple[int, int]:
    """'128' or '16:256' (uniform in the closed range)."""
    low, colon, high = str(text).partition(":")
    try:
        bounds = (int(low), int(high if colon else low))
    except ValueError:
        raise BadInput(f"{option} {text}: expected N or LOW:HIGH") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise BadInput(f"{option} {text}: need 0 < LOW <= HIGH")
    return bounds


def synthetic(num_requests: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab_size: int,
              rate: float = math.inf, seed: int = 0, avoid_ids: tuple[int, ...] = (),
              defaults: SamplingParams = SamplingParams(ignore_eos=True)) -> list[Request]:
    """Random prompt ids and lengths, EOS ignored by default; arrivals a Poisson process of `rate`
    requests per second (all at once when the rate is infinite)."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(avoid_ids, dtype=np.int64))
    gaps = rng.exponential(1.0 / rate, num_requests) if math.isfinite(rate) else np.zeros(num_requests)
    arrivals = np.cumsum(gaps) - (gaps[0] if num_requests else 0.0)
    requests = []
    for i in range(num_requests):
        num_in = int(rng.integers(input_len[0], input_len[1] + 1))
        num_out = int(rng.integers(output_len[0], output_len[1] + 1))
        prompt_ids = rng.choice(allowed, num_in).tolist()
        requests.append(Request(prompt_ids=prompt_ids, arrival_s=float(arrivals[i]),
                                params=dataclasses.replace(defaults, max_tokens=num_out)))
    return requests
