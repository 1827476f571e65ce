"""Weights stored in fewer bytes than their type where that loses nothing (plan/weight_encoding.py):
float32 weights holding bfloat16 values (a bf16 plan's rounded weights) are stored as their high
halves and come back bit for bit; other weights are stored as they are."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from infc.compiler.build import BuildOptions, build, weights_section
from infc.compiler.plan.format import read_plan, write_plan
from infc.compiler.errors import BadInput
from infc.compiler.plan.weight_encoding import BF16_HIGH_HALF, encode
from infc.compiler.runtime.feeds_io import random_plan_feeds
from infc.compiler.runtime.session import PlanSession, _weights
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import ort_session

PROFILES = FIXTURES.parents[1] / "profiles"


def _bf16_values(rng, shape) -> np.ndarray:
    bits = rng.standard_normal(shape).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def test_bf16_valued_weights_are_stored_as_halves_and_load_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    weights = {"rounded": _bf16_values(rng, (64, 48)), "plain": rng.standard_normal((64, 48)).astype(np.float32),
               "small": _bf16_values(rng, (8,)), "ints": np.arange(4096, dtype=np.int64)}
    weights["plain"][0, 0] = 1.0  # its first value a bf16: the rest still is not
    section, table = weights_section(weights)
    assert table["rounded"]["encoding"] == BF16_HIGH_HALF and table["rounded"]["dtype"] == "float32"
    assert all("encoding" not in table[name] for name in ("plain", "small", "ints"))
    write_plan(tmp_path / "w.plan", {"weights": table}, {"weights": section})
    plan = read_plan(tmp_path / "w.plan", check_meta=False)
    loaded = _weights(plan)
    for name, array in weights.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name].view(np.uint8), array.view(np.uint8))
    assert len(plan.sections["weights"]) < sum(a.nbytes for a in weights.values()) - 64 * 48 * 2 + 4 * 64


def test_an_unknown_encoding_is_a_corrupt_plan(tmp_path):
    stored, encoding = encode(_bf16_values(np.random.default_rng(1), (32, 64)))
    section, table = weights_section({"w": stored})
    table["w"].update(dtype="float32", encoding="zstd")
    write_plan(tmp_path / "w.plan", {"weights": table}, {"weights": section})
    with pytest.raises(BadInput, match="encoding 'zstd'"):
        _weights(read_plan(tmp_path / "w.plan", check_meta=False))


def test_a_bf16_plans_rounded_weights_take_half_their_bytes_and_it_matches_onnxruntime(tmp_path):
    """bert_ts in bf16: its rounded GEMM weights were stored as float32 beside their bf16 packing."""
    plan = tmp_path / "bf16.plan"
    build(str(FIXTURES / "bert_ts.onnx"), str(PROFILES / "bert.yaml"), str(plan),
          BuildOptions(use_cache=False, show_progress=False, precision="bf16"))
    stored = read_plan(plan)
    table = stored.meta["weights"]
    logical = {name: int(np.prod(w["shape"] or [1])) * np.dtype(w["dtype"]).itemsize for name, w in table.items()}
    encoded = sum(logical[name] for name, w in table.items() if w.get("encoding") == BF16_HIGH_HALF)
    assert encoded > 0.3 * sum(logical.values())
    assert len(stored.sections["weights"]) <= sum(logical.values()) - encoded // 2 + 64 * len(table)
    session = PlanSession(plan)
    feeds = session.check_feeds(random_plan_feeds(session, seed=3), "test inputs")
    reference = ort_session(onnx.load(FIXTURES / "bert_ts.onnx"))
    names = [o.name for o in reference.get_outputs()]
    expected, got = reference.run(names, feeds), session.run(feeds)
    for name, want in zip(names, expected):
        scale = float(np.abs(want).max()) or 1.0
        assert float(np.abs(got[name] - want).max()) / scale < 5e-2, name
