"""An encoder-decoder's decoder (queries from the new tokens, keys from encoder states) given a
decode: section is refused as cross-attention, by name, and builds as a one-shot plan without it."""

import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.errors import BadInput
from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import make_model
from infc.compiler.verify import compare_outputs, ort_session

F32 = np.float32
HIDDEN, VOCAB = 16, 50


def _cross_attention_decoder(tmp_path, keys_reshaped_by_ids: bool = False):
    """input_ids -> Gather -> q; encoder_hidden_states -> k, v; MultiHeadAttention -> logits. With
    `keys_reshaped_by_ids`, k is reshaped to [batch of input_ids, -1, hidden], as dynamo exports
    compute shapes from whichever input has the dim: a shape, not data, of input_ids."""
    rng = np.random.default_rng(0)
    weights = {"embed": rng.standard_normal((VOCAB, HIDDEN)), **{w: rng.standard_normal((HIDDEN, HIDDEN)) * 0.3
                                                                   for w in ("wq", "wk", "wv")},
               "head": rng.standard_normal((HIDDEN, VOCAB))}
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"]),
             helper.make_node("MatMul", ["h", "wq"], ["q"]),
             helper.make_node("MatMul", ["encoder_hidden_states", "wk"], ["k_flat" if keys_reshaped_by_ids else "k"]),
             helper.make_node("MatMul", ["encoder_hidden_states", "wv"], ["v"]),
             helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["attended"], domain="com.microsoft", num_heads=2),
             helper.make_node("MatMul", ["attended", "head"], ["logits"])]
    if keys_reshaped_by_ids:
        nodes[3:3] = [helper.make_node("Shape", ["input_ids"], ["ids_shape"], end=1),
                      helper.make_node("Concat", ["ids_shape", "rest_of_shape"], ["k_shape"], axis=0),
                      helper.make_node("Reshape", ["k_flat", "k_shape"], ["k"])]
        weights["rest_of_shape"] = np.array([-1, HIDDEN], np.int64)
    model = make_model(nodes, [("input_ids", np.int64, ["batch", "seq"]),
                               ("encoder_hidden_states", F32, ["batch", "enc", HIDDEN])],
                       [("logits", F32, ["batch", "seq", VOCAB])],
                       {k: v if v.dtype == np.int64 else v.astype(F32) for k, v in weights.items()},
                       extra_opsets=[("com.microsoft", 1)])
    path = tmp_path / "cross.onnx"
    onnx.save(model, path)
    return path


SHAPES = ("inputs:\n  input_ids: {min: [1, 1], opt: [2, 3], max: [2, 8]}\n"
          "  encoder_hidden_states: {min: [1, 1, 16], opt: [2, 5, 16], max: [2, 8, 16]}\n")
DECODE = "decode:\n  max_num_seqs: 2\n  num_kv_blocks: 8\n  block_size: 16\n  max_model_len: 64\n"


@pytest.mark.parametrize("keys_reshaped_by_ids", [False, True])
def test_a_decode_section_on_cross_attention_is_refused_by_name(tmp_path, keys_reshaped_by_ids):
    model = _cross_attention_decoder(tmp_path, keys_reshaped_by_ids)
    (tmp_path / "decode.yaml").write_text(SHAPES + DECODE)
    with pytest.raises(BadInput, match="is cross-attention .*'encoder_hidden_states'.*build without a decode: section"):
        build(str(model), str(tmp_path / "decode.yaml"), str(tmp_path / "x.plan"),
              BuildOptions(use_cache=False, show_progress=False))


@pytest.mark.parametrize("keys_reshaped_by_ids", [False, True])
def test_without_a_decode_section_it_builds_one_shot_and_matches_onnxruntime(tmp_path, keys_reshaped_by_ids):
    model = _cross_attention_decoder(tmp_path, keys_reshaped_by_ids)
    (tmp_path / "shapes.yaml").write_text(SHAPES)
    build(str(model), str(tmp_path / "shapes.yaml"), str(tmp_path / "x.plan"), BuildOptions(use_cache=False, show_progress=False))
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(0, VOCAB, (2, 3)), "encoder_hidden_states": rng.standard_normal((2, 5, HIDDEN)).astype(F32)}
    session = PlanSession(tmp_path / "x.plan")
    actual = session.run(session.check_feeds(feeds, "test"))
    expected = ort_session(onnx.load(model)).run(["logits"], feeds)
    assert compare_outputs(["logits"], expected, [actual["logits"]])[0].max_rel_diff < 1e-5
