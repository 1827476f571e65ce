import numpy as np
import pytest

F32 = np.float32
I64 = np.int64
MS = "com.microsoft"
B, S, N, H = 2, 5, 3, 4


def _qkv(rng, s=S, t=S):
    return (rng.standard_normal((B, s, N * H)).astype(F32), rng.standard_normal((B, t, N * H)).astype(F32),
            rng.standard_normal((B, t, N * H)).astype(F32))


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_3d_with_bias(unidirectional, rng, single_node, ort_check):
    q, k, v = _qkv(rng)
    bias = rng.standard_normal(3 * N * H).astype(F32)
    model = single_node("MultiHeadAttention", {"q": q, "k": k, "v": v}, [("y", F32)],
                        {"num_heads": N, "unidirectional": unidirectional}, {"bias": bias}, domain=MS)
    ort_check(model, {"q": q, "k": k, "v": v})


def test_mha_masks_and_scale(rng, single_node, ort_check):
    q, k, v = _qkv(rng, t=7)
    padding = np.ones((B, 7), np.int32)
    padding[1, 4:] = 0
    attn_bias = rng.standard_normal((1, N, S, 7)).astype(F32)
    feeds = {"q": q, "k": k, "v": v, "m": padding, "ab": attn_bias}
    model = single_node("MultiHeadAttention", feeds, [("y", F32)], {"num_heads": N, "scale": 0.3}, domain=MS,
                        input_names=["q", "k", "v", "", "m", "ab"])
    ort_check(model, feeds)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("padding", [np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], np.int32), np.array([0, 3], np.int32)])
def test_mha_rows_whose_visible_keys_are_all_masked(padding, unidirectional, rng, single_node, ort_check):
    # onnxruntime adds the filler to masked scores and drops future keys: a left-padded query under a
    # causal mask (or an all-zero mask row) attends over its visible keys by their scores; infc set
    # them to the filler and attended uniformly over every key, future ones included
    q, k, v = _qkv(rng)
    feeds = {"q": q * 3, "k": k, "v": v, "m": padding}
    model = single_node("MultiHeadAttention", feeds, [("y", F32)], {"num_heads": N, "unidirectional": unidirectional},
                        domain=MS, input_names=["q", "k", "v", "", "m"])
    ort_check(model, feeds, rtol=1e-3)  # the filler's float32 rounding of score - 10000 (~5e-4 on these scores)


def test_mha_past_and_present(rng, single_node, ort_check):
    q, k, v = _qkv(rng, s=1, t=1)
    past_k, past_v = rng.standard_normal((B, N, 6, H)).astype(F32), rng.standard_normal((B, N, 6, H)).astype(F32)
    feeds = {"q": q, "k": k, "v": v, "pk": past_k, "pv": past_v}
    model = single_node("MultiHeadAttention", feeds, [("y", F32), ("k_out", F32), ("v_out", F32)], {"num_heads": N},
                        domain=MS, input_names=["q", "k", "v", "", "", "", "pk", "pv"])
    ort_check(model, feeds)


def test_mha_bnsh_key_value(rng, single_node, ort_check):
    q = rng.standard_normal((B, S, N * H)).astype(F32)
    k, v = rng.standard_normal((B, N, 6, H)).astype(F32), rng.standard_normal((B, N, 6, H)).astype(F32)
    ort_check(single_node("MultiHeadAttention", {"q": q, "k": k, "v": v}, [("y", F32)], {"num_heads": N}, domain=MS),
              {"q": q, "k": k, "v": v})


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("positions", ["ids", "offset"])
def test_contrib_rotary(interleaved, layout, positions, rng, single_node, ort_check):
    x = rng.standard_normal((B, S, N * H) if layout == "3d" else (B, N, S, H)).astype(F32)
    pos = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], I64) if positions == "ids" else np.array([2], I64)
    angles = np.arange(10)[:, None] * (1.0 / 10000 ** (np.arange(0, H, 2) / H))[None, :]
    inits = {"p": pos, "cos": np.cos(angles).astype(F32), "sin": np.sin(angles).astype(F32)}
    attrs = {"interleaved": interleaved, "num_heads": N} if layout == "3d" else {"interleaved": interleaved}
    ort_check(single_node("RotaryEmbedding", {"x": x}, [("y", F32)], attrs, inits, domain=MS), {"x": x})


@pytest.mark.parametrize("interleaved", [0, 1])
def test_onnx_rotary_partial(interleaved, rng, single_node, ort_check):
    x = rng.standard_normal((B, N, S, 8)).astype(F32)
    angles = np.arange(12)[:, None] * np.array([1.0, 0.1])[None, :]
    inits = {"cos": np.cos(angles).astype(F32), "sin": np.sin(angles).astype(F32),
             "p": np.tile(np.arange(S, dtype=I64), (B, 1)) + 2}
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": 4}
    ort_check(single_node("RotaryEmbedding", {"x": x}, [("y", F32)], attrs, inits, opset=23), {"x": x})


@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"scale": 0.2}, {"softcap": 2.0}])
def test_onnx_attention_4d(attrs, rng, single_node, ort_check):
    q = rng.standard_normal((B, N, S, H)).astype(F32)
    k, v = rng.standard_normal((B, N, 6, H)).astype(F32), rng.standard_normal((B, N, 6, H)).astype(F32)
    ort_check(single_node("Attention", {"q": q, "k": k, "v": v}, [("y", F32)], attrs, opset=23), {"q": q, "k": k, "v": v})


def test_onnx_attention_3d_gqa_mask_and_past(rng, single_node, ort_check):
    q = rng.standard_normal((B, S, 4 * H)).astype(F32)
    k, v = rng.standard_normal((B, S, 2 * H)).astype(F32), rng.standard_normal((B, S, 2 * H)).astype(F32)
    mask = rng.random((S, 3 + S)) < 0.8
    mask[:, 0] = True
    pk, pv = rng.standard_normal((B, 2, 3, H)).astype(F32), rng.standard_normal((B, 2, 3, H)).astype(F32)
    feeds = {"q": q, "k": k, "v": v, "m": mask, "pk": pk, "pv": pv}
    outs = [("y", F32), ("present_k", F32), ("present_v", F32)]
    model = single_node("Attention", feeds, outs, {"q_num_heads": 4, "kv_num_heads": 2}, opset=23)
    ort_check(model, feeds)


def test_mha_soft_cap_as_the_unpacked_group_query_attention_carries_it(rng):
    """`softcap` is not onnxruntime's MHA attribute (decoder/genai_export.py puts it there): the
    scores are capped, c * tanh(s / c), before the mask, as GroupQueryAttention and Gemma 2 do."""
    from infc.compiler.runtime.kernels.attention import multi_head_attention

    q, k, v = _qkv(rng, t=6)
    q *= 4.0  # scores past the cap
    bias = np.where(np.tril(np.ones((S, 6), bool), 1), 0.0, -np.inf).astype(F32)[None, None]
    (y,) = multi_head_attention([q, k, v, None, None, bias], {"num_heads": N, "softcap": 2.0}, None)[:1]
    qh, kh, vh = (x.reshape(B, -1, N, H).transpose(0, 2, 1, 3).astype(np.float64) for x in (q, k, v))
    scores = np.tanh(qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(H) / 2.0) * 2.0 + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True) @ vh).transpose(0, 2, 1, 3).reshape(B, S, N * H)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    (plain,) = multi_head_attention([q, k, v, None, None, bias], {"num_heads": N}, None)[:1]
    assert not np.allclose(plain, y, atol=1e-3)  # the cap changed the result
