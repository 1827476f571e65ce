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
