import numpy as np
import onnx
import onnx.version_converter
import pytest
from onnx import helper

from infc.compiler.optimize import optimize_model
from infc.compiler.passes.fuse import attention
from infc.compiler.testing import FIXTURES, assert_matches_ort, make_model, ops_of, rule_stats, run_rules

F32 = np.float32
B, N, S, T, H = 2, 4, 3, 5, 8
MIN = float(np.finfo(F32).min)


def _attention_model(opset=17, scale="div", mask="add", q_form="split", k_form="bnsh", fill=MIN, merge=(0, 0, N * H),
                     softmax_axis=-1, ctx_perm=(0, 2, 1, 3), dims=(B, S, T), kv_heads=N, softcap=None):
    """An exported-style attention block; `dims` may be symbolic names. `kv_heads` 1: one K/V head
    that the MatMuls broadcast (multi-query without repeat_kv); `softcap` c: c * tanh(scores / c)
    after the scale, as Gemma 2."""
    b, s, t = dims
    nodes, inits = [], {"merge_shape": np.array(merge, np.int64), "split_shape": np.array([0, 0, N, H], np.int64)}
    inputs = [("v", F32, [b, kv_heads, t, H])]
    if q_form == "split":  # Reshape(q3, (B, S, N, H)) -> Transpose, as HF's transpose_for_scores
        inputs.append(("q3", F32, [b, s, N * H]))
        nodes += [helper.make_node("Reshape", ["q3", "split_shape"], ["q_bsnh"]),
                  helper.make_node("Transpose", ["q_bsnh"], ["q"], perm=[0, 2, 1, 3])]
    else:
        inputs.append(("q", F32, [b, N, s, H]))
    if k_form == "bnsh":  # present key (B, N, T, H), transposed for the product
        inputs.append(("k", F32, [b, kv_heads, t, H]))
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    else:  # (B, T, N, H) straight to (B, N, H, T), as the TorchScript BERT export does
        inputs.append(("k", F32, [b, t, kv_heads, H]))
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]))
    nodes.append(helper.make_node("MatMul", ["q", "kt"], ["scores"]))
    last = "scores"
    if scale:
        inits["scale"] = np.array(np.sqrt(H) if scale == "div" else 1 / np.sqrt(H), F32)
        nodes.append(helper.make_node("Div" if scale == "div" else "Mul", [last, "scale"], ["scaled"]))
        last = "scaled"
    if softcap:
        inits["cap"] = np.array(softcap, F32)
        nodes += [helper.make_node("Div", [last, "cap"], ["cap_in"]), helper.make_node("Tanh", ["cap_in"], ["tanh"]),
                  helper.make_node("Mul", ["tanh", "cap"], ["capped"])]
        last = "capped"
    if "where" in mask:
        inputs.append(("cond", np.bool_, [1, 1, s, t]))
        inits["fill"] = np.array(fill, F32)
        nodes.append(helper.make_node("Where", ["cond", last, "fill"], ["filled"]))
        last = "filled"
    if "add" in mask:
        inputs.append(("mask", F32, [b, 1, 1, t]))
        nodes.append(helper.make_node("Add", ["mask", last], ["masked"]))  # mask first: commuted
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["probs"], axis=softmax_axis),
              helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_bsnh"], perm=list(ctx_perm)),
              helper.make_node("Reshape", ["ctx_bsnh", "merge_shape"], ["y"])]
    return make_model(nodes, inputs, [("y", F32, [b, s, N * H])], inits, opset=opset)


def _feeds(model, seed=0, b=B, s=S, t=T):
    rng = np.random.default_rng(seed)
    names = {i.name for i in model.graph.input}
    k_dims = next(i for i in model.graph.input if i.name == "k").type.tensor_type.shape.dim
    kv_heads = next(i for i in model.graph.input if i.name == "v").type.tensor_type.shape.dim[1].dim_value
    shapes = {"q3": (b, s, N * H), "q": (b, N, s, H), "v": (b, kv_heads, t, H), "cond": (1, 1, s, t), "mask": (b, 1, 1, t)}
    feeds = {n: rng.standard_normal(shape).astype(F32) for n, shape in shapes.items() if n in names}
    is_bnsh = k_dims[1].dim_value == kv_heads
    feeds["k"] = rng.standard_normal((b, kv_heads, t, H) if is_bnsh else (b, t, kv_heads, H)).astype(F32)
    if "cond" in names:  # causal, with the first query row fully masked
        feeds["cond"] = np.tril(np.ones((s, t), bool), t - s)[None, None] & (np.arange(s) > 0)[None, None, :, None]
    if "mask" in names:  # left padding; the last row fully masked
        pad = np.zeros((b, 1, 1, t), F32)
        pad[1, ..., :2], pad[-1, ..., :] = MIN, MIN
        feeds["mask"] = pad
    return feeds


