"""GEMM tuning over a profile's range (compiler/tune_plan.py)."""

import numpy as np
import onnx
from onnx import helper

from infc.compiler.build import BuildOptions, build
from infc.compiler.runtime.session import PlanSession
from infc.compiler.testing import make_model
from infc.compiler.verify import ort_session


def test_a_profile_level_with_no_rows_builds_and_runs(tmp_path):
    """A batch (or past length) of 0 at the profile's min is a valid shape: its GEMM has no rows to
    tune, which used to stop the build with an internal error (M must be at least 1)."""
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", np.float32, ["batch", 16])],
                       [("y", np.float32, ["batch", 8])], {"w": w})
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text("inputs:\n  x: {min: [0, 16], opt: [4, 16], max: [8, 16]}\n")
    build(str(tmp_path / "m.onnx"), str(tmp_path / "p.yaml"), str(tmp_path / "p.plan"),
          BuildOptions(use_cache=False, show_progress=False))
    session, reference = PlanSession(tmp_path / "p.plan"), ort_session(model)
    for rows in (0, 3, 8):
        x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
        ours, = session.run({"x": x}).values()
        expected, = reference.run(["y"], {"x": x})
        assert ours.shape == (rows, 8)
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
