"""SmolLM2-135M-Instruct (exported by scripts/export_smollm2.py to build/smollm2/, not committed):
the chat-templated capital-of-France question answers Paris, and greedy tokens of 16 requests x 32
tokens match onnxruntime's past-KV loop. Skipped when the export is missing."""

from pathlib import Path

import numpy as np
import pytest

from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.model_runner import load_model_runner

from .conftest import PROFILES, build_plan, ort_greedy, prompts, runner_greedy

EXPORT = Path(__file__).resolve().parents[2] / "build" / "smollm2" / "model.onnx"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not EXPORT.is_file(), reason="run scripts/export_smollm2.py first")]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return load_model_runner(build_plan(EXPORT, PROFILES / "smollm2_decode.yaml", tmp_path_factory.mktemp("smollm2")))


def test_capital_of_france_is_paris(smollm2):
    tokenizers, jinja2 = pytest.importorskip("tokenizers"), pytest.importorskip("jinja2")
    tokenizer = tokenizers.Tokenizer.from_str(smollm2.tokenizer_json.decode())
    text = jinja2.Environment().from_string(smollm2.chat_template).render(
        messages=[{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    smollm2.allocate_kv(8)
    logits, out = smollm2.step([SeqChunk(0, ids, 0, list(range(8)), True)]), []
    while len(out) < 24 and (not out or out[-1] not in smollm2.spec.eos_token_ids):
        out.append(int(np.argmax(logits[0])))
        logits = smollm2.step([SeqChunk(0, out[-1:], len(ids) + len(out) - 1, list(range(8)), True)])
    assert "Paris" in tokenizer.decode(out)


def test_greedy_tokens_match_onnxruntime(smollm2):
    requests = prompts(16, smollm2.spec.vocab_size, seed=0, max_len=64)
    tokens, _ = runner_greedy(smollm2, requests, 32, budget=512)
    matched = 0
    for prompt, ours in zip(requests, tokens):
        ref, ref_logits = ort_greedy(EXPORT, prompt, 32)
        for step, (a, b) in enumerate(zip(ref, ours)):
            if a != b:
                top2 = np.sort(ref_logits[step])[-2:]
                assert top2[1] - top2[0] < 1e-4 * abs(top2[1]), f"token {step} differs without a near-tie"
                break
            matched += 1
    assert matched >= 0.99 * 16 * 32, f"{matched} of {16 * 32} tokens match"