def _fused(model, op_type="MultiHeadAttention", rule="attention_mha"):
    result = run_rules(model, attention.RULES)
    assert rule_stats(result, rule)[0] == 1, rule_stats(result, rule)
    assert op_type in ops_of(result.model) and "Softmax" not in ops_of(result.model)
    return result.model


@pytest.mark.parametrize("mask", ["add", "where", "where_add", "none"])
@pytest.mark.parametrize("scale", ["div", "mul", None])
def test_mha_masks_and_scales(mask, scale):
    model = _attention_model(scale=scale, mask=mask)
    fused = _fused(model)
    assert_matches_ort(model, fused, feeds=_feeds(model))


@pytest.mark.parametrize("mask", ["add", "where_add"])
def test_onnx_attention_at_opset_23(mask):
    model = _attention_model(opset=23, mask=mask, q_form="bnsh", k_form="bsnh")
    fused = _fused(model, "Attention", "attention_onnx")
    assert ops_of(fused).count("Transpose") == 2  # K back to (B,N,T,H) and the graph's own context one
    feeds = _feeds(model)  # rows masked by lowest() only (uniform in the graph), none by -inf alone:
    if "cond" in feeds:  # there the graph gives NaN and ORT's Attention zeros
        feeds["cond"][..., 0, 0] = True
    assert_matches_ort(model, fused, feeds=feeds)


def test_onnx_attention_keeps_rows_of_huge_mask_values():
    model = _attention_model(opset=23, mask="add", q_form="bnsh")
    feeds = _feeds(model)
    feeds["mask"][0, 0, 0] = [-9e29, -1.5e30, MIN, -np.inf, MIN]  # only the first key counts
    feeds["mask"][1, 0, 0] = [MIN, -np.inf, MIN, -np.inf, -np.inf]  # uniform over the two at lowest()
    assert_matches_ort(model, _fused(model, "Attention", "attention_onnx"), feeds=feeds)


def test_projection_split_is_read_back_and_output_reshape_replaced():
    fused = _fused(model := _attention_model(q_form="split", k_form="bnsh"))
    assert ops_of(fused).count("Reshape") == 0  # q3 feeds the op; its (B, S, N*H) output is y itself
    assert_matches_ort(model, fused, feeds=_feeds(model))


def test_q_without_split_and_bert_style_key():
    model = _attention_model(q_form="bnsh", k_form="bsnh")
    assert_matches_ort(model, _fused(model), feeds=_feeds(model))


def test_dynamic_dims_keep_graph_reshape_when_unproven():
    model = _attention_model(dims=("batch", "seq", "total"), merge=(-1, 3, N * H))
    fused = _fused(model)
    assert ops_of(fused)[-1] == "Reshape" and "Expand" in ops_of(fused)  # bias (B,1,1,T) expanded
    assert_matches_ort(model, fused, feeds=_feeds(model))


@pytest.mark.parametrize("merge", [(-1, N * H), (S, B, N * H), (0, 0, -1)])
def test_sequence_first_context_of_torch_multihead_attention(merge):
    """torch's multi_head_attention_forward transposes the context to (S, B, N, H) and merges it to
    (S*B, E) or (S, B, E): fused, with the context transposed back to the graph's layout."""
    model = _attention_model(ctx_perm=(2, 0, 1, 3), merge=merge, mask="where_add")
    fused = _fused(model)
    assert ops_of(fused)[-2:] == ["Transpose", "Reshape"]  # (B, S, N, H) -> (S, B, N, H), the graph's merge
    assert_matches_ort(model, fused, feeds=_feeds(model))


def test_fill_that_does_not_absorb_scores_is_rejected():
    result = run_rules(_attention_model(mask="where", fill=-10000.0), attention.RULES)
    assert rule_stats(result, "attention_mha") == (0, {"Where fill value is not -inf or <= -1e30": 1})


