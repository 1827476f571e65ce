"""The in-context check of a reduced-precision program's tactic variants (compiler/tune_context.py)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from infc.compiler import tune_context
from infc.compiler.runtime import kernels
from infc.compiler.runtime.vendor_op import TACTIC
from infc.compiler.testing import lowered_and_observed
from infc.compiler.verify import ort_session


def _conv_program():
    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    program, _ = lowered_and_observed(model, {"opt": feeds})
    (step,) = program.steps
    step["tactic"] = TACTIC  # untimed: the "all" subset runs it in onnxruntime
    return program, feeds, ort_session(model).run(None, feeds)[0]


def test_a_variant_that_rounds_otherwise_is_kept_when_as_close_to_fp32(monkeypatch):
    """A quantized program's onnxruntime variant flips activations by a step where infc's kernels do
    not, and a deep network carries that past 1e-2 (ResNet-50 int8: every tactic refused, each
    variant as far from fp32 as infc's program). Here infc's kernel is made 10% off, standing for
    the program's own rounding: the variant disagrees with it, and is judged by fp32."""
    program, feeds, y = _conv_program()
    key = (program.steps[0].get("domain") or "", program.steps[0]["op"])
    conv = kernels.KERNELS[key]
    monkeypatch.setitem(kernels.KERNELS, key, lambda inputs, attrs, ctx: tuple(v * 1.1 for v in conv(inputs, attrs, ctx)))
    true_fp32 = {"y": y}

    def refused(**kwargs):  # on a fresh program: a call leaves only the marks it keeps
        summary = tune_context.confirm_in_context(_conv_program()[0], feeds, budget_s=0.0, **kwargs)
        return [r for r in summary["rejected_wrong"] if not r.startswith("none")]

    (reason,) = refused()
    assert "outputs differ by more than" in reason  # agreement alone: refused
    assert refused(fp32_reference=true_fp32) == []  # closer to fp32 than the program: a candidate
    # farther from fp32 than the program (here: the program is the fp32 answer): refused, and why
    (reason,) = refused(fp32_reference={"y": true_fp32["y"] * 1.1})
    # its fp32 answer here, up to the summation order of infc's convolution against onnxruntime's (0 on
    # some machines, 1.8e-7 of the largest output on an AVX-512 EPYC)
    prefix, program_distance = reason.rsplit("of the largest output from fp32, where infc's program is ", 1)
    assert prefix.endswith("0.0909 ") and float(program_distance) < 1e-6, reason


def test_the_race_gives_the_time_of_dropped_variants_to_the_close_ones():
    """tune_context.race: the deadline is fixed when the race starts (budget per variant raced)."""
    now = [0.0]

    class Variant:
        def __init__(self, seconds):
            self.seconds = seconds

        def run(self, feeds):
            now[0] += self.seconds

    sides = {"none": Variant(1.0), "close_a": Variant(0.5), "close_b": Variant(0.51),
             **{f"slow{i}": Variant(2.0) for i in range(5)}}
    times = tune_context.race(sides, {}, budget_s=10.0, clock=lambda: now[0])
    assert all(len(times[f"slow{i}"]) == tune_context.CONFIRM_MIN_RUNS for i in range(5))  # dropped after the minimum
    assert len(times["close_a"]) == len(times["close_b"]) == len(times["none"]) > 2 * tune_context.CONFIRM_MIN_RUNS
    assert now[0] <= 10.0 * len(sides) + 2.01  # the budget, and at most one round past it


def test_a_tiny_variant_stalled_in_its_first_runs_is_not_dropped_before_the_race_has_run_a_while():
    """Five rounds of a 0.15 ms model are a millisecond: a shared machine's stall (a 10 ms time slice) in
    three of them once dropped silero-vad's whole model (11.6 ms in the race, 0.15 ms apart)."""
    now = [0.0]

    class Variant:
        def __init__(self, seconds, stalls=0):
            self.seconds, self.stalls = seconds, stalls

        def run(self, feeds):
            now[0] += 0.01 if self.stalls else self.seconds
            self.stalls = max(0, self.stalls - 1)

    sides = {"none": Variant(0.0009), "all": Variant(0.0004), "whole": Variant(0.00015, stalls=3)}
    times = tune_context.race(sides, {}, budget_s=1.0, clock=lambda: now[0])
    medians = {label: sorted(t)[len(t) // 2] for label, t in times.items()}
    assert len(times["whole"]) > 10 * tune_context.CONFIRM_MIN_RUNS and medians["whole"] == pytest.approx(0.00015)
