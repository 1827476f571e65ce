"""The CPU executor runs an fp16 / bf16 program's Cast pairs through the low type as one rounding step
(runtime/cast_fold.py): Shape readers of the low value read the rounded one, repeated roundings are
dropped, Casts onnxruntime runs stay, and the results are the planned program's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from infc.compiler.runtime.cast_fold import CPU_ROUND_OP, fold_rounding
from infc.compiler.runtime.executor import Executor


def cast(name, src, to, **extra):
    return {"op": "Cast", "domain": "", "name": name, "inputs": [src], "outputs": [name], "attrs": {"to": to}, **extra}


def op(kind, inputs, name, attrs=None):
    return {"op": kind, "domain": "", "name": name, "inputs": inputs, "outputs": [name], "attrs": attrs or {}}


def _program(low: int) -> list[dict]:
    return [op("Relu", ["x"], "a"),
            cast("a16", "a", low), op("Shape", ["a16"], "a_shape"), cast("a32", "a16", 1),  # Shape reads the low value
            op("Reshape", ["a32", "a_shape"], "r"),
            cast("r16", "r", low), cast("r32", "r16", 1),  # rounds values already rounded: dropped
            op("Mul", ["r32", "x"], "m"),
            cast("m16", "m", low), cast("m32", "m16", 1), op("Relu", ["m16"], "kept16"),  # m16 read twice: kept
            cast("k32", "kept16", 1), op("Add", ["m32", "k32"], "y")]


def _ops(steps):
    return [(s.get("domain") or "", s["op"]) for s in steps]


@pytest.mark.parametrize("low", [10, 16])
def test_pairs_fold_and_repeated_rounding_is_dropped(low):
    folded = fold_rounding(_program(low), keep={"y"})
    assert _ops(folded).count(CPU_ROUND_OP) == 1 and _ops(folded).count(("", "Cast")) == 3
    shape = next(s for s in folded if s["op"] == "Shape")
    assert shape["inputs"] == ["a32"]  # the rounded fp32 value has the low value's shape
    mul = next(s for s in folded if s["op"] == "Mul")
    assert mul["inputs"] == ["r", "x"]  # r is a32 reshaped: already rounded, its rounding dropped


@pytest.mark.parametrize("low", [10, 16])
def test_the_folded_program_gives_the_planned_results(low):
    steps = _program(low)
    x = (np.random.default_rng(5).standard_normal((3, 70)) * 300).astype(np.float32)
    x[0, :4] = [70000.0, 2.0**-20, -0.0, 1.0 + 2.0**-11]  # overflow, a subnormal, a signed zero, a tie
    folded = Executor(steps, {}, 17, output_names=["y"])
    assert [step.key for step in folded._steps].count(CPU_ROUND_OP) == 1
    planned = Executor(steps, {}, 17, output_names=["y"], observer=lambda name, value: None)  # runs the steps as planned
    want, got = planned.run({"x": x})["y"], folded.run({"x": x})["y"]
    assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_a_pair_after_a_float64_value_gives_float32():
    # float32 -> float64 -> float16 -> float32 (fuzz_graphs --forms edge seed 2118): the folded pair
    # gave the float64 back and every op after it computed in float64
    steps = [cast("d", "x", 11), cast("h", "d", 10), cast("f", "h", 1), op("Add", ["f", "x"], "y")]
    x = np.array([[0.1, 1.0 + 2.0**-12, 3.0, 70000.0]], np.float32)
    folded = Executor(steps, {}, 17, output_names=["y"])
    assert [step.key for step in folded._steps].count(CPU_ROUND_OP) == 1
    got = folded.run({"x": x})["y"]
    assert got.dtype == np.float32
    assert np.array_equal(got, x.astype(np.float64).astype(np.float16).astype(np.float32) + x)


def test_casts_onnxruntime_runs_and_graph_outputs_stay():
    steps = [op("Relu", ["x"], "a"), cast("a16", "a", 10, tactic="onnxruntime"), cast("a32", "a16", 1),
             op("Relu", ["a32"], "b"), cast("b16", "b", 10), cast("b32", "b16", 1)]
    assert _ops(fold_rounding(steps, keep={"a32", "b16"})) == _ops(steps)
    assert fold_rounding([op("Relu", ["x"], "a")], keep={"a"}) == [op("Relu", ["x"], "a")]  # no low type: as is


def test_values_an_island_reads_keep_their_names():
    """An onnxruntime island is fed by value name: the rounding of a value it reads stays, even when
    the value holds rounded values already (elsewhere its readers would read the input instead)."""
    island = {"op": "__island__", "domain": "", "name": "island", "inputs": ["r32"], "outputs": ["y"],
              "section": "island/0"}
    steps = [*_program(10)[:7], island]
    folded = fold_rounding(steps, keep={"y"})
    assert folded[-1]["inputs"] == ["r32"]
    assert [s["outputs"] for s in folded if (s.get("domain"), s["op"]) == CPU_ROUND_OP] == [["a32"], ["r32"]]


def test_a_tuned_gemm_that_rounds_its_output_drops_the_rounding_after_it():
    from infc.compiler.runtime.cast_fold import fold_rounding

    gemm = {"op": "TunedMatMul", "domain": "infc.cpu", "inputs": ["a", "w"], "outputs": ["y"],
            "attrs": {"variants": [], "round_to": 16}}
    casts = [{"op": "Cast", "domain": "", "inputs": ["y"], "outputs": ["y/bf16"], "attrs": {"to": 16}},
             {"op": "Cast", "domain": "", "inputs": ["y/bf16"], "outputs": ["y/fp32"], "attrs": {"to": 1}},
             {"op": "Relu", "domain": "", "inputs": ["y/fp32"], "outputs": ["z"], "attrs": {}}]
    folded = fold_rounding([gemm, *casts], {"z"})
    assert [s["op"] for s in folded] == ["TunedMatMul", "Relu"] and folded[1]["inputs"] == ["y"]
    # in onnxruntime (a tactic) the product is not rounded: the rounding stays
    folded = fold_rounding([{**gemm, "tactic": "onnxruntime"}, *casts], {"z"})
    assert [s["op"] for s in folded] == ["TunedMatMul", "RoundTo", "Relu"]
    unrounded = {**gemm, "attrs": {"variants": []}}
    assert [s["op"] for s in fold_rounding([unrounded, *casts], {"z"})] == ["TunedMatMul", "RoundTo", "Relu"]
