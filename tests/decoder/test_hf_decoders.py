"""Decoder plans of real Hugging Face model classes, exported as users export them (tests/models/hf/,
made by tests/models/make_hf_fixtures.py): greedy tokens match onnxruntime running the original export
with its past-KV loop; masks paged attention cannot express (ALiBi) fail the build.

    qwen2_optimum   Optimum text-generation-with-past: SDPA with sqrt-scaled q and k, NaN guard
                       after Softmax, grouped KV heads, q/k/v biases
    phi3_dynamo     torch.onnx.export(dynamo=True): fused qkv_proj / gate_up_proj, partial rotary,
                       K transposed through 3-D Reshapes, dims read from other inputs' shapes
    gpt2_ts         TorchScript exporter of GPT2LMHeadModel: Conv1D projections, learned positions
    gemma2_ts       eager attention soft-capped inside (c * tanh(s / c), paged with a softcap at opset
                       17), final logit soft-cap, sliding-window layers (window > max_model_len)
    falcon_dynamo   multi-query: one K/V head broadcast by the MatMuls (no repeat_kv), fused QKV,
                       attention and MLP in parallel
    qwen3_dynamo    RMSNorm on each head's q and k before rotary
    gpt_neox_ts     Pythia: fused QKV laid out per head, rotary on a quarter of each head, parallel residual
    gptj_ts         interleaved partial rotary (left unfused: the graph's own ops)
    opt_ts          learned positions read at position_ids + 2, embeddings projected 64 <-> 32
    granite_dynamo  embedding, attention, residual and logit multipliers
    phi3_longrope_dynamo  longrope: rotary frequencies picked by the step's largest position (long
                       past 64): built exactly up to max_model_len 64, refused past it
    mistral_window_ts     a sliding window of 24 keys, paged with it
    qwen2_dynamo_fp16     model.half() before export: served as its float32 counterpart
    bloom_ts        ALiBi (slope * key position) added to (B*N)-row scores by baddbmm, views back to 4-D
    mpt_ts          ALiBi sliced from a max_seq_len table, then masked_fill; no position_ids input
    mixtral_ts      mixture of experts (top-2 of 4, transformers 4.46); rotary tables sliced to the
                       past + new length, then read at position_ids
    llama_ts_nocache  exported without a KV cache (logits of the whole sequence): paged all the same,
                       against onnxruntime on the whole sequence every step
    gpt_oss_window_ts  gpt-oss (transformers 5.24): attention sinks (Concat of a logit per head, peak
                       shift, Softmax, the sink column sliced off), a 24-key window on every other
                       layer, top-2 of 4 experts through batched MMs
    gemma4_ts          Gemma 4: heads 64 wide in full-attention layers, 16 in sliding ones; per-layer inputs
and refusals that name their reason.
"""

import numpy as np
import onnx
import pytest

from infc.compiler.decoder.float32_export import as_float32
from infc.compiler.decoder.mask_check import _window_of, alibi_slopes, probes
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.plan_report import plan_report
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import PROFILES, assert_greedy_matches_ort, build_plan, ort_greedy, prompts, runner_greedy

HF = FIXTURES / "hf"
HF_DECODERS = ("qwen2_optimum", "phi3_dynamo", "gpt2_ts", "gemma2_ts", "falcon_dynamo", "qwen3_dynamo", "gpt_neox_ts",
               "gptj_ts", "opt_ts", "granite_dynamo", "mixtral_ts", "llama_ts_nocache", "gpt_oss_window_ts")
NUM_REQUESTS, NUM_TOKENS = 4, 32


def _profile(folder, max_model_len: int, position_ids: bool = True):
    """llama_decode.yaml within `max_model_len` positions (without position_ids: for models that have
    no such input, as ALiBi's)."""
    path = folder / f"decode_{max_model_len}{'' if position_ids else '_no_positions'}.yaml"
    text = (PROFILES / "llama_decode.yaml").read_text()
    text = text if position_ids else "\n".join(line for line in text.splitlines() if "position_ids" not in line)
    path.write_text(text.replace("max_model_len: 512", f"max_model_len: {max_model_len}")
                    .replace("max: 256", f"max: {max_model_len}")
                    .replace("max_num_batched_tokens: 256", f"max_num_batched_tokens: {max_model_len}"))
    return path


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """Within the fixtures' 128 positions."""
    return _profile(tmp_path_factory.mktemp("hf_profile"), 128)


