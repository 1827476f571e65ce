"""A sequence's logits are bitwise the same alone, in a batch with others, and with its prompt
prefilled in chunks of 3, 5 or 16 tokens (batch-invariant float32 GEMMs, attention per sequence)."""

import pytest

from .conftest import DECODERS, assert_invariant_to_batch_and_chunks, prompts


@pytest.mark.parametrize("name", DECODERS)
def test_logits_do_not_depend_on_the_batch_or_the_chunking(name, runner_for):
    runner = runner_for(name)
    requests = prompts(12, runner.spec.vocab_size, seed=5, max_len=60)
    assert_invariant_to_batch_and_chunks(runner, requests, 12, num_alone=3, chunk_sizes=[3, 5, 16] * 4, budget=64)
