import numpy as np
import pytest

F32 = np.float32


@pytest.mark.parametrize("attrs", [{}, {"onesided": 1}, {"inverse": 1}])
def test_dft(attrs, rng, single_node, ort_check):
    x = rng.standard_normal((2, 8, 1 if not attrs.get("inverse") else 2)).astype(F32)
    ort_check(single_node("DFT", {"x": x}, [("y", F32)], attrs, {"a": np.array(1, np.int64)}, opset=20,
                          input_names=["x", "", "a"]), {"x": x}, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 32, 1), (2, 32)])  # [batch, length] without the trailing axis: torch.stft's export
def test_stft(shape, rng, single_node, ort_check):
    x = rng.standard_normal(shape).astype(F32)
    inits = {"step": np.array(4, np.int64), "w": np.hanning(8).astype(F32)}
    ort_check(single_node("STFT", {"x": x}, [("y", F32)], {"onesided": 1}, inits, opset=17), {"x": x})


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic, single_node, ort_check):
    size = np.array(10, np.int64)
    ort_check(single_node(op, {"n": size}, [("y", F32)], {"periodic": periodic}, opset=17), {"n": size})


@pytest.mark.parametrize("shape,step,frame,onesided", [
    ((3, 203), 7, 16, 1), ((3, 203), 7, 16, 0), ((2, 64, 1), 16, 15, 1), ((2, 64, 1), 16, 15, 0),
    ((1, 40, 2), 5, 8, 0),  # complex: a one-sided spectrum is not defined for it
])
def test_stft_real_and_complex_signals_against_float64(shape, step, frame, onesided, rng, single_node, ort_check):
    """Real signals take strided frames and an rfft (kernels/signal.py); odd frames and steps that do
    not divide the length; a complex [batch, length, 2] signal keeps the full transform."""
    x = rng.standard_normal(shape).astype(F32)
    window = np.hanning(frame).astype(F32)
    inits = {"step": np.array(step, np.int64), "w": window}
    model = single_node("STFT", {"x": x}, [("y", F32)], {"onesided": onesided}, inits, opset=17)
    got = ort_check(model, {"x": x}, rtol=1e-5)["y"]
    signal = x if x.ndim == 2 else (x[..., 0] if shape[-1] == 1 else x[..., 0] + 1j * x[..., 1])
    num_frames = 1 + (signal.shape[1] - frame) // step
    pieces = np.stack([signal[:, i * step:i * step + frame] for i in range(num_frames)], 1) * window.astype(np.float64)
    want = np.fft.fft(pieces.astype(np.complex128), axis=-1)[..., :frame // 2 + 1 if onesided else frame]
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_stft_frame_length_without_window(rng, single_node, ort_check):
    x = rng.standard_normal((2, 50)).astype(F32)
    inits = {"step": np.array(6, np.int64), "length": np.array(10, np.int64)}
    ort_check(single_node("STFT", {"x": x}, [("y", F32)], {"onesided": 1}, inits, opset=17,
                          input_names=["x", "step", "", "length"]), {"x": x}, rtol=1e-5)
