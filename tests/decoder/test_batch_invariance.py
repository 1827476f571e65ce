"""A sequence's logits are bitwise the same alone, in a batch with others, and with its prompt
prefilled in chunks of 3, 5 or 16 tokens (float64 GEMMs, attention per sequence)."""

import numpy as np
import pytest

from .conftest import DECODERS, prompts, runner_greedy


@pytest.mark.parametrize("name", DECODERS)
def test_logits_do_not_depend_on_the_batch_or_the_chunking(name, runner_for):
    runner = runner_for(name)
    requests = prompts(12, runner.spec.vocab_size, seed=5, max_len=60)
    alone = [runner_greedy(runner, [p], 12)[1][0] for p in requests[:3]]
    _, batched = runner_greedy(runner, requests, 12)
    _, chunked = runner_greedy(runner, requests, 12, chunk_sizes=[3, 5, 16] * 4, budget=64)
    for i in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(alone[i], batched[i])), f"request {i}: alone != batched"
    for i in range(len(requests)):
        assert all(np.array_equal(a, b) for a, b in zip(batched[i], chunked[i])), f"request {i}: chunked prefill differs"
