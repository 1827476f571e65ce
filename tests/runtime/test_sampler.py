"""Sampler: greedy, temperature, top-k, top-p, per-request seeds, batch invariance."""

import numpy as np
import pytest

from infc.compiler.runtime.sampler import SamplingParams, make_generator, sample_batch, sample_token

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15], dtype=np.float32))


def draws(params, num=4000, seed=0):
    rng = np.random.default_rng(seed)
    return np.bincount([sample_token(LOGITS, params, rng) for _ in range(num)], minlength=len(LOGITS)) / num


def test_greedy_is_argmax():
    assert sample_token(LOGITS, SamplingParams(), np.random.default_rng(0)) == 1


def test_temperature_one_follows_the_softmax():
    frequencies = draws(SamplingParams(temperature=1.0))
    np.testing.assert_allclose(frequencies, [0.05, 0.4, 0.1, 0.3, 0.15], atol=0.03)


def test_low_temperature_sharpens():
    assert draws(SamplingParams(temperature=0.05))[1] > 0.95


def test_top_k_keeps_only_the_k_most_likely():
    frequencies = draws(SamplingParams(temperature=1.0, top_k=2))
    assert set(np.nonzero(frequencies)[0]) == {1, 3}
    np.testing.assert_allclose(frequencies[[1, 3]], [0.4 / 0.7, 0.3 / 0.7], atol=0.03)


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert set(np.nonzero(draws(SamplingParams(temperature=1.0, top_p=0.6)))[0]) == {1, 3}  # 0.4 + 0.3 >= 0.6
    assert set(np.nonzero(draws(SamplingParams(temperature=1.0, top_p=0.01)))[0]) == {1}


def test_same_seed_same_tokens_different_seed_different_tokens():
    params = SamplingParams(temperature=1.0, seed=7)
    first = [sample_token(LOGITS, params, rng) for rng in [make_generator(params, 0, 0)] for _ in range(50)]
    again = [sample_token(LOGITS, params, rng) for rng in [make_generator(params, 0, 5)] for _ in range(50)]
    assert first == again  # the request's own seed wins over its index
    unseeded = SamplingParams(temperature=1.0)
    a = [sample_token(LOGITS, unseeded, rng) for rng in [make_generator(unseeded, 0, 0)] for _ in range(50)]
    b = [sample_token(LOGITS, unseeded, rng) for rng in [make_generator(unseeded, 0, 1)] for _ in range(50)]
    assert a != b


def test_a_row_samples_the_same_alone_and_in_a_batch():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 50)).astype(np.float32)
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=i)
              for i, (t, k, p) in enumerate([(0, 0, 1), (1, 0, 1), (0.7, 5, 1), (1.2, 0, 0.8), (0, 3, 0.5), (1, 10, 0.9)])]
    batch = sample_batch(logits, params, [make_generator(p, 0, i) for i, p in enumerate(params)])
    alone = [sample_batch(logits[i:i + 1], [p], [make_generator(p, 0, i)])[0] for i, p in enumerate(params)]
    assert batch == alone


def test_row_count_must_match():
    with pytest.raises(ValueError, match="2 logits rows for 1 sequences"):
        sample_batch(np.zeros((2, 4), np.float32), [SamplingParams()], [np.random.default_rng(0)])


@pytest.mark.parametrize("params, fragment", [
    (SamplingParams(max_tokens=0), "max_tokens must be a positive integer"),
    (SamplingParams(temperature=-1.0), "temperature must be >= 0"),
    (SamplingParams(top_k=-2), "top_k must be an integer >= 0 (or -1: no limit)"),
    (SamplingParams(top_p=0.0), "top_p must be in (0, 1]"),
    (SamplingParams(seed=-1), "seed must be an integer >= 0"),  # NumPy's generators refuse it with a ValueError
])
def test_problems_are_named(params, fragment):
    assert fragment in params.problem()


def test_good_params_have_no_problem():
    assert SamplingParams(temperature=0.8, top_k=40, top_p=0.95).problem() is None


def test_top_k_minus_one_is_no_limit_as_in_vllm():
    assert SamplingParams(top_k=-1).problem() is None  # a vLLM user's trace was refused
    logits_V = np.random.default_rng(0).standard_normal(50).astype(np.float32)
    for top_k in (-1, 0):
        params = SamplingParams(temperature=1.0, top_k=top_k)
        assert [sample_token(logits_V, params, np.random.default_rng(s)) for s in range(20)] == [
            sample_token(logits_V, SamplingParams(temperature=1.0), np.random.default_rng(s)) for s in range(20)]
