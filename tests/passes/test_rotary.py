import numpy as np
import onnx
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fuse import rotary
from infc.compiler.testing import FIXTURES, assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
B, N, S, H = 2, 4, 3, 8
HALF_REASON = "rotated input is not Concat(-x[..., H/2:], x[..., :H/2])"


def _rope_model(opset=17, is_split=True, pos_batch=B, is_commuted=False, scaling=None, swap_halves=False,
                second_freqs=False):
    """HF's LlamaRotaryEmbedding + apply_rotary_pos_emb as exported: cos/sin computed from position ids."""
    inits = {"inv_freq": (1.0 / 10000 ** (np.arange(0, H, 2) / H)).astype(F32),
             "split": np.array([0, 0, N, H]),
             "one": np.array([1]), "minus1": np.array([-1]), "half": np.array([H // 2]), "end": np.array([2**62]),
             "axis": np.array([3]), "step": np.array([1]), "zero": np.array([0]),
             "scaling": np.array(scaling or 1, F32)}
    nodes = [helper.make_node("Cast", ["pos"], ["pos_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["pos_f", "minus1"], ["pos_u"]),
             helper.make_node("Mul", ["pos_u", "inv_freq"], ["freqs"]),
             helper.make_node("Mul", ["freqs", "scaling"], ["freqs2"]),
             helper.make_node("Concat", ["freqs", "freqs2" if second_freqs else "freqs"], ["emb"], axis=-1),
             helper.make_node("Cos", ["emb"], ["cos_raw"]), helper.make_node("Sin", ["emb"], ["sin_raw"])]
    for name in ("cos", "sin"):
        if scaling:  # attention_scaling of the llama3 / yarn rope types
            nodes.append(helper.make_node("Mul", [f"{name}_raw", "scaling"], [f"{name}_scaled"]))
        nodes.append(helper.make_node("Unsqueeze", [f"{name}_scaled" if scaling else f"{name}_raw", "one"], [name]))
    inputs = [("pos", np.int64, [pos_batch, S])]
    if is_split:  # q_proj(h).view(B, S, N, H).transpose(1, 2)
        inputs.append(("x3", F32, [B, S, N * H]))
        nodes += [helper.make_node("Reshape", ["x3", "split"], ["x_bsnh"]),
                  helper.make_node("Transpose", ["x_bsnh"], ["x"], perm=[0, 2, 1, 3])]
    else:
        inputs.append(("x", F32, [B, N, S, H]))
    upper, lower = (["zero", "half"], ["half", "end"]) if swap_halves else (["half", "end"], ["zero", "half"])
    nodes += [helper.make_node("Slice", ["x", *upper, "axis", "step"], ["x2"]),
              helper.make_node("Slice", ["x", *lower, "minus1"], ["x1"]),
              helper.make_node("Neg", ["x2"], ["neg_x2"]),
              helper.make_node("Concat", ["neg_x2", "x1"], ["rot"], axis=-1),
              helper.make_node("Mul", ["cos", "x"] if is_commuted else ["x", "cos"], ["x_cos"]),
              helper.make_node("Mul", ["rot", "sin"], ["rot_sin"]),
              helper.make_node("Add", ["rot_sin", "x_cos"] if is_commuted else ["x_cos", "rot_sin"], ["y"])]
    return make_model(nodes, inputs, [("y", F32, [B, N, S, H])], inits, opset=opset)


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {name: rng.standard_normal(shape).astype(F32) for name, shape in shapes.items() if name != "pos"}
    feeds["pos"] = rng.integers(0, 50, shapes["pos"])  # arbitrary positions, as with left padding
    return feeds


def _fused(model, domain):
    result = run_rules(model, rotary.RULES)
    assert rule_stats(result, "rotary_embedding") == (1, {})
    fused = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(fused) == 1 and fused[0].domain == domain and "Neg" not in ops_of(result.model)
    assert_matches_ort(model, result.model, feeds=_feeds(model))
    return result.model


@pytest.mark.parametrize("opset, domain", [(17, "com.microsoft"), (23, "")])
@pytest.mark.parametrize("is_split", [True, False])
def test_rope_fuses_with_per_token_caches(opset, domain, is_split):
    fused = _fused(_rope_model(opset, is_split), domain)
    assert "Expand" not in ops_of(fused)  # the tables already cover every (batch, token)
    # split heads: the op runs on the (B, S, N*H) projection, heads are split after it
    assert ops_of(fused).count("Transpose") == (1 if is_split else 0)


@pytest.mark.parametrize("opset, domain", [(17, "com.microsoft"), (23, "")])
def test_tables_broadcast_over_batch(opset, domain):
    fused = _fused(_rope_model(opset, pos_batch=1), domain)
    assert "Expand" in ops_of(fused)


def test_commuted_and_scaled_tables():
    _fused(_rope_model(is_commuted=True, scaling=0.7), "com.microsoft")


def test_swapped_halves_are_rejected():
    result = run_rules(_rope_model(swap_halves=True), rotary.RULES)
    assert rule_stats(result, "rotary_embedding") == (0, {HALF_REASON: 1})


def test_table_with_unequal_halves_is_rejected():
    result = run_rules(_rope_model(second_freqs=True, scaling=1.5), rotary.RULES)
    reason = "cos/sin is not a (B, 1, S, H) table with two equal halves"
    assert rule_stats(result, "rotary_embedding") == (0, {reason: 1})


@pytest.mark.parametrize("name", ["llama_ts", "llama_dynamo"])
def test_llama_fixtures_share_one_cos_sin_computation(name):
    optimized = optimize_model(onnx.load(FIXTURES / f"{name}.onnx")).model
    ops = ops_of(optimized)
    assert ops.count("RotaryEmbedding") == 4 and ops.count("Cos") == 1 and ops.count("Sin") == 1
    caches = {tuple(n.input[2:]) for n in optimized.graph.node if n.op_type == "RotaryEmbedding"}
    assert len(caches) == 1  # (position ids may be expanded per input when the tables broadcast)
