#!/usr/bin/env python
"""Export tiny random-weight Hugging Face decoders the way people export real ones, for `infc build`.

    pip install torch transformers onnxscript          # optional deps: this script only
    python scripts/export_hf_decoders.py [--models qwen2,llama] [--exporters ts,dynamo,optimum] [--out DIR]

Each architecture is its transformers class built from a small config (2 layers, hidden 64, vocab
256; no download), with seeded random weights, exported by:

  ts       torch.onnx.export (TorchScript exporter, opset 17) of a wrapper taking the past key/values
           as flat inputs past_key_values.{i}.key/value and returning present.{i}.key/value
  dynamo   the same wrapper through torch.onnx.export(dynamo=True) (opset 18, the default)
  dynamo23 the same at opset 23, where SDPA exports as the ONNX Attention op
  optimum  optimum.exporters.onnx.main_export(task="text-generation-with-past"); optimum-onnx pins
           transformers < 4.58, so run this one from an environment that has it

With --attn eager the models use transformers' eager attention instead of SDPA (folder suffix _eager).
Writes DIR/{arch}_{exporter}/model.onnx (default DIR build/hf_decoders/, git-ignored) and checks each
export in onnxruntime against transformers on a prompt and one decode step with its past.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch  # optional dependencies of this script: torch, transformers (+ onnxscript, optimum-onnx)
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# model_type and the config fields that differ from COMMON; the mix covers GQA, q/k/v biases, tied
# embeddings, fused projections, partial rotary and a learned position table.
CONFIGS = {
    "qwen2": ("qwen2", {"tie_word_embeddings": False, "use_sliding_window": False}),
    "llama": ("llama", {"tie_word_embeddings": True}),  # SmolLM / TinyLlama shape
    "mistral": ("mistral", {"sliding_window": None, "tie_word_embeddings": False}),
    # a sliding window shorter than any useful max_model_len: infc must refuse it, not drop it
    "mistral_window": ("mistral", {"sliding_window": 24, "tie_word_embeddings": False}),
    "phi3": ("phi3", {"partial_rotary_factor": 0.75, "tie_word_embeddings": False}),  # Phi-3.5 / Phi-4-mini
    "gpt2": ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "n_positions": 512,
                      "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2}),
}
GPT2_DROP = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "pad_token_id"}
CHECK_TOL = 1e-4


def make_model(arch: str, attn: str = "sdpa", **overrides) -> nn.Module:
    model_type, fields = CONFIGS[arch]
    common = {k: v for k, v in COMMON.items() if model_type != "gpt2" or k not in GPT2_DROP}
    config = AutoConfig.for_model(model_type, **{**common, **fields, **overrides})
    torch.manual_seed(sum(map(ord, arch)))
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()
    with torch.no_grad():  # weights large enough that greedy tokens are decisive, norms not all ones
        for name, p in model.named_parameters():
            is_norm = "norm" in name or "ln_" in name
            p.copy_(torch.randn_like(p) * (0.2 if is_norm else 0.15) + float(is_norm and "weight" in name))
    return model


def kv_shape(model) -> tuple[int, int, int]:
    c = model.config
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    return c.num_hidden_layers, kv_heads, getattr(c, "head_dim", None) or c.hidden_size // heads


def kv_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{w}" for i in range(num_layers) for w in ("key", "value")]
    return past, [n.replace("past_key_values", "present") for n in past]


class FlatPast(nn.Module):
    """The Hugging Face model with its cache as flat tensors, as exporters want it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache  # noqa: PLC0415

        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        layers = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else \
            list(zip(cache.key_cache, cache.value_cache))
        return (out.logits, *[t for kv in layers for t in kv])


