import numpy as np
import pytest

F32 = np.float32
I64 = np.int64


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis, rng, single_node, ort_check):
    x = rng.standard_normal((4, 5, 6)).astype(F32)
    idx = np.array([[0, -1], [2, 1]], I64)
    ort_check(single_node("Gather", {"x": x}, [("y", F32)], {"axis": axis}, {"i": idx}), {"x": x})


def test_gather_scalar_index(rng, single_node, ort_check):
    x = rng.standard_normal((4, 5)).astype(F32)
    ort_check(single_node("Gather", {"x": x}, [("y", F32)], {"axis": 1}, {"i": np.array(-2, I64)}), {"x": x})


def test_gather_elements(rng, single_node, ort_check):
    x = rng.standard_normal((3, 4)).astype(F32)
    idx = rng.integers(-4, 4, (3, 2)).astype(I64)
    ort_check(single_node("GatherElements", {"x": x}, [("y", F32)], {"axis": 1}, {"i": idx}), {"x": x})


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(batch_dims, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 4)).astype(F32)
    idx = np.array([[[1, 2]], [[0, -1]]], I64) if batch_dims else np.array([[1, 2], [0, -1]], I64)
    ort_check(single_node("GatherND", {"x": x}, [("y", F32)], {"batch_dims": batch_dims}, {"i": idx}), {"x": x})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction, rng, single_node, ort_check):
    x = rng.standard_normal((3, 4)).astype(F32)
    idx = np.array([[1, 0, 3], [0, 2, 1], [3, 3, 0]], I64)
    upd = rng.standard_normal((3, 3)).astype(F32)
    attrs = {"axis": 1} if reduction == "none" else {"axis": 1, "reduction": reduction}
    ort_check(single_node("ScatterElements", {"x": x, "u": upd}, [("y", F32)], attrs, {"i": idx}, opset=18,
                          input_names=["x", "i", "u"]), {"x": x, "u": upd})


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_nd(reduction, rng, single_node, ort_check):
    x = rng.standard_normal((4, 3)).astype(F32)
    idx = np.array([[1], [3]], I64) if reduction == "none" else np.array([[1], [1]], I64)
    upd = rng.standard_normal((2, 3)).astype(F32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    ort_check(single_node("ScatterND", {"x": x, "u": upd}, [("y", F32)], attrs, {"i": idx}, opset=18,
                          input_names=["x", "i", "u"]), {"x": x, "u": upd})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis, single_node, ort_check):
    idx = np.array([[0, 2], [-1, 5]], I64)
    inits = {"d": np.array(4, I64), "v": np.array([-1.0, 3.0], F32)}
    ort_check(single_node("OneHot", {"i": idx}, [("y", F32)], {"axis": axis}, inits, opset=11), {"i": idx})


def test_compress_nonzero(rng, single_node, ort_check):
    x = rng.standard_normal((3, 4)).astype(F32)
    cond = np.array([True, False, True])
    ort_check(single_node("Compress", {"x": x}, [("y", F32)], {"axis": 0}, {"c": cond}), {"x": x})
    ort_check(single_node("Compress", {"x": x}, [("y", F32)], initializers={"c": np.array([0, 1, 1], bool)}), {"x": x})
    z = np.array([[1, 0, 2], [0, 0, 3]], F32)
    ort_check(single_node("NonZero", {"z": z}, [("y", I64)]), {"z": z})


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}])
def test_unique(attrs, single_node, ort_check):
    x = np.array([[2, 1], [1, 3], [2, 1], [0, 0]], F32)
    outs = [("y", F32), ("first", I64), ("inverse", I64), ("counts", I64)]
    ort_check(single_node("Unique", {"x": x}, outs, attrs, opset=11), {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_top_k(largest, axis, rng, single_node, ort_check):
    x = rng.integers(0, 5, (4, 6)).astype(F32)  # ties: the lower index first
    model = single_node("TopK", {"x": x}, [("v", F32), ("i", I64)], {"axis": axis, "largest": largest},
                        {"k": np.array([3], I64)}, opset=11)
    ort_check(model, {"x": x})
