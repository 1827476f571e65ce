"""Lowering-time fusion of a mixture of experts' gathered weights into one expert GEMM step.

    idx ─► Gather(W [E, ., .], axis 0) ─► G ─► MatMul(G, x) or MatMul(x, G) ─► y
    ══►   ExpertMatMul(x, idx, W as [E, K, N]) ─► y              (runtime/kernels/expert_gemm.py)

The Gather must read a constant rank-3 weight along axis 0 and feed that MatMul alone. Dynamo
exports write it as GatherND(W, idx [.., 1]) with batch_dims 0, the same rows: fused too where the
indices' last dim is 1 by the graph's shapes (the step then drops that axis: `index_depth`). Where G is
the MatMul's first input (y[r] = W[idx[r]] @ x[r], the batched-MM export's column form), the plan
stores the weight transposed to [E, K, N] once, so both forms run as rows times [K, N] weights;
the original is dropped when no other step reads it. Values a subgraph or the graph's outputs read
are never folded away.
"""

from __future__ import annotations

import numpy as np

EXPERT_OP, EXPERT_DOMAIN = "ExpertMatMul", "infc.cpu"


def fuse_expert_gemms(steps: list[dict], weights: dict[str, np.ndarray], visible: set[str], tensors: dict) -> list[dict]:
    """The program with each Gather -> MatMul pair as one ExpertMatMul step (`weights` gains the
    transposed weights, loses the ones no step reads any more)."""
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in step["inputs"]:
            if name:
                readers.setdefault(name, []).append(index)
    fused: dict[int, dict] = {}
    dropped: set[int] = set()
    for index, gather in enumerate(steps):
        w = _gathered_weight(gather, weights, tensors)
        if w is None:
            continue
        out = gather["outputs"][0]
        if out in visible or len(readers.get(out, [])) != 1:
            continue
        mm_index = readers[out][0]
        matmul = steps[mm_index]
        if matmul["op"] != "MatMul" or matmul.get("domain") or len(matmul["inputs"]) != 2 or mm_index in fused:
            continue
        a, b = matmul["inputs"]
        if a == b:
            continue
        side = 0 if a == out else 1
        name = gather["inputs"][0]
        if side == 0:
            name = f"{name}@experts_kn"
            if name not in weights:
                weights[name] = np.ascontiguousarray(np.swapaxes(w, -1, -2))
        fused[mm_index] = {"op": EXPERT_OP, "domain": EXPERT_DOMAIN, "name": f"{matmul.get('name', '')}#experts",
                           "inputs": [b if side == 0 else a, gather["inputs"][1], name],
                           "outputs": list(matmul["outputs"]), "attrs": {"weights_side": side}}
        if gather["op"] == "GatherND":
            fused[mm_index]["attrs"]["index_depth"] = 1
        dropped.add(index)
    if not fused:
        return steps
    result = [fused.get(i, step) for i, step in enumerate(steps) if i not in dropped]
    still_read = {name for step in result for name in step["inputs"]} | visible
    for index in dropped:
        name = steps[index]["inputs"][0]
        if name in weights and name not in still_read:
            del weights[name]
    return result


def _gathered_weight(step: dict, weights: dict[str, np.ndarray], tensors: dict) -> np.ndarray | None:
    """The constant rank-3 weight a Gather along axis 0 (or a GatherND of depth-1 indices) reads by
    runtime indices, else None."""
    if step.get("domain") or len(step["inputs"]) != 2 or not step["outputs"][0]:
        return None
    if step["op"] == "Gather":
        if step["attrs"].get("axis", 0) not in (0, -3):
            return None
    elif step["op"] == "GatherND":
        index = tensors.get(step["inputs"][1])
        shape = getattr(index, "shape", None)
        if step["attrs"].get("batch_dims", 0) != 0 or not shape or shape[-1] != 1:
            return None
    else:
        return None
    w = weights.get(step["inputs"][0])
    # float32 only: a float16 MatMul computes in float32 and rounds once (kernels/half.py), which the
    # grouped GEMMs would not do
    if w is None or w.ndim != 3 or step["inputs"][1] in weights or w.dtype != np.float32 or 0 in w.shape:
        return None
    return w
