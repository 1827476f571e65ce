import numpy as np
import pytest

F32 = np.float32


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_and_softmax_cross_entropy(reduction, weighted, rng, single_node, ort_check):
    scores = rng.standard_normal((3, 5, 2)).astype(F32)
    labels = np.array([[0, 4], [2, -1], [1, 3]], np.int64)
    inits = {"w": rng.random(5).astype(F32)} if weighted else {}
    attrs = {"reduction": reduction, "ignore_index": -1}
    log_probs = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
    ort_check(single_node("NegativeLogLikelihoodLoss", {"x": log_probs.astype(F32), "t": labels}, [("y", F32)], attrs,
                          inits, opset=13), {"x": log_probs.astype(F32), "t": labels})
    ort_check(single_node("SoftmaxCrossEntropyLoss", {"x": scores, "t": labels}, [("y", F32), ("lp", F32)], attrs,
                          inits, opset=13), {"x": scores, "t": labels})
