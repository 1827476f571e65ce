"""Decoder plans of real Hugging Face model classes, exported as users export them (tests/models/hf/,
made by tests/models/make_hf_fixtures.py): greedy tokens match onnxruntime running the original export
with its past-KV loop, and a mask that is not plain causal (a sliding window) fails the build.

    qwen2_optimum   Optimum text-generation-with-past: SDPA with sqrt-scaled q and k, NaN guard
                       after Softmax, grouped KV heads, q/k/v biases
    phi3_dynamo     torch.onnx.export(dynamo=True): fused qkv_proj / gate_up_proj, partial rotary,
                       K transposed through 3-D Reshapes, dims read from other inputs' shapes
    gpt2_ts         TorchScript exporter of GPT2LMHeadModel: Conv1D projections, learned positions
"""

import numpy as np
import pytest

from infc.compiler.decoder.mask_check import _not_causal, probes
from infc.compiler.errors import BadInput
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_greedy_matches_ort, build_plan, prompts, runner_greedy

HF = FIXTURES / "hf"
HF_DECODERS = ("qwen2_optimum", "phi3_dynamo", "gpt2_ts")
NUM_REQUESTS, NUM_TOKENS = 4, 32


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """llama_decode.yaml within the fixtures' 128 positions."""
    path = tmp_path_factory.mktemp("hf_profile") / "decode.yaml"
    text = (PROFILES / "llama_decode.yaml").read_text()
    path.write_text(text.replace("max_model_len: 512", "max_model_len: 128").replace("max: 256", "max: 128")
                    .replace("max_num_batched_tokens: 256", "max_num_batched_tokens: 128"))
    return path


@pytest.mark.parametrize("name", HF_DECODERS)
def test_greedy_tokens_match_onnxruntime(name, profile, tmp_path):
    runner = load_model_runner(build_plan(HF / f"{name}.onnx", profile, tmp_path))
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=128)
    assert_greedy_matches_ort(HF / f"{name}.onnx", requests, tokens, logits, NUM_TOKENS)


def test_a_sliding_window_shorter_than_max_model_len_fails_the_build(profile, tmp_path):
    with pytest.raises(BadInput, match=r"with 0 past and 64 new tokens its mask hides or biases keys .*sliding window"):
        build_plan(HF / "mistral_window_ts.onnx", profile, tmp_path)


def test_causal_mask_check_on_masks_it_must_accept_and_refuse():
    past, new = 3, 4
    allowed = np.arange(past + new)[None, :] <= past + np.arange(new)[:, None]
    causal = np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
    assert _not_causal(causal, past, new) is None
    assert _not_causal(np.where(allowed, 0.0, -np.inf)[None, None], past, new) is None
    assert _not_causal(allowed[None, None], past, new) is None  # a boolean mask: True attends
    window = causal.copy()
    window[..., -1, 0] = np.finfo(np.float32).min
    assert _not_causal(window, past, new) == "hides or biases keys that causal attention sees"
    alibi = causal + np.where(allowed, -0.5 * np.arange(past + new), 0).astype(np.float32)
    assert _not_causal(alibi, past, new) == "hides or biases keys that causal attention sees"
    assert _not_causal(np.zeros((1, 1, new, past + new), np.float32), past, new) == "lets a query see keys after it"
    assert _not_causal(causal[..., :-1], past, new).startswith("has shape")
    assert probes(128, 32) == [(0, 32), (123, 5), (127, 1)]
    assert probes(2048, 2048) == [(0, 64), (2043, 5), (2047, 1)]
