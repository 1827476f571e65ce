"""`--verify` inputs: models whose inputs must be long (a convolutional front end over raw samples)
still get random inputs they run on."""

from pathlib import Path

import numpy as np
import pytest
from infc.compiler.errors import BadInput
from infc.compiler.optimize import optimize_model
from infc.compiler.testing import make_model
from infc.compiler.verify import verify_models
from onnx import helper

F32 = np.float32
MODELS = Path(__file__).parent / "models"


def _audio_front_end(kernel: int):
    """[batch, samples] -> Conv1d(kernel, stride 5) -> Relu: needs at least `kernel` samples."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Unsqueeze", ["wave", "axis1"], ["wave3"]),
             helper.make_node("Conv", ["wave3", "w"], ["conv"], strides=[5]),
             helper.make_node("Relu", ["conv"], ["features"])]
    return make_model(nodes, [("wave", F32, ["batch", "samples"])], [("features", F32, ["batch", 4, "frames"])],
                      {"axis1": np.array([1], np.int64), "w": rng.standard_normal((4, 1, kernel)).astype(F32)})


def test_verify_tries_longer_dims_for_a_front_end():
    model = _audio_front_end(kernel=400)  # the default length (32) is too short
    diffs = verify_models(model, optimize_model(model).model)
    assert diffs[0].max_rel_diff < 1e-5


def test_verify_reports_the_first_failure_when_no_length_runs():
    model = _audio_front_end(kernel=10000)  # longer than any length tried
    with pytest.raises(BadInput, match="cannot run the original model"):
        verify_models(model, model)


def test_a_model_onnxruntime_refuses_is_bad_input():
    # torch's opset-11 export of T5's relative-position buckets: Min over int64, which opset 11's
    # Min does not take. infc runs it; --verify has no reference and must say so (exit 2), not crash.
    nodes = [helper.make_node("Min", ["positions", "limit"], ["clamped"])]
    model = make_model(nodes, [("positions", np.int64, [4])], [("clamped", np.int64, [4])],
                       {"limit": np.array([2], np.int64)}, opset=11)
    with pytest.raises(BadInput, match="onnxruntime cannot load the model"):
        verify_models(model, model)


def _one_token_decoder():
    """A decoder with past exported at one new token: [batch, new] ids reshaped to [batch, 1] and
    appended to [batch, past]; runs only where `new` is 1 though the dim is symbolic."""
    nodes = [helper.make_node("Reshape", ["new_tokens", "one_column"], ["column"]),
             helper.make_node("Concat", ["past", "column"], ["present"], axis=1)]
    return make_model(nodes, [("new_tokens", F32, ["s0", "s1"]), ("past", F32, ["s0", "s2"])],
                      [("present", F32, ["s0", "s3"])], {"one_column": np.array([0, 1], np.int64)})


def test_verify_tries_length_one_for_a_dim_traced_at_one():
    model = _one_token_decoder()
    diffs = verify_models(model, optimize_model(model).model)
    assert diffs[0].max_rel_diff == 0


def test_verify_keeps_several_free_lengths_short(monkeypatch):
    # two free lengths that no length tried runs (a's must be 3): every length tried sets both, and
    # attention would grow with their product, so none above 256 is tried
    import infc.compiler.verify as verify

    nodes = [helper.make_node("Reshape", ["a", "three_columns"], ["a3"]),
             helper.make_node("Add", ["a3", "b"], ["c"])]
    model = make_model(nodes, [("a", F32, ["s0", "s1"]), ("b", F32, ["s0", "s2"])], [("c", F32, ["s0", 3])],
                       {"three_columns": np.array([0, 3], np.int64)})
    tried = []
    real = verify.random_feeds

    def recording(model, seed=0, overrides=None):
        tried.append(max((overrides or {}).values(), default=0))
        return real(model, seed, overrides)

    monkeypatch.setattr(verify, "random_feeds", recording)
    with pytest.raises(BadInput, match="cannot run the original model"):
        verify_models(model, model)
    assert tried and max(tried) <= verify.MAX_LENGTH_OF_SEVERAL


def test_verify_tries_batch_one_for_a_state_exported_at_batch_one():
    # a recurrent model's state input exported at batch 1 next to a [batch_size, ...] input: the
    # default batch (2) and every length fail; batch 1 runs
    nodes = [helper.make_node("Reshape", ["frames", "flat"], ["row"]),
             helper.make_node("Add", ["row", "state"], ["next_state"])]
    model = make_model(nodes, [("frames", F32, ["batch_size", 4]), ("state", F32, [4])],
                       [("next_state", F32, [4])], {"flat": np.array([4], np.int64)})
    diffs = verify_models(model, optimize_model(model).model)
    assert diffs[0].max_rel_diff < 1e-6


def test_generated_inputs_give_an_unnamed_leading_dim_a_batch_size():
    # TF and dynamo exports name a batch 'N', 'unk__749' or 's0': a batch (2), not a length (32);
    # other unnamed dims, and the leading dim of a rank-1 input, stay at the default length
    from infc.compiler.feeds import DEFAULT_DIM, DIM_HINTS, random_feeds

    nodes = [helper.make_node("ReduceSum", ["wave"], ["total"], keepdims=0),
             helper.make_node("Add", ["total", "gains"], ["out"])]
    model = make_model(nodes, [("wave", F32, ["N", "samples"]), ("gains", F32, ["s1"])], [("out", F32, ["s1"])])
    feeds = random_feeds(model, 0)
    assert feeds["wave"].shape == (DIM_HINTS[0][1], DEFAULT_DIM)
    assert feeds["gains"].shape == (DEFAULT_DIM,)


def test_onnxruntime_dying_on_made_up_inputs_is_a_failed_attempt(monkeypatch):
    """onnxruntime dies with SIGFPE on WeSpeaker's front end fed fewer samples than one window: such
    inputs run first in a child (child_run.py), whose death is one more attempt to move past."""
    import os
    import signal

    from infc.compiler import verify

    real = verify.ort_session

    class DiesOnShortInput:  # onnxruntime's behavior on that front end, in a session we control
        def __init__(self, model, **kwargs):
            self.session = real(model, **kwargs)

        def run(self, names, feeds):
            if feeds["wave"].shape[1] < 400:
                os.kill(os.getpid(), signal.SIGFPE)
            return self.session.run(names, feeds)

    monkeypatch.setattr(verify, "ort_session", DiesOnShortInput)
    model = _audio_front_end(kernel=300)
    diffs = verify_models(model, optimize_model(model).model)  # the parent never ran the short inputs
    assert diffs[0].max_rel_diff < 1e-5
    with pytest.raises(BadInput, match="onnxruntime died of SIGFPE running the original model on generated inputs"):
        verify_models(model, model, dims={"samples": 100})


def test_a_reshape_the_generated_inputs_do_not_fit_names_the_shapes():
    """MusicGen's decoder reshapes [batch * codebooks, length] ids to [-1, 4, length]: no generated
    batch is a multiple of 4. The one-line error keeps onnxruntime's shapes, not its C++ source
    location (which used to fill the line and cut them off)."""
    nodes = [helper.make_node("Reshape", ["ids", "by_codebook"], ["grouped"])]
    model = make_model(nodes, [("ids", F32, ["batch_codebooks", 5])], [("grouped", F32, ["b", 7, 5])],
                       {"by_codebook": np.array([-1, 7, 5], np.int64)})
    with pytest.raises(BadInput, match=r"cannot run the original model") as info:
        verify_models(model, model)
    assert "/onnxruntime_src" not in str(info.value)
    assert "requested shape" in str(info.value)


def test_a_sum_of_dims_is_the_sum_of_the_dims_it_names():
    # Optimum's decoders take attention_mask [batch, 'past_sequence_length + sequence_length'],
    # listed before the past K/V: its length must be the past's plus the new tokens'
    from infc.compiler.feeds import random_feeds

    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name in ("input_ids", "attention_mask", "past")]
    model = make_model(nodes, [("input_ids", np.int64, ["batch", "sequence_length"]),
                               ("attention_mask", np.int64, ["batch", "past_sequence_length + sequence_length"]),
                               ("past", F32, ["batch", 2, "past_sequence_length", 8])],
                       [("input_ids_out", np.int64, ["b", "s"]), ("attention_mask_out", np.int64, ["b", "t"]),
                        ("past_out", F32, ["b", 2, "p", 8])])
    feeds = random_feeds(model, 0)
    assert feeds["attention_mask"].shape[1] == feeds["past"].shape[2] + feeds["input_ids"].shape[1]


@pytest.mark.parametrize("fixture", ["hf/qwen2_optimum.onnx", "genai/llama_fp32.onnx"])
def test_decoder_exports_verify_on_generated_inputs(fixture):
    # qwen2_optimum: the mask above; genai: the builder's symbolic KV head size ('kv_cache_dim'),
    # which GroupQueryAttention pins to its projections' head size (compiler/pinned_dims.py)
    import onnx

    model = onnx.load(str(MODELS / fixture))
    diffs = verify_models(model, optimize_model(model).model)
    assert diffs and max(d.max_rel_diff for d in diffs) < 1e-4
