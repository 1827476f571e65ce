"""The step-cost model behind decode priority: fit (with and without the attention term), cold cap,
and the cap it derives."""

import pytest

from infc.compiler.runtime.step_cost import StepCostModel, attended_positions


def test_fit_recovers_fixed_and_per_token_cost():
    model = StepCostModel(factor=1.5, cold_cap=64)
    for tokens in (8, 8, 40, 72, 8, 136):
        model.observe(tokens, 0.004 + 0.0001 * tokens)
    fixed, per_token, per_position = model.fit()
    assert fixed == pytest.approx(0.004) and per_token == pytest.approx(0.0001) and per_position == 0
    # 8 decodes: a decode-only step is 4.8 ms; half of it more buys 2.4 ms / 0.1 ms = 24 tokens
    assert model.prefill_cap([100] * 8) == 24
    assert model.prefill_cap([]) is None


def test_attended_positions_count_each_tokens_context():
    assert attended_positions([(10, 1)]) == 11  # a decode token at position 10 reads 11 positions
    assert attended_positions([(0, 4)]) == 1 + 2 + 3 + 4
    assert attended_positions([(6, 2), (3, 1)]) == 7 + 8 + 4


def test_fit_with_attention_caps_late_chunks_of_a_long_prompt_harder():
    fixed, per_token, per_position = 0.004, 0.0001, 1e-7
    model = StepCostModel(factor=1.5, cold_cap=64)
    for chunks in ([(50, 1)] * 8, [(0, 64)], [(900, 1)] * 4 + [(64, 100)], [(2000, 32)], [(10, 1)] * 2 + [(300, 200)],
                   [(1500, 1)] * 16, [(0, 512)]):
        tokens = sum(n for _, n in chunks)
        model.observe(tokens, fixed + per_token * tokens + per_position * attended_positions(chunks), attended_positions(chunks))
    assert model.fit() == pytest.approx((fixed, per_token, per_position))
    decodes = [200] * 8
    early, late = model.prefill_cap(decodes, 0), model.prefill_cap(decodes, 1900)
    assert late < early
    budget_s = 0.5 * (fixed + per_token * 8 + per_position * sum(decodes))
    for start, cap in ((0, early), (1900, late)):  # the cap spends the budget: one more token would not fit
        cost = lambda p: per_token * p + per_position * attended_positions([(start, p)])  # noqa: E731
        assert cost(cap) <= budget_s * (1 + 1e-9) < cost(cap + 1)


def test_cold_cap_until_steps_of_different_sizes_were_seen():
    model = StepCostModel(factor=2.0, cold_cap=64, min_cap=16)
    assert model.prefill_cap([5] * 4) == 64
    for _ in range(10):
        model.observe(8, 0.005)
    assert model.prefill_cap([5] * 4) == 64  # only one size: fixed and per-token cost cannot be told apart
    model.observe(64, 0.005)  # no size dependence at all (noise): no basis for a cap either
    assert model.fit() is None


def test_cap_never_falls_below_min_cap():
    model = StepCostModel(factor=1.1, cold_cap=64, min_cap=16)
    for tokens in (1, 100):
        model.observe(tokens, 0.001 * tokens)  # purely per-token cost: the formula allows ~0 tokens
    assert model.prefill_cap([3]) == 16


def test_factor_must_exceed_one():
    with pytest.raises(ValueError, match="above 1"):
        StepCostModel(factor=1.0, cold_cap=64)
