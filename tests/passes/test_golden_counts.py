"""Golden counts of fused ops on the committed fixtures after the whole pipeline.

Update only on purpose: `INFC_UPDATE_GOLDEN=1 python -m pytest tests/passes/test_golden_counts.py`
rewrites tests/passes/golden_counts.json from the current pipeline.
"""

import json
import os
from pathlib import Path

import onnx
import pytest

from infc.compiler.optimize import optimize_model
from infc.compiler.testing import FIXTURES, assert_matches_ort

GOLDEN = Path(__file__).with_name("golden_counts.json")
# The exported model fixtures (tests/models/fixtures.json), not the special-purpose ones.
FIXTURE_NAMES = sorted(Path(m["name"]).stem for m in json.loads((FIXTURES / "fixtures.json").read_text()))
# The ops whose counts are the point of the fusions; everything else may move freely.
TRACKED_OPS = ("com.microsoft.MultiHeadAttention", "Attention", "com.microsoft.RotaryEmbedding", "RotaryEmbedding",
               "SimplifiedLayerNormalization", "com.microsoft.SkipSimplifiedLayerNormalization", "LayerNormalization",
               "com.microsoft.SkipLayerNormalization", "com.microsoft.QuickGelu", "com.microsoft.BiasGelu",
               "com.microsoft.FastGelu", "com.microsoft.Gelu", "com.microsoft.FusedConv", "HardSwish", "Softmax",
               "BatchNormalization", "Split")


def _counts(name):
    result = optimize_model(onnx.load(FIXTURES / f"{name}.onnx"))
    return result, {op: result.ops_after.get(op, 0) for op in TRACKED_OPS} | {"nodes_after": result.pipeline.nodes_after}


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_golden_counts(name):
    result, counts = _counts(name)
    if os.environ.get("INFC_UPDATE_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[name] = counts
        GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())[name]
    assert counts == golden
    assert_matches_ort(onnx.load(FIXTURES / f"{name}.onnx"), result.model, rtol=1e-4)


def test_decoders_have_one_attention_per_layer_and_fused_norms():
    meta = {m["name"]: m for m in json.loads((FIXTURES / "fixtures.json").read_text())}
    for name in FIXTURE_NAMES:
        if not name.startswith(("gpt2", "llama")):
            continue
        info = meta[f"{name}.onnx"]
        _, counts = _counts(name)
        num_layers = info["num_layers"]
        assert counts["com.microsoft.MultiHeadAttention"] + counts["Attention"] == num_layers, name
        assert counts["Softmax"] == 0, name
        if name.startswith("llama"):
            assert counts["com.microsoft.RotaryEmbedding"] == 2 * num_layers  # q and k
            assert counts["SimplifiedLayerNormalization"] + counts["com.microsoft.SkipSimplifiedLayerNormalization"] == 2 * num_layers + 1
            assert counts["com.microsoft.QuickGelu"] == num_layers  # one SwiGLU gate per layer
        else:
            assert counts["com.microsoft.FastGelu"] == num_layers