def export_torch(model, path: Path, dynamo: bool, opset: int | None = None) -> None:
    num_layers, kv_heads, head_dim = kv_shape(model)
    past, present = kv_names(num_layers)
    args = (torch.tensor([[5, 6]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[3, 4]]),
            *[torch.randn(1, kv_heads, 3, head_dim) for _ in past])
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "position_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"}, "logits": {0: "batch_size", 1: "sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past},
            **{n: {0: "batch_size", 2: "total_sequence_length"} for n in present}}
    names = dict(input_names=["input_ids", "attention_mask", "position_ids", *past], output_names=["logits", *present])
    with torch.no_grad():
        if not dynamo:
            torch.onnx.export(FlatPast(model).eval(), args, str(path), dynamo=False, opset_version=opset or 17,
                              dynamic_axes=axes, do_constant_folding=True, **names)
            return
        dyn = torch.export.Dim.DYNAMIC  # dynamo wants dynamic_shapes: one dict per positional input, *past a tuple
        shapes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple({0: dyn, 2: dyn} for _ in past))
        program = torch.onnx.export(FlatPast(model).eval(), args, dynamo=True, dynamic_shapes=shapes, opset_version=opset,
                                    **names)
        program.save(str(path), external_data=False)


def export_optimum(model, path: Path) -> None:
    from optimum.exporters.onnx import main_export  # noqa: PLC0415 - optional, needs transformers < 4.58

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        main_export(tmp, output=Path(tmp) / "onnx", task="text-generation-with-past", do_validation=False)
        shutil.copy(Path(tmp) / "onnx" / "model.onnx", path)
        if (Path(tmp) / "onnx" / "model.onnx_data").exists():
            shutil.copy(Path(tmp) / "onnx" / "model.onnx_data", path.parent)


def check(model, path: Path) -> float:
    """onnxruntime on the export against transformers: a 7-token prompt, then one token with its past."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    num_layers, kv_heads, head_dim = kv_shape(model)
    names = {i.name for i in session.get_inputs()}
    past, present = kv_names(num_layers)
    ids = torch.tensor([[1, 17, 33, 200, 9, 4, 77, 150]]) % model.config.vocab_size
    with torch.no_grad():
        want = model(ids).logits.numpy()
    feeds = {n: np.zeros((1, kv_heads, 0, head_dim), np.float32) for n in past}
    feeds.update(input_ids=ids[:, :7].numpy(), attention_mask=np.ones((1, 7), np.int64), position_ids=np.arange(7)[None])
    outputs = [o.name for o in session.get_outputs()]
    out = dict(zip(outputs, session.run(None, {k: v for k, v in feeds.items() if k in names})))
    feeds.update({n: out[p] for n, p in zip(past, present)})
    feeds.update(input_ids=ids[:, 7:].numpy(), attention_mask=np.ones((1, 8), np.int64), position_ids=np.array([[7]]))
    last = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    return float(max(np.abs(out["logits"] - want[:, :7]).max(), np.abs(last - want[:, 7:]).max()))


EXPORTERS = {"ts": lambda m, p: export_torch(m, p, dynamo=False), "dynamo": lambda m, p: export_torch(m, p, dynamo=True),
             "dynamo23": lambda m, p: export_torch(m, p, dynamo=True, opset=23), "optimum": export_optimum}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--exporters", default="ts,dynamo,optimum", help="comma-separated, of ts, dynamo, optimum")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="transformers attention implementation (default sdpa, what exports get by default)")
    parser.add_argument("--out", default="build/hf_decoders", help="output folder (default build/hf_decoders)")
    args = parser.parse_args()
    failed = False
    for arch in args.models.split(","):
        for exporter in args.exporters.split(","):
            folder = Path(args.out) / f"{arch}_{exporter}{'' if args.attn == 'sdpa' else '_' + args.attn}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "model.onnx"
            model = make_model(arch, args.attn)
            try:
                EXPORTERS[exporter](model, path)
                onnx_model = onnx.load(str(path))
                onnx_model.ir_version = min(onnx_model.ir_version, 10)
                onnx_model.metadata_props.add(key="eos_token_ids", value=json.dumps([model.config.eos_token_id]))
                onnx.save(onnx_model, str(path))
                diff = check(model, path)
            except Exception as e:  # noqa: BLE001 - report each export and go on with the others
                print(json.dumps({"model": str(path), "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
                failed = True
                continue
            print(json.dumps({"model": str(path), "max_abs_diff_vs_transformers": diff}), flush=True)
            failed |= diff > CHECK_TOL
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
