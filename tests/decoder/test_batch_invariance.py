"""A sequence's logits are bitwise the same alone, in a batch with others, and with its prompt
prefilled in chunks of 3, 5 or 16 tokens (batch-invariant float32 GEMMs, attention per sequence)."""

import pytest

from .conftest import DECODERS, assert_invariant_to_batch_and_chunks, prompts


@pytest.mark.parametrize("name", DECODERS)
def test_logits_do_not_depend_on_the_batch_or_the_chunking(name, runner_for):
    runner = runner_for(name)
    requests = prompts(12, runner.spec.vocab_size, seed=5, max_len=60)
    assert_invariant_to_batch_and_chunks(runner, requests, 12, num_alone=3, chunk_sizes=[3, 5, 16] * 4, budget=64)


@pytest.mark.parametrize("name", ["qwen2_optimum", "gpt_oss_window_ts"])
def test_hugging_face_exports_are_batch_invariant_too(name, tmp_path):
    """Their q/k/v weights (32 x 64 merged siblings) passed the BLAS probe on an AVX2-only EPYC, whose
    SGEMM kept a row's bits with its place but not when the row sat further down the batch: the second
    request's logits moved by 7e-7 with what was batched before it (invariant_gemm._position_free)."""
    from infc.compiler.runtime.model_runner import load_model_runner

    from .conftest import build_plan
    from .test_hf_decoders import HF, _profile

    runner = load_model_runner(build_plan(HF / f"{name}.onnx", _profile(tmp_path, 128), tmp_path))
    requests = prompts(4, runner.spec.vocab_size, seed=1)
    assert_invariant_to_batch_and_chunks(runner, requests, 6, num_alone=2, chunk_sizes=[17, 40, 9, 64], budget=96)
