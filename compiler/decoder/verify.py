"""`infc build --verify` for decoder plans: the plan's paged runner against onnxruntime on the
original export.

A seeded prompt is prefilled and decoded greedily by the runner, as `infc run` serves it; every
step's last-row logits are held to onnxruntime's on the same tokens, the whole sequence fed at once
with an empty past (no KV loop to get wrong on the reference side). An export whose inputs cannot
be made up here (an input of unknown meaning, a past whose head size is symbolic) is reported as
not verified, with the reason, rather than failing a plan that built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ..errors import error_reason
from ..runtime.decode_api import SeqChunk
from ..runtime.model_runner import load_model_runner
from ..verify import compare_outputs, ort_session

PROMPT_TOKENS, DECODED_TOKENS = 8, 4
REFERENCE = "onnxruntime on the original model (the whole sequence each step, empty past), graph optimizations off"


def verify_decoder_plan(model: onnx.ModelProto, plan_path: Path, seed: int = 7) -> dict:
    runner = load_model_runner(plan_path)
    spec = runner.spec
    prompt = np.random.default_rng(seed).integers(0, spec.vocab_size, PROMPT_TOKENS).tolist()
    ours, sequence = _runner_greedy(runner, prompt, DECODED_TOKENS)
    try:
        expected = _reference_logits(model, runner.logits_name, sequence, len(prompt), spec.head_dim)
    except _CannotFeed as exc:
        return {"skipped": str(exc), "reference": REFERENCE}
    diff = compare_outputs(["logits"], [expected], [ours])[0]
    agree = int(np.sum(np.argmax(expected, axis=-1) == np.argmax(ours, axis=-1)))
    return {"max_abs_diff": diff.max_abs_diff, "max_rel_diff": diff.max_rel_diff, "outputs": [diff.to_json()],
            "greedy_tokens_agree": f"{agree}/{len(ours)}", "reference": REFERENCE}


def _runner_greedy(runner, prompt: list[int], num_tokens: int) -> tuple[np.ndarray, list[int]]:
    """Each step's logits row [steps, vocab] and the tokens fed (prompt, then the greedy ones)."""
    block_size = runner.spec.block_size
    table = list(range(-(-(len(prompt) + num_tokens) // block_size)))
    runner.allocate_kv(len(table))
    rows, sequence, chunk = [], list(prompt), SeqChunk(0, list(prompt), 0, table, True)
    for _ in range(num_tokens):
        rows.append(np.asarray(runner.step([chunk])[0], np.float32))
        token = int(np.argmax(rows[-1]))
        chunk = SeqChunk(0, [token], len(sequence), table, True)
        sequence.append(token)
    return np.stack(rows), sequence


class _CannotFeed(Exception):
    pass


def _reference_logits(model: onnx.ModelProto, logits_name: str, sequence: list[int], prompt_len: int,
                      head_dim: int) -> np.ndarray:
    names = [o.name for o in model.graph.output]
    name = logits_name if logits_name in names else names[0]
    try:
        session = ort_session(model)
    except Exception as exc:  # noqa: BLE001 - the reason goes in the report
        raise _CannotFeed(f"onnxruntime cannot load the model: {error_reason(exc)}") from None
    rows = []
    for length in range(prompt_len, prompt_len + DECODED_TOKENS):
        feeds = _feeds(model, sequence[:length], head_dim)
        try:
            logits = session.run([name], feeds)[0]
        except Exception as exc:  # noqa: BLE001
            raise _CannotFeed(f"onnxruntime cannot run the model on made-up decoder inputs: {error_reason(exc)}") from None
        rows.append(np.asarray(logits, np.float32).reshape(-1, logits.shape[-1])[-1])
    return np.stack(rows)


# inputs other than past key/values, by name: their value for one sequence of `n` tokens
SEQUENCE_INPUTS = {
    "input_ids": lambda ids: np.array([ids]),
    "attention_mask": lambda ids: np.ones((1, len(ids))),
    "position_ids": lambda ids: np.arange(len(ids))[None],
    "cache_position": lambda ids: np.arange(len(ids)),
    "token_type_ids": lambda ids: np.zeros((1, len(ids))),
    "use_cache_branch": lambda ids: np.array([False]),  # merged decoders: the no-past branch
    "logits_to_keep": lambda ids: np.array([len(ids) - 1]),
}


def _past_dim(dim, axis: int, rank: int, head_dim: int) -> int:
    """A past input's dim for one sequence with nothing cached: the batch 1, the past length 0, a
    symbolic last dim (onnxruntime-genai's `kv_cache_dim`) the plan's head size."""
    if dim.HasField("dim_value"):
        return dim.dim_value
    if axis == 0:
        return 1
    if axis == rank - 1 and "past" not in dim.dim_param and "seq" not in dim.dim_param:
        return head_dim
    return 0


def _feeds(model: onnx.ModelProto, ids: list[int], head_dim: int) -> dict:
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if value.name in SEQUENCE_INPUTS:
            feeds[value.name] = SEQUENCE_INPUTS[value.name](ids).astype(dtype)
        elif "past" in value.name:  # [batch, heads, past, head_dim] and the like: batch 1, past 0
            dims = [_past_dim(d, axis, len(tensor.shape.dim), head_dim) for axis, d in enumerate(tensor.shape.dim)]
            if sum(d == 0 for d in dims) != 1:
                raise _CannotFeed(f"input '{value.name}': cannot tell its past length among dims "
                                  f"{[d.dim_param or d.dim_value for d in tensor.shape.dim]}")
            feeds[value.name] = np.zeros(dims, dtype)
        else:
            raise _CannotFeed(f"input '{value.name}': no value to give it")
    return feeds
