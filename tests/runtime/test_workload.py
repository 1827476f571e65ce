"""Workloads: JSONL traces (malformed lines become per-request errors naming their line) and synthetic Poisson ones."""

import json
import math

import numpy as np
import pytest

from infc.compiler.errors import BadInput
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.workload import parse_length, parse_trace, synthetic


def write_trace(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_good_lines(tmp_path):
    path = write_trace(tmp_path, [
        {"prompt": "hello", "max_tokens": 8, "arrival_s": 0.5},
        "",
        {"prompt_ids": [1, 2, 3], "ignore_eos": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 3, "stop": "\n"},
    ])
    first, second = parse_trace(path, SamplingParams(max_tokens=32))
    assert first.prompt == "hello" and first.params.max_tokens == 8 and first.arrival_s == 0.5 and first.error is None
    assert second.prompt_ids == [1, 2, 3] and second.params.max_tokens == 32
    assert (first.source, second.source) == (f"{path}:1", f"{path}:3")  # a refusal names the line
    assert second.params == SamplingParams(max_tokens=32, temperature=0.7, top_k=5, top_p=0.9, seed=3, ignore_eos=True, stop=("\n",))


@pytest.mark.parametrize("line, fragment", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a trace line is a JSON object"),
    ({"prompt": "a", "prompt_ids": [1]}, "exactly one of 'prompt' and 'prompt_ids'"),
    ({"max_tokens": 3}, "exactly one of 'prompt' and 'prompt_ids'"),
    ({"prompt": 5}, "'prompt' must be a string"),
    ({"prompt_ids": [1, "2"]}, "'prompt_ids' must be a list of integers"),
    ({"prompt_ids": [1, True]}, "'prompt_ids' must be a list of integers"),
    ({"prompt": "a", "arrival_s": -1}, "'arrival_s' must be a number >= 0"),
    ({"prompt": "a", "max_tokens": "8"}, "'max_tokens' has the wrong type (str)"),
    ({"prompt": "a", "ignore_eos": 1}, "'ignore_eos' has the wrong type (int)"),
    ({"prompt": "a", "stop": ["", "x"]}, "'stop' must be a non-empty string or a list of non-empty strings"),
    ({"prompt": "a", "stop": ""}, "'stop' must be a non-empty string"),  # stopped every request at its first token
    ({"prompt": "a", "colour": "red"}, "unknown key 'colour'"),
    ('{"prompt": "\\ud800 lone"}', "'prompt': character 0 ('\\ud800') is not valid Unicode"),  # tokenizers: TypeError
])
def test_malformed_lines_become_errors_and_the_others_survive(tmp_path, line, fragment):
    path = write_trace(tmp_path, [{"prompt": "fine"}, line])
    good, bad = parse_trace(path)
    assert good.error is None
    assert bad.error.startswith(f"{path}:2: ") and fragment in bad.error and bad.source == f"{path}:2"


def test_a_trace_written_with_a_bom_and_crlf_lines(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt_ids": [1, 2]}\r\n{"prompt": "caf\xc3\xa9"}\r\n')
    first, second = parse_trace(path)
    assert first.error is None and first.prompt_ids == [1, 2] and second.prompt == "caf\u00e9"


def test_unreadable_or_empty_trace(tmp_path):
    with pytest.raises(BadInput, match="cannot read the trace"):
        parse_trace(tmp_path / "missing.jsonl")
    with pytest.raises(BadInput, match="no requests"):
        parse_trace(write_trace(tmp_path, ["", "  "]))


def test_parse_length():
    assert parse_length("128", "--input-len") == (128, 128)
    assert parse_length("16:256", "--input-len") == (16, 256)
    for bad in ("x", "0", "9:3", "1:"):
        with pytest.raises(BadInput, match="--input-len"):
            parse_length(bad, "--input-len")


def test_synthetic_is_seeded_and_within_bounds():
    requests = synthetic(200, (16, 256), (4, 8), vocab_size=300, seed=1, avoid_ids=(0, 299))
    again = synthetic(200, (16, 256), (4, 8), vocab_size=300, seed=1, avoid_ids=(0, 299))
    assert [r.prompt_ids for r in requests] == [r.prompt_ids for r in again]
    lengths = [len(r.prompt_ids) for r in requests]
    assert min(lengths) >= 16 and max(lengths) <= 256 and len(set(lengths)) > 50
    assert all(4 <= r.params.max_tokens <= 8 and r.params.ignore_eos for r in requests)
    ids = np.concatenate([r.prompt_ids for r in requests])
    assert ids.min() >= 1 and ids.max() <= 298
    assert all(r.arrival_s == 0 for r in requests)


def test_poisson_arrivals():
    requests = synthetic(2000, (4, 4), (1, 1), vocab_size=10, rate=50.0, seed=2)
    arrivals = np.array([r.arrival_s for r in requests])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert math.isclose(np.diff(arrivals).mean(), 1 / 50, rel_tol=0.1)
