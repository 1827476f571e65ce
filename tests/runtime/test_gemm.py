import numpy as np
import pytest

from infc.compiler.fused_activations import ACTIVATION_ATTRS, FUSED_GEMM_ACTIVATIONS

F32 = np.float32
FUSED_ACTIVATIONS = {name: dict(ACTIVATION_ATTRS[name]) for name in FUSED_GEMM_ACTIVATIONS}  # what the Gemm fusion writes
MS = "com.microsoft"


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                             ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4,))])
def test_matmul(a_shape, b_shape, rng, single_node, ort_check):
    a = np.asarray(rng.standard_normal(a_shape), dtype=F32)
    b = np.asarray(rng.standard_normal(b_shape), dtype=F32)
    ort_check(single_node("MatMul", {"a": a, "b": b}, [("y", F32)]), {"a": a, "b": b})


@pytest.mark.parametrize("attrs,c_shape", [({}, (5,)), ({"transA": 1}, (3, 5)), ({"transB": 1, "alpha": 0.5}, (1, 5)),
                                           ({"transA": 1, "transB": 1, "beta": 2.0}, ()), ({"beta": 0.0}, (5,)),
                                           ({}, None)])
def test_gemm(attrs, c_shape, rng, single_node, ort_check):
    a = rng.standard_normal((4, 3) if attrs.get("transA") else (3, 4)).astype(F32)
    b = rng.standard_normal((5, 4) if attrs.get("transB") else (4, 5)).astype(F32)
    inits = {"b": b} if c_shape is None else {"b": b, "c": np.asarray(rng.standard_normal(c_shape), dtype=F32)}
    ort_check(single_node("Gemm", {"a": a}, [("y", F32)], attrs, inits, opset=13), {"a": a})


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.125}, {"transA": 1, "transB": 1},
                                   {"transBatchA": 1}, {"transBatchB": 1, "transB": 1}])
def test_fused_matmul(attrs, rng, single_node, ort_check):
    a_shape = (3, 2, 5, 4) if attrs.get("transBatchA") else (2, 3, 4, 5) if attrs.get("transA") else (2, 3, 5, 4)
    b_shape = (6, 2, 3, 4) if attrs.get("transBatchB") and attrs.get("transB") else (2, 3, 6, 4) if attrs.get("transB") else (2, 3, 4, 6)
    if attrs.get("transBatchA"):
        a_shape = (5, 2, 3, 4)
    a, b = rng.standard_normal(a_shape).astype(F32), rng.standard_normal(b_shape).astype(F32)
    ort_check(single_node("FusedMatMul", {"a": a, "b": b}, [("y", F32)], attrs, domain=MS), {"a": a, "b": b})


@pytest.mark.parametrize("activation,extra", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}), ("Tanh", {}),
                                              ("Sigmoid", {})])
def test_fused_gemm(activation, extra, rng, single_node, ort_check):
    a = rng.standard_normal((3, 4)).astype(F32)
    inits = {"b": rng.standard_normal((5, 4)).astype(F32), "c": rng.standard_normal(5).astype(F32)}
    attrs = {"activation": activation, "transB": 1, **extra}
    ort_check(single_node("FusedGemm", {"a": a}, [("y", F32)], attrs, inits, domain=MS), {"a": a})


@pytest.mark.parametrize("activation", sorted(FUSED_ACTIVATIONS))
@pytest.mark.parametrize("defaults", [True, False])
def test_every_activation_the_gemm_fusion_writes_runs(activation, defaults, rng, single_node, ort_check):
    # passes/fuse/gemm.py fuses these into FusedGemm; the kernel knew only five (Elu and Softplus
    # after a Gemm failed the build: found by scripts/fuzz_graphs.py)
    a = 2 * rng.standard_normal((6, 4)).astype(F32)
    inits = {"b": rng.standard_normal((5, 4)).astype(F32), "c": rng.standard_normal(5).astype(F32)}
    params = {f"activation_{k}": (v if defaults else 0.5 + 0.25 * i) for i, (k, v) in enumerate(FUSED_ACTIVATIONS[activation].items())}
    attrs = {"activation": activation, "transB": 1, **params}
    ort_check(single_node("FusedGemm", {"a": a}, [("y", F32)], attrs, inits, domain=MS), {"a": a})


@pytest.mark.parametrize("equation,shapes", [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
                                             ("ii->i", [(3, 3)]), ("i,i", [(5,), (5,)]), ("ij->ji", [(2, 5)]),
                                             ("...ij,...jk->...ik", [(2, 2, 3), (2, 3, 2)])])
def test_einsum(equation, shapes, rng, single_node, ort_check):
    feeds = {f"x{i}": rng.standard_normal(s).astype(F32) for i, s in enumerate(shapes)}
    ort_check(single_node("Einsum", feeds, [("y", F32)], {"equation": equation}, opset=12), feeds)


def test_det(rng, single_node, ort_check):
    x = rng.standard_normal((2, 3, 3)).astype(F32)
    ort_check(single_node("Det", {"x": x}, [("y", F32)]), {"x": x}, rtol=1e-4)