def test_other_layouts_are_rejected_with_reasons():
    result = run_rules(_attention_model(softmax_axis=2), attention.RULES)
    assert rule_stats(result, "attention_mha") == (0, {"Softmax is not over the last axis of 4-D scores": 1})
    result = run_rules(_attention_model(ctx_perm=(0, 2, 3, 1), merge=(0, 0, -1)), attention.RULES)  # (B, S, H, N)
    assert rule_stats(result, "attention_mha") == (0, {"context is not transposed to (B, S, N, H) or (S, B, N, H)": 1})
    assert rule_stats(result, "attention_onnx") == (0, {"ONNX Attention needs opset 23": 1})


def test_a_value_head_size_unlike_the_query_one_is_not_fused_into_multihead_attention():
    """LeViT: V's head is wider than Q/K's; MultiHeadAttention would get 4-D key and value of different
    shapes, which onnxruntime refuses, so the rule declines with the reason."""
    hv = 2 * H
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ctx_bsnh"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ctx_bsnh", "merge_shape"], ["y"])]
    model = make_model(nodes, [("q", F32, [B, N, S, H]), ("k", F32, [B, N, T, H]), ("v", F32, [B, N, T, hv])],
                       [("y", F32, [B, S, N * hv])],
                       {"scale": np.array(1 / np.sqrt(H), F32), "merge_shape": np.array([0, 0, N * hv], np.int64)})
    result = run_rules(model, attention.RULES)
    assert "Softmax" in ops_of(result.model) and "MultiHeadAttention" not in ops_of(result.model)
    reasons = rule_stats(result, "attention_mha")[1]
    assert any("value head size differs" in r for r in reasons), reasons


def test_one_broadcast_kv_head_is_expanded_for_multihead_attention():
    model = _attention_model(kv_heads=1, mask="where_add")  # Falcon-7B's multi-query, without repeat_kv
    fused = _fused(model)
    producers = {o: n.op_type for n in fused.graph.node for o in n.output}
    mha = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    assert [producers.get(name) for name in mha.input[1:3]] == ["Expand", "Expand"]  # K and V to N heads
    assert_matches_ort(model, fused, feeds=_feeds(model))


def test_one_broadcast_kv_head_goes_to_onnx_attention_as_is():
    model = _attention_model(opset=23, kv_heads=1, q_form="bnsh")
    fused = _fused(model, "Attention", "attention_onnx")
    attention_node = next(n for n in fused.graph.node if n.op_type == "Attention")
    assert list(attention_node.input[1:3]) == ["k", "v"]  # one K/V head, as the graph had it
    assert_matches_ort(model, fused, feeds=_feeds(model))


def test_one_kv_head_under_query_heads_of_unknown_count_is_rejected():
    model = _attention_model(kv_heads=1, q_form="bnsh", mask="none")
    q = next(i for i in model.graph.input if i.name == "q")
    q.type.tensor_type.shape.dim[1].dim_param = "heads"  # 1 head or N broadcast: not knowable
    result = run_rules(model, attention.RULES)
    assert rule_stats(result, "attention_mha") == (0, {"Q, K, V are not 4-D with known, equal head counts and sizes": 1})


@pytest.mark.parametrize("mask", ["add", "where_add"])
def test_softcap_at_opset_23_is_the_onnx_attention_softcap(mask):
    model = _attention_model(opset=23, mask=mask, q_form="bnsh", scale="mul", softcap=0.5)  # scores reach the cap
    fused = _fused(model, "Attention", "attention_onnx")
    assert [a.f for n in fused.graph.node for a in n.attribute if a.name == "softcap"] == [0.5]
    feeds = _feeds(model)
    if "cond" in feeds:  # no row masked by -inf alone (see test_onnx_attention_at_opset_23)
        feeds["cond"][..., 0, 0] = True
    assert_matches_ort(model, fused, feeds=feeds)


def test_softcap_below_opset_23_stays_unfused_but_for_paged_decoders():
    model = _attention_model(softcap=30.0, mask="where_add", q_form="bnsh")
    result = run_rules(model, attention.RULES)
    assert rule_stats(result, "attention_mha") == (0, {"MultiHeadAttention has no softcap (ONNX Attention, opset 23, has)": 1})
    # a decoder build pages the attention: the ONNX op stands in for it at any opset
    paged = run_rules(model, attention.PAGED_RULES).model
    assert ops_of(paged).count("Attention") == 1 and "Tanh" not in ops_of(paged)
    paged.opset_import[0].version = 23  # what the node means, checked in onnxruntime
    feeds = _feeds(model)
    feeds["cond"][..., 0, 0] = True
    assert_matches_ort(model, paged, feeds=feeds)


