"""Multi-head latent attention (decoder/latent_kv.py): an export that caches per-token latents and
computes the attention's keys and values from the whole concatenated cache is paged with the keys
and values of the new tokens alone, once they are proven to be computed position by position.

    deepseek_v3_ts      DeepSeek V3 (transformers 5.24): the cache holds the kv latent (32 wide) and
                        the rotary key (8); keys 24 = 16 + 8, values 16 (padded to 24 in the pools)
    deepseek_v3_dynamo  the same through dynamo, whose key/value arithmetic reads the batch size off
                        input_ids and lengths off the past latents
"""

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from infc.compiler.decoder.latent_kv import find_latent_caches
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.testing import FIXTURES

from .conftest import assert_greedy_matches_ort, build_plan, prompts, runner_greedy
from .test_hf_decoders import _profile

@pytest.mark.parametrize("name", ["deepseek_v3_ts", "deepseek_v3_dynamo"])
def test_latent_cache_is_paged_as_keys_and_values(name, tmp_path):
    source = FIXTURES / "hf" / f"{name}.onnx"
    plan = build_plan(source, _profile(tmp_path, 128), tmp_path)
    meta = read_plan(plan).meta
    assert meta["decoder"]["head_dim"] == 24  # the keys' width: the pools hold expanded keys, not latents
    assert sum(s["op"] == "PagedAttention" for s in meta["program"]) == 2
    runner = load_model_runner(plan)
    requests = prompts(4, runner.spec.vocab_size, seed=1, max_len=60)
    tokens, logits = runner_greedy(runner, requests, 32, chunk_sizes=[17, 40, 9, 64], budget=96)
    assert_greedy_matches_ort(source, requests, tokens, logits, 32)


def _latent_graph(mixes_positions: bool):
    """past [1, 1, P, 8] ++ new [1, 1, S, 8] -> K = latent @ W (per position); V the same, or a CumSum
    over positions (what paging cannot recompute from the new tokens alone)."""
    past = gs.Variable("past_key_values.0.key", np.float32, [1, 1, "past", 8])
    new = gs.Variable("new_latent", np.float32, [1, 1, "seq", 8])
    source = gs.Variable("x", np.float32, [1, 1, "seq", 8])
    latent = gs.Variable("latent", np.float32, [1, 1, "total", 8])
    k = gs.Variable("k", np.float32, [1, 1, "total", 8])
    v = gs.Variable("v", np.float32, [1, 1, "total", 8])
    q, y = gs.Variable("q", np.float32, [1, 1, "seq", 8]), gs.Variable("y", np.float32, None)
    weight = gs.Constant("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    nodes = [gs.Node("Identity", inputs=[source], outputs=[new]),
             gs.Node("Concat", attrs={"axis": 2}, inputs=[past, new], outputs=[latent]),
             gs.Node("MatMul", inputs=[latent, weight], outputs=[k]),
             gs.Node("CumSum", inputs=[latent, gs.Constant("axis", np.array(2, np.int64))], outputs=[v]) if mixes_positions
             else gs.Node("Neg", inputs=[latent], outputs=[v]),
             gs.Node("Attention", inputs=[q, k, v], outputs=[y])]
    return gs.Graph(nodes=nodes, inputs=[past, source, q], outputs=[y, latent], opset=17)


def test_keys_computed_position_by_position_are_found():
    graph = _latent_graph(mixes_positions=False)
    found = find_latent_caches(graph, [graph.nodes[-1]], lambda node: False)
    (latent,) = found.values()
    assert [t.name for t in latent.past] == ["past_key_values.0.key"] and [t.name for t in latent.present] == ["latent"]
    assert len(graph.nodes) == 5  # the probe's clone is gone again: canonicalize.py clones where it pages


def test_keys_mixing_positions_are_refused():
    graph = _latent_graph(mixes_positions=True)
    with pytest.raises(BadInput, match="computed from the whole cached sequence, not from each cached position alone"):
        find_latent_caches(graph, [graph.nodes[-1]], lambda node: False)
