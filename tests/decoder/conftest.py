"""Decoder plans of the fixtures (built once per session) and the two greedy loops the tests compare:
onnxruntime on the original model with its past-KV loop, and the paged model runner."""

from __future__ import annotations

import functools

from pathlib import Path

import numpy as np
import onnx
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.decoder.genai_export import unpack as unpack_genai
from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES
from infc.compiler.verify import ort_session

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
DECODERS = ("gpt2_ts", "gpt2_dynamo", "llama_ts", "llama_dynamo")


def build_plan(model_path, profile_path, folder: Path) -> Path:
    plan = folder / f"{Path(model_path).stem}.plan"
    build(str(model_path), str(profile_path), str(plan), BuildOptions(use_cache=False, show_progress=False))
    return plan


@pytest.fixture(scope="session")
def decoder_plans(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decoder_plans")
    return {name: build_plan(FIXTURES / f"{name}.onnx", PROFILES / f"{name.split('_')[0]}_decode.yaml", folder)
            for name in DECODERS}


def prompts(count: int, vocab: int, seed: int, max_len: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, max_len + 1)).tolist() for _ in range(count)]


@functools.lru_cache(maxsize=4)
def _session(model_path: str):
    model = onnx.load(model_path)
    return model.graph, ort_session(model)


def _genai_head_size(model_path) -> int:
    """onnxruntime-genai exports leave the KV head size symbolic: the build's unpacking pins it."""
    unpacked = unpack_genai(onnx.load(str(model_path)))
    past = next(i for i in unpacked.graph.input if i.name.startswith("past_key_values"))
    return past.type.tensor_type.shape.dim[3].dim_value


def ort_greedy(model_path, prompt: list[int], num_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and each step's last-row logits from the original model with its past-KV loop
    (a model without a KV cache runs on the whole sequence each step)."""
    model, session = _session(str(model_path))
    past = {i.name: i for i in model.input if i.name.startswith("past_key_values")}
    feeds = {name: np.zeros([1, info.type.tensor_type.shape.dim[1].dim_value, 0,
                             info.type.tensor_type.shape.dim[3].dim_value or _genai_head_size(model_path)],
                            onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type))  # float16 exports too
             for name, info in past.items()}
    names = [o.name for o in model.output]
    accepted = {i.name for i in model.input}  # onnxruntime-genai exports take no position_ids
    tokens, logits_seen, ids = [], [], list(prompt)
    start = 0
    for _ in range(num_tokens):
        feeds.update(input_ids=np.array([ids], np.int64), position_ids=np.arange(start, start + len(ids))[None],
                     attention_mask=np.ones((1, start + len(ids)), np.int64),
                     use_cache_branch=np.array([start > 0]),  # merged decoders: the no-past branch first
                     cache_position=np.arange(start, start + len(ids)), token_type_ids=np.zeros((1, len(ids)), np.int64),
                     logits_to_keep=np.array([len(ids) - 1]))  # rows to keep: the last
        out = dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in accepted})))
        logits = out["logits"][0, -1].astype(np.float32)
        logits_seen.append(logits)
        tokens.append(int(np.argmax(logits)))
        start, ids = (start + len(ids), [tokens[-1]]) if past else (0, ids + [tokens[-1]])
        for name in past:
            feeds[name] = out[name.replace("past_key_values", "present")]
    return tokens, logits_seen


def assert_greedy_matches_ort(model_path, requests, tokens, logits, num_tokens: int, share: float = 0.99) -> None:
    """Our greedy tokens and logits against onnxruntime's past-KV loop on the original model: each
    mismatch must be a near-tie of onnxruntime's logits (after it the continuations differ, so that
    request stops there), matched steps' logits agree within 1e-4, and at least `share` of the tokens match."""
    matched = 0
    for prompt, ours, our_logits in zip(requests, tokens, logits):
        ref, ref_logits = ort_greedy(model_path, prompt, num_tokens)
        for step, (a, b) in enumerate(zip(ref, ours)):
            if a != b:
                top2 = np.sort(ref_logits[step])[-2:]
                assert top2[1] - top2[0] < 1e-4 * abs(top2[1]), f"{model_path}: token {step} differs without a near-tie"
                break
            matched += 1
            np.testing.assert_allclose(our_logits[step], ref_logits[step], rtol=1e-4, atol=1e-4)
    total = len(requests) * num_tokens
    assert matched >= share * total, f"{model_path}: {matched} of {total} tokens match"


def runner_greedy(runner, prompts_: list[list[int]], num_tokens: int, chunk_sizes=None,
                  budget: int = 256) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """All requests in one batch: each step takes up to `budget` tokens in request order, prompts
    prefilled in chunks (of at most `chunk_sizes[i]` tokens when given), then decoded token by token;
    request i owns a contiguous run of blocks."""
    spec = runner.spec
    per_seq = -(-(max(map(len, prompts_)) + num_tokens) // spec.block_size)
    runner.allocate_kv(per_seq * len(prompts_))
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts_))]
    tokens = [[] for _ in prompts_]
    logits_seen = [[] for _ in prompts_]
    pending = [list(p) for p in prompts_]
    done = [0] * len(prompts_)  # tokens in the cache
    while any(len(t) < num_tokens for t in tokens):
        chunks, owners, left = [], [], budget
        for i, todo in enumerate(pending):
            if len(tokens[i]) >= num_tokens or left == 0:
                continue
            size = min(len(todo), left, chunk_sizes[i] if chunk_sizes else len(todo))
            left -= size
            chunks.append(SeqChunk(i, todo[:size], done[i], tables[i], size == len(todo)))
            owners.append(i)
        logits = runner.step(chunks)
        rows = iter(logits)
        for chunk, i in zip(chunks, owners):
            done[i] += len(chunk.token_ids)
            pending[i] = pending[i][len(chunk.token_ids):]
            if chunk.needs_logits:
                row = next(rows)
                logits_seen[i].append(row)
                tokens[i].append(int(np.argmax(row)))
                pending[i] = [tokens[i][-1]]
    return tokens, logits_seen


@pytest.fixture
def runner_for(decoder_plans):
    return lambda name: load_model_runner(decoder_plans[name])


def assert_invariant_to_batch_and_chunks(runner, requests: list[list[int]], num_tokens: int, num_alone: int,
                                         chunk_sizes: list[int], budget: int) -> None:
    """Each of the first `num_alone` requests' logits are bitwise the same alone as in the batch of all,
    and every request's the same with its prompt prefilled in chunks of `chunk_sizes`."""
    alone = [runner_greedy(runner, [p], num_tokens)[1][0] for p in requests[:num_alone]]
    _, batched = runner_greedy(runner, requests, num_tokens)
    _, chunked = runner_greedy(runner, requests, num_tokens, chunk_sizes=chunk_sizes, budget=budget)
    for i in range(num_alone):
        assert all(np.array_equal(a, b) for a, b in zip(alone[i], batched[i])), f"request {i}: alone != batched"
    for i in range(len(requests)):
        assert all(np.array_equal(a, b) for a, b in zip(batched[i], chunked[i])), f"request {i}: chunked prefill differs"