def test_softcap_with_two_different_constants_is_rejected():
    model = _attention_model(opset=23, q_form="bnsh", softcap=30.0)
    next(i for i in model.graph.initializer if i.name == "cap").CopyFrom(onnx.numpy_helper.from_array(np.array(3.0, F32), "cap"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(30.0, F32), "cap_out"))
    next(n for n in model.graph.node if n.output[0] == "capped").input[1] = "cap_out"
    result = run_rules(model, attention.RULES)
    assert rule_stats(result, "attention_onnx") == (0, {"soft-cap is not c * tanh(x / c) with one positive scalar c": 1})


def decoder_feeds(model, batch, seq, past, left_pad, seed=0):
    """input ids, a left-padded mask (rows >= 1), HF generate()'s position ids and random past K/V."""
    rng, inputs = np.random.default_rng(seed), {i.name: i for i in model.graph.input}
    kv_heads = inputs["past_key_values.0.key"].type.tensor_type.shape.dim[1].dim_value
    mask = np.ones((batch, past + seq), np.int64)
    mask[1:, :left_pad] = 0
    feeds = {"input_ids": rng.integers(0, 128, (batch, seq)), "attention_mask": mask,
             "position_ids": np.clip(mask.cumsum(-1) - 1, 0, None)[:, past:]}
    feeds |= {n: rng.standard_normal((batch, kv_heads, past, 16)).astype(F32) for n in inputs if n.startswith("past")}
    return feeds


@pytest.mark.parametrize("name", ["gpt2_ts", "gpt2_dynamo", "llama_ts", "llama_dynamo"])
def test_decoder_fixtures_fuse_every_layer_exactly(name):
    model = onnx.load(FIXTURES / f"{name}.onnx")
    optimized = optimize_model(model).model
    ops = ops_of(optimized)
    assert ops.count("MultiHeadAttention") == 2 and "Softmax" not in ops
    assert ops.count("RotaryEmbedding") == (4 if name.startswith("llama") else 0)
    for batch, seq, past, left_pad in [(2, 5, 0, 2), (2, 3, 5, 3), (2, 1, 7, 2), (2, 4, 0, 4)]:
        assert_matches_ort(model, optimized, feeds=decoder_feeds(model, batch, seq, past, left_pad), rtol=1e-4)


@pytest.mark.parametrize("name", ["bert_ts", "bert_dynamo"])
def test_encoder_fixtures_fuse_every_layer_exactly(name):
    model = onnx.load(FIXTURES / f"{name}.onnx")
    optimized = optimize_model(model).model
    assert ops_of(optimized).count("MultiHeadAttention") == 2 and "Softmax" not in ops_of(optimized)
    rng = np.random.default_rng(0)
    for mask in ([[1] * 7, [1] * 4 + [0] * 3], [[1] * 7, [0] * 3 + [1] * 4], [[0] * 7, [1] * 7], [[1]]):
        mask = np.array(mask, np.int64)
        feeds = {"input_ids": rng.integers(0, 128, mask.shape), "attention_mask": mask}
        assert_matches_ort(model, optimized, feeds=feeds, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2_ts", "llama_dynamo", "bert_ts"])
def test_fixtures_at_opset_23_take_onnx_attention_and_rotary(name):
    model = onnx.version_converter.convert_version(onnx.load(FIXTURES / f"{name}.onnx"), 23)
    optimized = optimize_model(model).model
    fused = [n for n in optimized.graph.node if n.op_type in ("Attention", "RotaryEmbedding")]
    assert all(n.domain in ("", "ai.onnx") for n in fused) and "Softmax" not in ops_of(optimized)
    assert len(fused) == (6 if name.startswith("llama") else 2)
    if name.startswith("bert"):
        mask = np.array([[1] * 4 + [0] * 3, [0] * 7])  # the second row fully masked: rows at lowest()
        feeds = [{"input_ids": np.random.default_rng(0).integers(0, 128, mask.shape), "attention_mask": mask}]
    else:
        feeds = [decoder_feeds(model, 2, 4, 0, 4), decoder_feeds(model, 2, 3, 5, 3)]
    for f in feeds:
        assert_matches_ort(model, optimized, feeds=f, rtol=1e-4)