@pytest.mark.parametrize("name", HF_DECODERS)
def test_greedy_tokens_match_onnxruntime(name, profile, tmp_path):
    runner = load_model_runner(build_plan(HF / f"{name}.onnx", profile, tmp_path))
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=128)
    assert_greedy_matches_ort(HF / f"{name}.onnx", requests, tokens, logits, NUM_TOKENS)


def test_soft_capped_attention_is_paged_with_its_cap(profile, tmp_path):
    plan = read_plan(build_plan(HF / "gemma2_ts.onnx", profile, tmp_path))
    program = plan.meta["program"]
    assert [s["attrs"].get("softcap") for s in program if s["op"] == "PagedAttention"] == [3.0, 3.0]
    chained = [o["op"] for s in program if s["op"] == "ElementwiseChain" for o in s["attrs"]["ops"]]
    assert "Tanh" in [s["op"] for s in program] + chained  # the final logit cap stays the graph's own


def test_rope_picked_by_the_longest_position_builds_only_where_it_cannot_change(profile, tmp_path):
    with pytest.raises(BadInput, match=r"largest position of a step .* at position 64 .*max_model_len must be at most 64"):
        build_plan(HF / "phi3_longrope_dynamo.onnx", profile, tmp_path)
    plan = build_plan(HF / "phi3_longrope_dynamo.onnx", _profile(tmp_path, 64), tmp_path)
    assert "ReduceMax" not in [s["op"] for s in read_plan(plan).meta["program"]]  # folded: short factors throughout
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1, max_len=30)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=64)
    assert_greedy_matches_ort(HF / "phi3_longrope_dynamo.onnx", requests, tokens, logits, NUM_TOKENS)


def test_a_float16_export_is_served_as_its_float32_counterpart(profile, tmp_path):
    """model.half() before export: the plan computes the float32 model (weights widened exactly, the
    masks' float16 minimum read as float32's): its tokens and logits match onnxruntime on that model
    within 1e-4, and onnxruntime on the float16 export itself greedily but for near-ties."""
    source = HF / "qwen2_dynamo_fp16.onnx"
    plan = build_plan(source, profile, tmp_path)
    assert read_plan(plan).meta["decoder"]["export_dtype"] == "float16"
    widened = tmp_path / "qwen2_dynamo_fp32.onnx"
    onnx.save(as_float32(onnx.load(source)), widened)
    assert not any(t.data_type == onnx.TensorProto.FLOAT16 for t in onnx.load(widened).graph.initializer)
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, budget=128)
    assert all(step.dtype == np.float32 for request in logits for step in request)
    assert_greedy_matches_ort(widened, requests, tokens, logits, NUM_TOKENS)
    agree = 0
    for prompt, ours in zip(requests, tokens):
        ref, _ = ort_greedy(source, prompt, NUM_TOKENS)
        agree += next((i for i, (a, b) in enumerate(zip(ref, ours)) if a != b), NUM_TOKENS)
    assert agree >= 0.9 * NUM_REQUESTS * NUM_TOKENS, f"{agree} greedy tokens agree with the float16 export"


def test_attention_sinks_are_paged_with_their_logits(profile, tmp_path):
    """gpt-oss's sinks fuse into the paged attention (attention_sinks.py) with the model's own values,
    beside the sliding window, and hold through chunked prefills past the window."""
    source = HF / "gpt_oss_window_ts.onnx"
    plan = build_plan(source, profile, tmp_path)
    paged = [s["attrs"] for s in read_plan(plan).meta["program"] if s["op"] == "PagedAttention"]
    sinks = [init for init in onnx.load(source).graph.initializer if list(init.dims) == [1, 4, 1, 1]]  # reshaped per head
    assert len(paged) == 2 and all(len(a["sinks"]) == 4 for a in paged)
    assert [a.get("window") for a in paged] == [24, None]  # gpt-oss: sliding layers first
    assert any(np.allclose(onnx.numpy_helper.to_array(t).reshape(-1), paged[0]["sinks"]) for t in sinks)
    assert plan_report(plan)["decoder"]["attention"] == {"sliding_windows": [24], "sink_layers": 2}  # infc inspect
    # its experts (batched MMs of gathered weights) run one GEMM per expert (lower_experts.py), said by inspect
    report = plan_report(plan)["decoder"]
    assert report["expert_gemm_steps"] == 4 and report["architecture"]["mlp"].startswith("mixture of experts")
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1, max_len=90)  # past the window
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, chunk_sizes=[17, 40, 9, 64], budget=96)
    assert_greedy_matches_ort(source, requests, tokens, logits, NUM_TOKENS)


