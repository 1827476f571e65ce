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


def test_top_k_opset_1_takes_k_as_an_attribute(rng, single_node, ort_check):
    x = rng.standard_normal((4, 6)).astype(F32)
    model = single_node("TopK", {"x": x}, [("v", F32), ("i", I64)], {"axis": 1, "k": 2}, {}, opset=9)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [-1, 0])
def test_top_k_of_a_few_among_many_selects_then_sorts_like_onnxruntime(largest, axis, rng, single_node, ort_check):
    """k far below the axis takes the partition path (ties at the k-th value: the lowest indexes)."""
    shape = (1200, 3) if axis == 0 else (3, 1200)
    x = rng.integers(0, 40, shape).astype(F32)  # many ties, also at the k-th value
    model = single_node("TopK", {"x": x}, [("v", F32), ("i", I64)], {"axis": axis, "largest": largest},
                        {"k": np.array([7], I64)}, opset=11)
    ort_check(model, {"x": x})


def test_top_k_partition_path_equals_the_full_sort(rng, monkeypatch):
    from infc.compiler.runtime.kernels import gather_scatter
    from infc.compiler.runtime.kernels.common import KernelContext

    x = rng.integers(0, 9, (5, 1200)).astype(F32)
    x[1, :5] = np.nan  # NaNs sort last
    all_nan = x.copy()
    all_nan[2] = np.nan  # a row whose k-th key is NaN: the full sort judges
    assert gather_scatter._few_largest(-x, 10, 1) is not None and gather_scatter._few_largest(-all_nan, 10, 1) is None
    for data in (x, all_nan):
        for largest, k in ((1, 10), (0, 10), (1, 1)):
            args = [data, np.array([k], I64)], {"axis": -1, "largest": largest}, KernelContext(11)
            fast = gather_scatter.top_k(*args)
            monkeypatch.setattr(gather_scatter, "PARTIAL_SORT_RATIO", 10 ** 9)
            full = gather_scatter.top_k(*args)
            monkeypatch.undo()
            np.testing.assert_array_equal(fast[1], full[1])
            np.testing.assert_array_equal(fast[0], full[0])


def test_gather_nd_out_of_range_is_an_error_not_a_wrong_row(rng):
    from infc.compiler.runtime.kernels import gather_scatter
    from infc.compiler.runtime.kernels.common import KernelContext

    x = rng.standard_normal((2, 3, 4)).astype(F32)
    with pytest.raises(IndexError, match="outside"):
        gather_scatter.gather_nd([x, np.array([[0, 3]], I64)], {}, KernelContext(13))
    with pytest.raises(IndexError, match="outside"):
        gather_scatter.gather_nd([x, np.array([[1, -4]], I64)], {}, KernelContext(13))
    with pytest.raises(IndexError, match="out of bounds"):  # one index per row: NumPy's take says it
        gather_scatter.gather_nd([x, np.array([[2]], I64)], {}, KernelContext(13))


def test_gather_nd_of_whole_rows_with_negative_indexes(rng, single_node, ort_check):
    x = rng.standard_normal((5, 4)).astype(F32)
    idx = np.array([[3], [-1], [0], [-5]], I64)
    ort_check(single_node("GatherND", {"x": x}, [("y", F32)], {}, {"i": idx}), {"x": x})


def test_scatter_elements_flat_put_equals_the_fancy_assignment(rng):
    """ScatterElements without a reduction puts at flat offsets; against NumPy's fancy assignment
    (one index array per dim) on random ranks, axes, smaller index shapes, negative and duplicate
    indices (the later update wins in both)."""
    from infc.compiler.runtime.kernels import gather_scatter

    for _ in range(200):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(d) for d in rng.integers(1, 6, ndim))
        axis = int(rng.integers(0, ndim))
        index_shape = tuple(int(rng.integers(1, 8)) if d == axis else int(rng.integers(1, shape[d] + 1)) for d in range(ndim))
        x = rng.standard_normal(shape).astype(F32)
        indices = rng.integers(-shape[axis], shape[axis], index_shape)
        updates = rng.standard_normal(index_shape).astype(F32)
        grid = list(np.indices(index_shape, sparse=True))
        grid[axis] = np.where(indices < 0, indices + shape[axis], indices)
        expected = x.copy()
        expected[tuple(grid)] = updates
        np.testing.assert_array_equal(gather_scatter._scatter_flat(x, indices, updates, axis), expected)
    with pytest.raises(IndexError, match="outside"):
        gather_scatter._scatter_flat(np.zeros((3, 4), F32), np.array([[3]]), np.ones((1, 1), F32), 0)
    with pytest.raises(IndexError, match="do not fit"):
        gather_scatter._scatter_flat(np.zeros((3, 4), F32), np.zeros((1, 5), np.int64), np.ones((1, 5), F32), 0)
