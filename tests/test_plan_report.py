"""`infc inspect PLAN` on a decoder plan: what its decode section holds (the KV pool and its memory),
the KV layout and attention kind, and the architecture the build recognized."""

import json

from click.testing import CliRunner

from infc import cli
from infc.compiler.plan.format import write_plan

DECODER = {"num_layers": 2, "num_heads": 8, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 128,
           "max_model_len": 512, "block_size": 16, "eos_token_ids": [2], "logits": "logits", "gathers_logits": True}


def _plan(tmp_path, program_ops, num_kv_blocks=64, num_kv_heads=2):
    program = [{"op": op, "domain": "infc" if op == "PagedAttention" else "", "inputs": [], "outputs": [], "attrs": {}}
               for op in program_ops]
    program[-1]["outputs"] = ["logits"]  # a header whose outputs no step gives is refused on reading
    meta = {"infc_version": "test", "kind": "decoder", "target": {"kind": "cpu"}, "program": program,
            "memory": {"arena_bytes": 0, "sum_activation_bytes": 0}, "weights": {}, "inputs": [],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "seq", 128]}],
            "decoder": {**DECODER, "num_kv_heads": num_kv_heads},
            "profile": {"decode": {"max_num_seqs": 4, "max_num_batched_tokens": 128, "block_size": 16,
                                   "num_kv_blocks": num_kv_blocks, "max_model_len": 512}}}
    path = tmp_path / "decoder.plan"
    write_plan(path, meta, {})
    return path


def _inspect(path, *options):
    result = CliRunner().invoke(cli.main, ["inspect", str(path), *options])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_inspect_says_what_the_decode_section_and_the_kv_cache_hold(tmp_path):
    path = _plan(tmp_path, ["RotaryEmbedding", "SimplifiedLayerNormalization", "GatedActivation", "PagedAttention"])
    decoder = json.loads(_inspect(path, "--json"))["decoder"]
    assert decoder["decode"] == {"max_num_seqs": 4, "max_num_batched_tokens": 128, "block_size": 16,
                                 "num_kv_blocks": 64, "max_model_len": 512}
    per_block = 2 * 2 * 2 * 16 * 16 * 4  # K and V, 2 layers, 2 KV heads, 16 tokens, head dim 16, float32
    kv = decoder["kv_cache"]
    assert (kv["num_blocks"], kv["bytes_per_block"], kv["bytes_per_token"]) == (64, per_block, per_block // 16)
    assert (kv["pool_tokens"], kv["pool_bytes"], kv["bytes_per_full_context"]) == (1024, 64 * per_block, 32 * per_block)
    assert kv["layout"].startswith("paged: per layer, a key and a value pool of [blocks, 2 KV heads, 16 tokens, 16] float32")
    assert decoder["attention_kind"] == "grouped-query (8 query heads over 2 KV heads, 4 each)"
    assert decoder["architecture"] == {"positions": "rotary", "norm": "RMSNorm", "mlp": "gated"}
    text = _inspect(path)
    assert "KV pool 64 blocks (1024 tokens, 524.3 KB), 8.2 KB a block, 512 bytes a token" in " ".join(text.split())
    assert "recognized: decoder-only transformer; positions: rotary; norm: RMSNorm; MLP: gated" in " ".join(text.split())


def test_inspect_auto_pool_multi_head_and_learned_positions(tmp_path):
    path = _plan(tmp_path, ["LayerNormalization", "FastGelu", "PagedAttention"], num_kv_blocks="auto", num_kv_heads=8)
    decoder = json.loads(_inspect(path, "--json"))["decoder"]
    assert decoder["kv_cache"]["num_blocks"] == "auto" and decoder["kv_cache"]["pool_bytes"] is None
    assert decoder["attention_kind"] == "multi-head (8 heads)"
    assert decoder["architecture"] == {"positions": "absolute (no rotary or ALiBi)", "norm": "LayerNorm", "mlp": "plain"}
    assert "KV pool auto blocks (sized at run time" in " ".join(_inspect(path).split())
