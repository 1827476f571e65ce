#!/usr/bin/env python
"""Regenerate the tiny Hugging Face decoder fixtures tests/models/hf/*.onnx
(tests/decoder/test_hf_decoders.py; a folder of their own, so tests that take every tests/models/*.onnx
do not).

    pip install torch==2.13.0 transformers onnxscript     # script-only deps
    python tests/models/make_hf_fixtures.py [--only NAME]

Each is a transformers model class with random weights, exported by scripts/export_hf_decoders.py
the way users export real checkpoints, at the smallest size that still has grouped KV heads (vocab
128, hidden 32, MLP 64, 128 positions, tied embeddings; the architecture's own fields as that script
sets them, e.g. Gemma 2's soft-caps). qwen2_optimum needs optimum-onnx, which pins
transformers < 4.58: run that one from an environment that has it (`pip install optimum-onnx`).
"""

import argparse
import importlib.util
import json
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
OUT = HERE / "hf"
SCRIPT = HERE.parents[1] / "scripts" / "export_hf_decoders.py"
# fixture name: (architecture, exporter); what each covers is in tests/decoder/test_hf_decoders.py
FIXTURES = {
    "qwen2_optimum": ("qwen2", "optimum"),
    "phi3_dynamo": ("phi3", "dynamo"),
    "gpt2_ts": ("gpt2", "ts"),
    "mistral_window_ts": ("mistral_window", "ts"),  # one layer is enough for its window
    "gemma2_ts": ("gemma2", "ts"),
    "falcon_dynamo": ("falcon", "dynamo"),
    "qwen3_dynamo": ("qwen3", "dynamo"),
    "gpt_neox_ts": ("gpt_neox", "ts"),
    "gptj_ts": ("gptj", "ts"),
    "opt_ts": ("opt", "ts"),
    "granite_dynamo": ("granite", "dynamo"),
    "bloom_ts": ("bloom", "ts"),  # ALiBi on (B*N)-row attention (baddbmm)
    "mpt_ts": ("mpt", "ts"),  # ALiBi sliced from a max_seq_len table, masked_fill
    "mixtral_ts": ("mixtral", "ts"),  # MoE; made with transformers 4.46 (see the export script)
    "llama_ts_nocache": ("llama", "ts_nocache"),  # no past inputs: logits of the whole sequence
    "phi3_longrope_dynamo": ("phi3_longrope", "dynamo"),  # built only for max_model_len <= 64
    "qwen2_dynamo_fp16": ("qwen2", "dynamo"),  # model.half() before export: served in float32
    # attention sinks, a 24-key window on every other layer, top-2 of 4 experts (transformers 5.24)
    "gpt_oss_window_ts": ("gpt_oss_window", "ts"),
    # multi-head latent attention: the export caches the kv latent (32) and the rotary key (8)
    # (transformers 5.24), keys 24 and values 16 wide computed from them; grouped MoE routing
    "deepseek_v3_ts": ("deepseek_v3", "ts"),
    "deepseek_v3_dynamo": ("deepseek_v3", "dynamo"),  # + dims read off input_ids and the past latents
    "gemma4_ts": ("gemma4", "ts"),  # full-attention layers' heads 64 wide, sliding layers' 16; per-layer inputs
}
DTYPES = {"qwen2_dynamo_fp16": "float16"}
LAYERS = {"mistral_window_ts": 1, "gemma4_ts": 4}
# MPT names its fields its own way (d_model, n_heads, n_layers, max_seq_len)
OVERRIDES_MPT = {"d_model": 32, "n_layers": 2, "max_seq_len": 128}
# head size 16 at hidden 32, as the script's longrope factors (6 per rotary half) are sized for
OVERRIDES = {"phi3_longrope_dynamo": {"num_attention_heads": 2, "num_key_value_heads": 1}, "mpt_ts": OVERRIDES_MPT,
             "gemma4_ts": {"global_head_dim": 64}}  # still 4x the sliding layers' 16, in a quarter of the bytes
TINY = {"vocab_size": 128, "hidden_size": 32, "n_embd": 32, "intermediate_size": 64, "n_inner": 64,
        "tie_word_embeddings": True, "max_position_embeddings": 128, "n_positions": 128}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FIXTURES), help="regenerate one fixture")
    spec = importlib.util.spec_from_file_location("export_hf_decoders", SCRIPT)
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    only = parser.parse_args().only
    OUT.mkdir(exist_ok=True)
    for name, (arch, exporter) in FIXTURES.items():
        if only and name != only:
            continue
        path = OUT / f"{name}.onnx"
        layers = LAYERS.get(name, 2)
        model = export.make_model(arch, **TINY, num_hidden_layers=layers, n_layer=layers, **OVERRIDES.get(name, {}))
        model = model.to(getattr(export.torch, DTYPES.get(name, "float32")))
        export.EXPORTERS[exporter](model, path)
        m = onnx.load(str(path))
        m.ir_version = min(m.ir_version, 10)
        for node in m.graph.node:  # small, reproducible bytes: no stack traces with local paths, no notes
            del node.metadata_props[:]
            node.doc_string = ""
        onnx.save(m, str(path))
        diff = export.check(model, path)
        print(json.dumps({"fixture": str(path), "bytes": path.stat().st_size, "max_abs_diff_vs_transformers": diff}))
        if diff > (export.CHECK_TOL_HALF if name in DTYPES else export.CHECK_TOL):
            raise SystemExit(f"error: {path} differs from transformers by {diff:.3g}")


if __name__ == "__main__":
    main()
