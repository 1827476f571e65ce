"""FusedGemm / FusedConv split back into the base op and its activation for INT8 (quantize/unfuse.py):
every activation the fusions write comes apart into an ONNX op that computes the same."""

import numpy as np
import pytest
from onnx import helper

from infc.compiler.fused_activations import ACTIVATION_ATTRS, FUSED_GEMM_ACTIVATIONS
from infc.compiler.quantize.unfuse import unfuse_activations
from infc.compiler.testing import make_model
from infc.compiler.verify import ort_session

F32 = np.float32
FUSED_ACTIVATIONS = {name: dict(ACTIVATION_ATTRS[name]) for name in FUSED_GEMM_ACTIVATIONS}  # what the Gemm fusion writes


@pytest.mark.parametrize("activation", sorted(FUSED_ACTIVATIONS))
def test_a_fused_gemm_unfuses_into_gemm_and_its_activation(activation):
    rng = np.random.default_rng(0)
    params = {f"activation_{k}": 0.5 + 0.25 * i for i, k in enumerate(FUSED_ACTIVATIONS[activation])}
    node = helper.make_node("FusedGemm", ["a", "b", "c"], ["y"], domain="com.microsoft", activation=activation,
                            transB=1, **params)
    model = make_model([node], [("a", F32, [6, 4])], [("y", F32, [6, 5])],
                       {"b": rng.standard_normal((5, 4)).astype(F32), "c": rng.standard_normal(5).astype(F32)},
                       extra_opsets=[("com.microsoft", 1)])
    unfused, count = unfuse_activations(model)
    assert count == 1 and [n.op_type for n in unfused.graph.node] == ["Gemm", activation]
    feeds = {"a": 2 * rng.standard_normal((6, 4)).astype(F32)}
    np.testing.assert_allclose(ort_session(unfused).run(None, feeds)[0], ort_session(model).run(None, feeds)[0],
                               rtol=1e-6, atol=1e-6)
