import numpy as np
import pytest

F32 = np.float32
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def _inputs(rng, kind, dirs, with_bias=True, with_states=False):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    inits = {"w": rng.standard_normal((dirs, gates * HIDDEN, INPUT)).astype(F32) * 0.5,
             "r": rng.standard_normal((dirs, gates * HIDDEN, HIDDEN)).astype(F32) * 0.5}
    names = ["x", "w", "r"]
    if with_bias:
        inits["b"] = rng.standard_normal((dirs, 2 * gates * HIDDEN)).astype(F32)
    names.append("b" if with_bias else "")
    if with_states:
        inits["lens"] = np.array([5, 2, 4], np.int32)
        inits["h0"] = rng.standard_normal((dirs, BATCH, HIDDEN)).astype(F32)
        names += ["lens", "h0"]
        if kind == "LSTM":
            inits["c0"] = rng.standard_normal((dirs, BATCH, HIDDEN)).astype(F32)
            inits["p"] = rng.standard_normal((dirs, 3 * HIDDEN)).astype(F32)
            names += ["c0", "p"]
    return inits, names


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("with_states", [False, True])
def test_recurrent_layers(kind, direction, with_states, rng, single_node, ort_check):
    dirs = 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(F32)
    inits, names = _inputs(rng, kind, dirs, with_states=with_states)
    outs = [("y", F32), ("y_h", F32)] + ([("y_c", F32)] if kind == "LSTM" else [])
    model = single_node(kind, {"x": x}, outs, {"hidden_size": HIDDEN, "direction": direction}, inits,
                        opset=14, input_names=names)
    ort_check(model, {"x": x})


def test_gru_linear_before_reset_and_clip(rng, single_node, ort_check):
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(F32) * 3
    inits, names = _inputs(rng, "GRU", 1)
    attrs = {"hidden_size": HIDDEN, "linear_before_reset": 1, "clip": 1.5}
    ort_check(single_node("GRU", {"x": x}, [("y", F32), ("y_h", F32)], attrs, inits, opset=14, input_names=names),
              {"x": x})


def test_lstm_batch_major_layout_equals_transposed(rng, single_node, ort_check, native):
    # onnxruntime has no layout=1 kernel: compare with its layout=0 result on the transposed input
    x = rng.standard_normal((BATCH, SEQ, INPUT)).astype(F32)
    inits, names = _inputs(rng, "LSTM", 1)
    outs = [("y", F32), ("y_h", F32), ("y_c", F32)]
    batch_major = single_node("LSTM", {"x": x}, outs, {"hidden_size": HIDDEN, "layout": 1}, inits, opset=14,
                              input_names=names)
    x_t = np.ascontiguousarray(x.transpose(1, 0, 2))
    reference = ort_check(single_node("LSTM", {"x": x_t}, outs, {"hidden_size": HIDDEN}, inits, opset=14, input_names=names),
                          {"x": x_t})
    got = native(batch_major, {"x": x})
    np.testing.assert_allclose(got["y"], reference["y"].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["y_h"], reference["y_h"].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


def test_lstm_in_onnxruntime_reading_one_state_tensor_twice(rng, single_node):
    # TorchScript exports feed one zeros tensor as both h0 and c0: the onnxruntime form of the step
    # must declare it once ("Duplicate definition-site" otherwise)
    import onnxruntime as ort
    from infc.compiler.runtime.vendor_op import vendor_runner
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(F32)
    state = rng.standard_normal((1, BATCH, HIDDEN)).astype(F32)
    inits, _ = _inputs(rng, "LSTM", 1)
    names = ["x", "w", "r", "b", "", "state", "state"]
    run = vendor_runner("LSTM", "", {"hidden_size": HIDDEN}, names, inits, threads=1,
                        output_names=["y", "y_h", "y_c"])
    got = run([x, inits["w"], inits["r"], inits["b"], None, state, state], {}, None)
    model = single_node("LSTM", {"x": x, "state": state}, [("y", F32), ("y_h", F32), ("y_c", F32)],
                        {"hidden_size": HIDDEN}, inits, opset=14, input_names=names)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "state": state})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