def test_layers_of_other_head_sizes_share_pools_of_the_widest(profile, tmp_path):
    """Gemma 4 (transformers 5.24): full-attention layers' heads are wider (here 64) than the sliding
    layers' (16). It was refused ("layers differ in head counts or sizes"); now every pool holds 64-wide
    heads, the narrower layers' queries, keys and values padded with zeros and their context sliced back."""
    source = HF / "gemma4_ts.onnx"
    plan = build_plan(source, profile, tmp_path)
    assert read_plan(plan).meta["decoder"]["head_dim"] == 64
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1, max_len=60)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, chunk_sizes=[17, 40, 9, 64], budget=96)
    assert_greedy_matches_ort(source, requests, tokens, logits, NUM_TOKENS)


# transformers' ALiBi slopes for 4 heads: 2 ** (-8 / 4 * (h + 1))
ALIBI_SLOPES_4_HEADS = [0.25, 0.0625, 0.015625, 0.00390625]


@pytest.mark.parametrize("name", ["bloom_ts", "mpt_ts"])
def test_alibi_is_paged_with_the_models_slopes(name, tmp_path):
    """Bloom adds slope * key position on (B*N)-row scores (baddbmm), MPT slope * (key - T + 1) sliced
    from its max_seq_len table, then masked_fill: both page as slope * (key - query position), chunked
    prefills included, and match onnxruntime's past-KV loop."""
    # neither takes position_ids: a profile may list it (what the runner feeds per step) or not
    plan = build_plan(HF / f"{name}.onnx", _profile(tmp_path, 128, position_ids=name == "mpt_ts"), tmp_path)
    meta = read_plan(plan).meta
    assert meta["decoder"]["position_bias"] == "alibi"
    paged = [s["attrs"] for s in meta["program"] if s["op"] == "PagedAttention"]
    assert len(paged) == 2 and all(np.allclose(a["alibi_slopes"], ALIBI_SLOPES_4_HEADS, rtol=1e-6) for a in paged)
    assert plan_report(plan)["decoder"]["attention"] == {"alibi_slopes": paged[0]["alibi_slopes"]}  # infc inspect
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1, max_len=90)
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, chunk_sizes=[17, 40, 9, 64], budget=128)
    assert_greedy_matches_ort(HF / f"{name}.onnx", requests, tokens, logits, NUM_TOKENS)


def test_a_sliding_window_shorter_than_max_model_len_is_paged_with_it(profile, tmp_path):
    plan = build_plan(HF / "mistral_window_ts.onnx", profile, tmp_path)
    assert read_plan(plan).meta["decoder"]["sliding_windows"] == [24]
    assert plan_report(plan)["decoder"]["attention"] == {"sliding_windows": [24]}
    runner = load_model_runner(plan)
    requests = prompts(NUM_REQUESTS, runner.spec.vocab_size, seed=1, max_len=90)  # well past the window
    tokens, logits = runner_greedy(runner, requests, NUM_TOKENS, chunk_sizes=[17, 40, 9, 64], budget=96)
    assert_greedy_matches_ort(HF / "mistral_window_ts.onnx", requests, tokens, logits, NUM_TOKENS)


def _mask(allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]


def test_mask_check_reads_causal_masks_and_windows_and_refuses_the_rest():
    past, new = 3, 4
    keys, rows = np.arange(past + new)[None, :], past + np.arange(new)[:, None]
    allowed = keys <= rows
    causal = _mask(allowed)
    assert _window_of(causal, past, new) == (0, None)
    assert _window_of(np.where(allowed, 0.0, -np.inf)[None, None], past, new) == (0, None)
    assert _window_of(allowed[None, None], past, new) == (0, None)  # a boolean mask: True attends
    assert _window_of(_mask(allowed & (keys > rows - 3)), past, new) == (3, None)  # each row its last 3 keys
    assert _window_of((allowed & (keys > rows - 5))[None, None], past, new) == (5, None)
    first_row_cut = causal.copy()
    first_row_cut[..., 0, 0] = np.finfo(np.float32).min  # one row cut short, the next not: no window
    assert _window_of(first_row_cut, past, new) == (0, "hides or biases keys that causal attention sees")
    alibi = causal + np.where(allowed, -0.5 * np.arange(past + new), 0).astype(np.float32)
    assert _window_of(alibi, past, new) == (0, "hides or biases keys that causal attention sees")  # without its slopes
    assert _window_of(np.zeros((1, 1, new, past + new), np.float32), past, new) == (0, "lets a query see keys after it")
    assert _window_of(causal[..., :-1], past, new)[1].startswith("has shape")
    assert probes(128, 32) == [(0, 32), (123, 5), (127, 1)]
    assert probes(2048, 2048) == [(0, 64), (2043, 5), (2047, 1)]


