#!/usr/bin/env python
"""Regenerate the onnxruntime-genai decoder fixtures tests/models/genai/*.onnx
(tests/decoder/test_genai_decoders.py).

    python -m venv /tmp/genai && . /tmp/genai/bin/activate      # script-only deps, apart from infc's
    pip install onnxruntime-genai onnx_ir onnx transformers torch==2.13.0
    python tests/models/make_genai_fixtures.py

A tiny Llama and Qwen3 (2 layers, hidden 64, 4 query and 2 KV heads, vocab 256, random weights, no
download) are saved as Hugging Face folders and converted by onnxruntime-genai's model builder, as users convert
real checkpoints (`python -m onnxruntime_genai.models.builder -m llama -i DIR -o OUT -p fp32|int4
-e cpu`): GroupQueryAttention with packed QKV and rotary inside, SimplifiedLayerNormalization in the
ONNX domain, MatMulNBits 4-bit weights for int4. Each is written as one file (data inside).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
import torch
from transformers import AutoConfig, AutoModelForCausalLM

OUT = Path(__file__).resolve().parent / "genai"
# fixture: (model type, extra config, builder precisions); Qwen3 normalizes q and k apart, so its
# GroupQueryAttention takes separate query, key and value
FIXTURES = {"llama": ("llama", {}, ("fp32", "int4")), "qwen3": ("qwen3", {"head_dim": 16}, ("fp32",))}
CONFIG = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
# the builder needs a tokenizer in the folder; a word-level one over the 256 ids is enough
TOKENIZER = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": {"type": "Whitespace"},
             "post_processor": None, "decoder": None,
             "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(256)}, "unk_token": "t0"}}


def main():
    torch.manual_seed(0)
    OUT.mkdir(exist_ok=True)
    for name, (model_type, extra, precisions) in FIXTURES.items():
        with tempfile.TemporaryDirectory() as tmp:
            hf = Path(tmp) / "hf"
            AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **CONFIG, **extra)).save_pretrained(hf)
            (hf / "tokenizer.json").write_text(json.dumps(TOKENIZER))
            (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
            for precision in precisions:
                built = Path(tmp) / precision
                subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", model_type, "-i", str(hf),
                                "-o", str(built), "-p", precision, "-e", "cpu", "-c", str(Path(tmp) / "cache")], check=True)
                model = onnx.load(str(built / "model.onnx"))  # with its external data
                path = OUT / f"{name}_{precision}.onnx"
                onnx.save(model, str(path))
                print(json.dumps({"fixture": str(path), "bytes": path.stat().st_size}))

if __name__ == "__main__":
    main()
