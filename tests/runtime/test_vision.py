import numpy as np
import pytest

F32 = np.float32


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample(mode, padding, align, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 5, 6)).astype(F32)
    grid = (rng.random((2, 4, 7, 2)) * 2.6 - 1.3).astype(F32)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    ort_check(single_node("GridSample", {"x": x, "g": grid}, [("y", F32)], attrs, opset=20), {"x": x, "g": grid})


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_volumetric_grid_sample(mode, padding, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 4, 5, 6)).astype(F32)
    grid = (rng.random((2, 3, 4, 5, 3)) * 2.6 - 1.3).astype(F32)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": 0}
    ort_check(single_node("GridSample", {"x": x, "g": grid}, [("y", F32)], attrs, opset=20), {"x": x, "g": grid})


def test_affine_grid(rng, single_node, ort_check):
    theta = rng.standard_normal((2, 2, 3)).astype(F32)
    for align in (0, 1):
        model = single_node("AffineGrid", {"t": theta}, [("y", F32)], {"align_corners": align},
                            {"s": np.array([2, 3, 4, 5], np.int64)}, opset=20)
        ort_check(model, {"t": theta})


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("opset", [11, 16])  # RoiAlign-10 does not shift by half a pixel; 16's default does
@pytest.mark.parametrize("ratio", [0, 2])  # 0: a sampling grid per box, sized by the box
def test_roi_align(mode, opset, ratio, rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 10, 10)).astype(F32)
    rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 6.1, 8.3], [3, 3, 4, 4], [2, 2, 2, 2]], F32)  # the last: empty
    inits = {"r": rois, "b": np.array([0, 1, 1, 0], np.int64)}
    attrs = {"mode": mode, "output_height": 3, "output_width": 4, "sampling_ratio": ratio, "spatial_scale": 0.9}
    ort_check(single_node("RoiAlign", {"x": x}, [("y", F32)], attrs, inits, opset=opset), {"x": x})


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("opset", [11, 16])
def test_compiled_roi_align_matches_the_numpy_path(mode, opset, rng):
    """The compiled path (jit_roi_align.py) against the NumPy one: boxes past every edge, tiny and
    huge ones, adaptive and fixed grids, both batch images, and enough boxes to share them between
    threads."""
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    roi_align = kernel_for("", "RoiAlign")
    x = rng.standard_normal((2, 5, 13, 11)).astype(F32)
    corners = rng.uniform(-30, 140, (200, 2))
    rois = np.concatenate([corners, corners + rng.uniform(0, 90, (200, 2))], axis=1).astype(F32)
    rois[:3] = [[0, 0, 0, 0], [-50, -50, 400, 400], [104, 96, 104.5, 96.5]]
    batch = rng.integers(0, 2, 200).astype(np.int64)
    for ratio in (0, 3):
        attrs = {"mode": mode, "output_height": 7, "output_width": 6, "sampling_ratio": ratio, "spatial_scale": 0.125}
        compiled = roi_align([x, rois, batch], attrs, KernelContext(opset))[0]
        with jit.disabled():
            plain = roi_align([x, rois, batch], attrs, KernelContext(opset))[0]
        assert compiled.dtype == plain.dtype == np.float32 and compiled.shape == plain.shape == (200, 5, 7, 6)
        np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(center, rng, single_node, ort_check):
    boxes = rng.random((2, 8, 4)).astype(F32)
    scores = rng.random((2, 3, 8)).astype(F32)
    inits = {"m": np.array([3], np.int64), "iou": np.array([0.3], F32), "st": np.array([0.2], F32)}
    model = single_node("NonMaxSuppression", {"b": boxes, "s": scores}, [("y", np.int64)], {"center_point_box": center},
                        inits)
    ort_check(model, {"b": boxes, "s": scores})


def test_col2im(rng, single_node, ort_check):
    x = rng.standard_normal((1, 2 * 4, 9)).astype(F32)
    inits = {"i": np.array([5, 6], np.int64), "k": np.array([2, 2], np.int64)}
    model = single_node("Col2Im", {"x": x}, [("y", F32)], {"strides": [2, 2], "pads": [0, 1, 1, 0]}, inits, opset=18)
    ort_check(model, {"x": x})


@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
def test_compiled_bilinear_grid_sample_matches_the_numpy_path(padding, align, rng):
    """The compiled path (jit_grid_sample.py) against the NumPy one, with coordinates outside the
    input, at its edges, huge, infinite and NaN; RAFT-like windows (one channel, many small grids)."""
    from infc.compiler.runtime import jit
    from infc.compiler.runtime.kernels import kernel_for
    from infc.compiler.runtime.kernels.common import KernelContext

    grid_sample = kernel_for("", "GridSample")
    attrs = {"mode": "linear", "padding_mode": padding, "align_corners": align}
    for x_shape, grid_shape in (((2, 3, 5, 6), (2, 4, 7, 2)), ((64, 1, 12, 16), (64, 9, 9, 2))):
        x = rng.standard_normal(x_shape).astype(F32)
        grid = (rng.random(grid_shape) * 2.6 - 1.3).astype(F32)
        grid[0, 0, :4, 0] = [-1, 1, 3e30, -np.inf]
        grid[0, 1, :3, 1] = [np.nan, 1, -1]
        compiled = grid_sample([x, grid], attrs, KernelContext(20))[0]
        with jit.disabled():
            plain = grid_sample([x, grid], attrs, KernelContext(20))[0]
        assert compiled.dtype == plain.dtype == np.float32 and compiled.shape == plain.shape
        np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-7)  # NaN where NaN