def test_mask_check_reads_alibi_slopes_per_head_and_refuses_other_biases():
    past, new, heads = 3, 4, 2
    keys, rows = np.arange(past + new)[None, :], past + np.arange(new)[:, None]
    causal = _mask(keys <= rows)
    slopes = np.array([0.5, 0.125], np.float32)[None, :, None, None]
    bloom = causal + (slopes * keys).astype(np.float32)  # slope * key: a constant per row away from (key - row)
    found, rest = alibi_slopes(bloom, past, new, heads)
    np.testing.assert_allclose(found, [0.5, 0.125], rtol=1e-6)
    assert _window_of(rest, past, new) == (0, None)
    found, _ = alibi_slopes(causal + 0.75 * (keys - rows).astype(np.float32), past, new, 4)  # one slope for all heads
    np.testing.assert_allclose(found, [0.75] * 4)
    assert alibi_slopes(causal, past, new, heads)[0] is None  # a plain causal mask
    assert alibi_slopes(causal + np.float32(3.0), past, new, heads)[0] is None  # a constant: softmax ignores it
    assert _window_of(alibi_slopes(causal + np.float32(3.0), past, new, heads)[1], past, new) == (0, None)
    relative = causal + np.minimum(np.abs(keys - rows), 2).astype(np.float32)  # bucketed, T5-like: not linear
    found, rest = alibi_slopes(relative, past, new, heads)
    assert found is None and _window_of(rest, past, new)[1] == "hides or biases keys that causal attention sees"


def test_a_graph_computing_with_the_past_length_is_refused(tmp_path):
    """The paged graph runs as on an empty past: a value made from the past length (here added to the
    logits, as length-scaled rope would use it) would silently be that of past 0."""
    model = onnx.load(FIXTURES / "llama_ts.onnx")
    for node in model.graph.node:
        node.output[:] = ["raw_logits" if o == "logits" else o for o in node.output]
    model.graph.node.extend([
        onnx.helper.make_node("Shape", ["past_key_values.0.key"], ["past_len"], start=2, end=3),
        onnx.helper.make_node("Cast", ["past_len"], ["past_len_f"], to=onnx.TensorProto.FLOAT),
        onnx.helper.make_node("Mul", ["past_len_f", "tiny"], ["shift"]),
        onnx.helper.make_node("Add", ["raw_logits", "shift"], ["logits"])])
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1e-3], np.float32), "tiny"))
    onnx.save(model, tmp_path / "llama_past_length.onnx")
    with pytest.raises(BadInput, match=r"'.*' \(Cast\) computes with the past KV length \(with \d+ past"):
        build_plan(tmp_path / "llama_past_length.onnx", PROFILES / "llama_decode.yaml", tmp_path)


def test_positions_derived_from_the_steps_tokens_are_refused(tmp_path):
    """llama_ts_nocache with its position_ids made inside the graph, as arange over the tokens (an export
    without that input): a paged step holds other sequences and only the new tokens, so the build's
    smoke run (a token decoded after its cached prompt against the prompt prefilled whole) refuses it."""
    model = onnx.load(HF / "llama_ts_nocache.onnx")
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "position_ids"))
    h = onnx.helper
    model.graph.node.insert(0, h.make_node("Shape", ["input_ids"], ["num_tokens"], start=1, end=2))
    model.graph.node.insert(1, h.make_node("Squeeze", ["num_tokens"], ["num_tokens_scalar"]))
    model.graph.node.insert(2, h.make_node("Range", ["zero", "num_tokens_scalar", "one"], ["positions"]))
    model.graph.node.insert(3, h.make_node("Unsqueeze", ["positions", "axis0"], ["position_ids"]))
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(v, np.int64), n)
                                    for n, v in (("zero", 0), ("one", 1), ("axis0", [0]))])
    onnx.save(model, tmp_path / "llama_derived_positions.onnx")
    with pytest.raises(BadInput, match="derives token positions from the step's tokens"):
        build_plan(tmp_path / "llama_derived_positions.onnx", _profile(tmp_path, 128, position_ids=False), tmp_path)
