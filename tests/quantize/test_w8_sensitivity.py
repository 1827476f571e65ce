"""Sensitivity-based mixed precision for w8 decoder plans (quantize/w8_sensitivity.py) on the llama
decoder fixture: the weights measured as most sensitive stay fp32, keeping them lowers the
calibration KL, and the plan's metadata names them."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from infc.compiler.build import BuildOptions, build
from infc.compiler.plan.format import read_plan
from infc.compiler.quantize.greedy_agreement import runner_greedy_tokens
from infc.compiler.quantize.w8_sensitivity import (
    TeacherForced,
    calibration_prompts,
    mean_kl,
    select_fp32_weights,
)
from infc.compiler.quantize.weight_only import dequantized, quantizable_weights
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.session import _weights
from infc.compiler.testing import FIXTURES

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "llama_decode.yaml"


def _plan(tmp_path, precision: str) -> Path:
    out = tmp_path / f"llama_{precision}.bin"
    build(str(FIXTURES / "llama_ts.onnx"), str(PROFILE), str(out),
          BuildOptions(precision=precision, use_cache=False, show_progress=False))
    return out


@pytest.fixture(scope="module")
def fp32_plan(tmp_path_factory):
    return _plan(tmp_path_factory.mktemp("w8_sensitivity"), "fp32")


def _candidates(plan_path: Path) -> dict[str, np.ndarray]:
    plan = read_plan(plan_path)
    program = SimpleNamespace(steps=plan.meta["program"], weights=_weights(plan))
    axes, _ = quantizable_weights(program)
    return {name: dequantized(program.weights[name], axis) for name, axis in axes.items()}


def test_tiny_budget_keeps_the_most_sensitive_weight_per_byte(fp32_plan):
    quantized = _candidates(fp32_plan)
    total = sum(v.nbytes for v in quantized.values())
    largest = max(v.nbytes for v in quantized.values())
    report = select_fp32_weights(load_model_runner(fp32_plan), quantized, coverage=1.0,
                                 max_fp32_fraction=largest / total, num_sequences=2, num_tokens=6)
    assert report.calibration == "seeded token ids" and report.kept and report.kept_bytes <= largest
    # the budget fits any one weight: the first kept is the best score per byte of all candidates
    scores = report.scores
    assert set(scores) == set(quantized)
    best = max(scores, key=lambda n: scores[n] / quantized[n].nbytes)
    assert report.kept[0] == best
    assert 0 < report.kl_kept < report.kl_all_int8


def test_scores_are_the_kl_of_quantizing_one_weight(fp32_plan):
    quantized = _candidates(fp32_plan)
    report = select_fp32_weights(load_model_runner(fp32_plan), quantized, num_sequences=2, num_tokens=6)
    # measured again independently: fp32 greedy continuations of the same seeded prompts, one weight swapped
    runner = load_model_runner(fp32_plan)
    _, prompts = calibration_prompts(runner, 2)
    forced = TeacherForced(runner, prompts, runner_greedy_tokens(runner, prompts, 6))
    reference = forced.log_probs()
    name = next(iter(report.scores))
    assert mean_kl(reference, forced.log_probs({name: quantized[name]})) == pytest.approx(report.scores[name], rel=1e-2)
    assert mean_kl(reference, reference) == pytest.approx(0.0, abs=1e-12)


def test_w8_plan_metadata_names_the_weights_kept_fp32(tmp_path):
    meta = read_plan(_plan(tmp_path, "w8")).meta
    w8, sensitivity = meta["precision"]["w8"], meta["precision"]["accuracy"]["sensitivity"]
    assert w8["kept_fp32"] == sensitivity["kept"] and sensitivity["kl_kept"] <= sensitivity["kl_all_int8"]
    for name in w8["kept_fp32"]:  # stored fp32 under its own name, no int8 copy
        assert meta["weights"][name]["dtype"] == "float32" and f"{name}/w8" not in meta["weights"]
    assert w8["kept_fp32_bytes"] == sum(4 * int(np.prod(meta["weights"][n]["shape"])) for n in w8["kept_fp32"])
