"""Greedy tokens of the paged runner against onnxruntime running the ORIGINAL fixture with its past-KV
loop: 32 requests x 32 tokens per decoder, all requests batched together in the runner."""

import numpy as np
import pytest

from infc.compiler.testing import FIXTURES

from .conftest import DECODERS, ort_greedy, prompts, runner_greedy

NUM_REQUESTS, NUM_TOKENS = 32, 32


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_tokens_match_onnxruntime(name, runner_for):
    runner = runner_for(name)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=0)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS)
    matched = 0
    for prompt, ours, our_logits in zip(requests, tokens, logits):
        ref, ref_logits = ort_greedy(FIXTURES / f"{name}.onnx", prompt, NUM_TOKENS)
        for step, (a, b) in enumerate(zip(ref, ours)):
            if a != b:  # after a divergence the two continuations differ: stop comparing this request
                top2 = np.sort(ref_logits[step])[-2:]
                assert top2[1] - top2[0] < 1e-4 * abs(top2[1]), f"{name}: token {step} differs without a near-tie"
                break
            matched += 1
            np.testing.assert_allclose(our_logits[step], ref_logits[step], rtol=1e-4, atol=1e-4)
    assert matched >= 0.99 * NUM_REQUESTS * NUM_TOKENS, f"{name}: {matched} of {NUM_REQUESTS * NUM_TOKENS} tokens match"
