"""Self-repair: the overflow fixture breaks in fp16 (an intermediate above 65504 feeding a LayerNorm)
and repair_precision finds and pins the one node responsible, on the raw and the optimized graph."""

import math

import onnx
import pytest
from infc.compiler.errors import BadInput
from infc.compiler.feeds import random_feeds
from infc.compiler.optimize import optimize_model
from infc.compiler.quantize.precision import convert_precision
from infc.compiler.quantize.repair import repair_precision
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import compare_outputs, ort_session

TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def overflow():
    return onnx.load(FIXTURES / "overflow_fp16.onnx")


def _feeds(model):
    return [random_feeds(model, seed) for seed in range(3)]


def _error(original, model, feeds):
    names = [o.name for o in original.graph.output]
    return max(d.max_rel_diff for d in compare_outputs(names, ort_session(original).run(names, feeds),
                                                        ort_session(model).run(names, feeds)))


@pytest.mark.parametrize("is_optimized", [False, True])
def test_overflow_fixture_is_repaired_by_pinning_the_wide_matmul(overflow, is_optimized):
    original = optimize_model(overflow).model if is_optimized else overflow
    converted, _ = convert_precision(original, "fp16")
    feeds = _feeds(original)
    assert not _error(original, converted, feeds[0]) <= TOLERANCE  # inf / NaN: the fp16 overflow is real
    repaired, report = repair_precision(original, converted, TOLERANCE, feeds)
    assert report.pinned == [["wide_matmul", "MatMul"]]
    assert math.isinf(report.error_before) or report.error_before > TOLERANCE
    assert report.error_after <= TOLERANCE and report.is_within_tolerance and report.is_minimal
    assert all(_error(original, repaired, f) <= TOLERANCE for f in feeds)
    # the pin is a plain setting: converting again with it gives the repaired model's numerics
    again, _ = convert_precision(original, "fp16", pinned={"wide_matmul"})
    assert _error(original, again, feeds[0]) == _error(original, repaired, feeds[0])


def test_model_within_tolerance_is_returned_as_is(overflow):
    converted, _ = convert_precision(overflow, "bf16")  # bf16 has fp32's range: no overflow
    repaired, report = repair_precision(overflow, converted, TOLERANCE, _feeds(overflow))
    assert repaired is converted and report.pinned == [] and report.error_after == report.error_before <= TOLERANCE


def test_search_budget_pins_whole_chunks(overflow):
    converted, _ = convert_precision(overflow, "fp16")
    _, report = repair_precision(overflow, converted, TOLERANCE, _feeds(overflow), max_conversions=2)
    assert not report.is_minimal and report.is_within_tolerance
    assert ["wide_matmul", "MatMul"] in report.pinned and len(report.pinned) > 1


def test_search_time_budget_pins_whole_chunks(overflow):
    converted, _ = convert_precision(overflow, "fp16")
    _, report = repair_precision(overflow, converted, TOLERANCE, _feeds(overflow), max_seconds=0.0)
    assert not report.is_minimal and report.is_within_tolerance
    assert ["wide_matmul", "MatMul"] in report.pinned and len(report.pinned) > 1


def test_repair_needs_a_model_from_convert_precision(overflow):
    with pytest.raises(BadInput, match="infc.precision"):
        repair_precision(overflow, overflow, TOLERANCE, _feeds(overflow))
