"""The step-cost model behind decode priority: fit, cold cap, and the cap it derives."""

import pytest

from infc.compiler.runtime.step_cost import StepCostModel


def test_fit_recovers_fixed_and_per_token_cost():
    model = StepCostModel(factor=1.5, cold_cap=64)
    for tokens in (8, 8, 40, 72, 8, 136):
        model.observe(tokens, 0.004 + 0.0001 * tokens)
    fixed, per_token = model.fit()
    assert fixed == pytest.approx(0.004) and per_token == pytest.approx(0.0001)
    # 8 decodes: a decode-only step is 4.8 ms; half of it more buys 24 ms / 0.1 ms = 24 tokens
    assert model.prefill_cap(8) == 24
    assert model.prefill_cap(0) is None


def test_cold_cap_until_steps_of_different_sizes_were_seen():
    model = StepCostModel(factor=2.0, cold_cap=64, min_cap=16)
    assert model.prefill_cap(4) == 64
    for _ in range(10):
        model.observe(8, 0.005)
    assert model.prefill_cap(4) == 64  # only one size: fixed and per-token cost cannot be told apart
    model.observe(64, 0.005)  # no size dependence at all (noise): no basis for a cap either
    assert model.fit() is None


def test_cap_never_falls_below_min_cap():
    model = StepCostModel(factor=1.1, cold_cap=64, min_cap=16)
    for tokens in (1, 100):
        model.observe(tokens, 0.001 * tokens)  # purely per-token cost: the formula allows ~0 tokens
    assert model.prefill_cap(1) == 16


def test_factor_must_exceed_one():
    with pytest.raises(ValueError, match="above 1"):
        StepCostModel(factor=1.0, cold_cap=64)
