"""The paged model runner: step metadata built from chunks, the KV pool, logits rows, bad input."""

from pathlib import Path

import numpy as np
import pytest

from infc.compiler.build import BuildOptions, build
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import write_plan
from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.invariant_gemm import gemm_invariance_report
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.target import cpu_fingerprint
from infc.compiler.testing import FIXTURES

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    plan = tmp_path_factory.mktemp("runner") / "llama.plan"
    build(str(FIXTURES / "llama_ts.onnx"), str(PROFILES / "llama_decode.yaml"), str(plan), BuildOptions(use_cache=False))
    runner = load_model_runner(plan)
    runner.allocate_kv(8)
    return runner


def test_spec_and_pool_size(runner):
    spec = runner.spec
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size, spec.block_size) == (2, 4, 2, 16, 128, 16)
    assert runner.kv_bytes_per_block() == 2 * 2 * 2 * 16 * 16 * 4
    assert runner.tokenizer_json is None and runner.decode_profile["max_num_seqs"] == 32


def test_feeds_flatten_chunks_into_one_batch_of_tokens(runner):
    chunks = [SeqChunk(7, [5, 6, 7], 15, [3, 1], True), SeqChunk(9, [8], 4, [2], False), SeqChunk(4, [9, 10], 0, [0], True)]
    feeds, logits_indices = runner.feeds(chunks)
    assert feeds["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10]]
    assert feeds["position_ids"].tolist() == [[15, 16, 17, 4, 0, 1]]
    assert feeds["infc.slot_mapping"].tolist() == [3 * 16 + 15, 1 * 16 + 0, 1 * 16 + 1, 2 * 16 + 4, 0, 1]
    assert feeds["infc.block_tables"].tolist() == [[3, 1], [2, 0], [0, 0]]
    assert feeds["infc.query_start_loc"].tolist() == [0, 3, 4, 6]
    assert feeds["infc.context_lens"].tolist() == [18, 5, 2]
    assert logits_indices.tolist() == [2, 5] and feeds["infc.logits_indices"].tolist() == [2, 5]
    assert feeds["infc.kv.1.value"].shape == (8, 2, 16, 16)


def test_step_returns_rows_only_for_chunks_that_need_logits(runner):
    logits = runner.step([SeqChunk(0, [1, 2, 3], 0, [0], False), SeqChunk(1, [4, 5], 0, [1], True)])
    assert logits.shape == (1, 128) and logits.dtype == np.float32
    assert runner.step([]).shape == (0, 128)
    again = runner.step([SeqChunk(1, [4, 5], 0, [1], True)])  # the same sequence alone: the same row
    assert np.array_equal(again, logits)


@pytest.mark.parametrize("chunk, message", [
    (SeqChunk(0, [1, 200], 0, [0], True), "token id outside the vocabulary"),
    (SeqChunk(0, [1, 2], 15, [0], True), "block table covers 16 positions, needs 17"),
    (SeqChunk(0, [1], 512, list(range(8)) * 5, True), "past max_model_len 512"),
])
def test_bad_chunks_are_refused(runner, chunk, message):
    with pytest.raises(BadInput, match=message):
        runner.step([chunk])


def test_step_before_allocate_and_non_decoder_plans_are_refused(runner, tmp_path):
    fresh = type(runner)(runner.executor, {**_decoder_meta(runner)}, [{"name": "input_ids", "dtype": "int64"}])
    with pytest.raises(BadInput, match="before allocate_kv"):
        fresh.step([SeqChunk(0, [1], 0, [0], True)])
    path = tmp_path / "one_shot.plan"
    write_plan(path, {"kind": "one_shot", "target": cpu_fingerprint(), "program": [], "weights": {}, "inputs": [], "outputs": []}, {})
    with pytest.raises(BadInput, match="not a decoder plan"):
        load_model_runner(path)


def _decoder_meta(runner) -> dict:
    s = runner.spec
    return {"num_layers": s.num_layers, "num_heads": s.num_heads, "num_kv_heads": s.num_kv_heads, "head_dim": s.head_dim,
            "vocab_size": s.vocab_size, "max_model_len": s.max_model_len, "block_size": s.block_size,
            "logits": runner.logits_name, "gathers_logits": runner.gathers_logits}


def test_warm_up_leaves_the_pool_zeroed_and_changes_no_result(runner):
    chunks = [SeqChunk(0, [3, 1, 4, 1, 5], 0, [2], True)]
    before = runner.step(chunks)
    runner.warm_up()
    assert all(not pool[:2].any() for pool in runner._pools.values())  # the blocks it used are zeroed again
    assert np.array_equal(runner.step(chunks), before)
    # every GEMM weight shape was probed, and `infc run --json` says how each one runs
    report = gemm_invariance_report()
    gemm_shapes = {f"{w.shape[0]}x{w.shape[1]}" for step in runner.executor._steps if step.key == ("infc", "BatchInvariant")
                   for w in [runner.executor._weights.get(step.inputs[1])] if w is not None and w.ndim == 2}
    assert gemm_shapes and gemm_shapes <= set(report)
    assert all(report[shape].startswith(("float32, from", "float32 in infc's own order", "float64")) for shape in gemm_shapes)
