"""Greedy tokens of the paged runner against onnxruntime running the ORIGINAL fixture with its past-KV
loop: 32 requests x 32 tokens per decoder, all requests batched together in the runner."""

import pytest

from infc.compiler.testing import FIXTURES

from .conftest import DECODERS, assert_greedy_matches_ort, prompts, runner_greedy

NUM_REQUESTS, NUM_TOKENS = 32, 32


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_tokens_match_onnxruntime(name, runner_for):
    runner = runner_for(name)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=0)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS)
    assert_greedy_matches_ort(FIXTURES / f"{name}.onnx", requests, tokens, logits, NUM_TOKENS)
