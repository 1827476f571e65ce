#!/usr/bin/env python
"""Regenerate the tiny ONNX test fixtures in tests/models/.

    pip install torch==2.13.0 transformers onnxscript   # script-only deps
    python tests/models/make_fixtures.py

Each model is a small hand-written nn.Module that mirrors the Hugging Face
(eager) implementation op for op, exported with BOTH torch.onnx exporters:
TorchScript (``dynamo=False``, file suffix ``_ts``) and dynamo (``dynamo=True``,
suffix ``_dynamo``).  Every file is re-loaded in onnxruntime and compared
against torch on several random inputs; any mismatch raises.

Dynamo export uses ``optimize=True`` (the torch default, i.e. what users get)
for the transformer models: at opset 18 it only folds constants and drops
redundant Reshape/Cast/Identity, it fuses nothing.  For the CNN it would fold
BatchNormalization into Conv, so the CNN uses the raw ``optimize=False`` graph.
"""
import argparse
import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import torch  # script-only dependencies: pip install torch==2.13.0 transformers onnxscript
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
MAX_IR_VERSION = 10
TOL = 1e-4
MIN = torch.finfo(torch.float32).min
B, S, P, T = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"


def perturb_norms(model):
    """Make norm weights/biases and BN statistics non-trivial (defaults are 1/0)."""
    g = torch.Generator().manual_seed(1234)
    for mod in model.modules():
        if isinstance(mod, (nn.BatchNorm2d, nn.LayerNorm, RMSNorm)):
            mod.weight.data = 1 + 0.2 * torch.randn(mod.weight.shape, generator=g)
            if getattr(mod, "bias", None) is not None:
                mod.bias.data = 0.2 * torch.randn(mod.bias.shape, generator=g)
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.data = 0.2 * torch.randn(mod.running_mean.shape, generator=g)
            mod.running_var.data = 0.5 + torch.rand(mod.running_var.shape, generator=g)
    return model.eval()


# ----------------------------------------------------------------------------- CNN
def conv_bn(cin, cout, k=1, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act] if act is not None else []))


class HandHardswish(nn.Module):
    def forward(self, x):  # decomposed hardswish, as written in many repos
        return x * F.relu6(x + 3) / 6


class SqueezeExcite(nn.Module):  # torchvision.ops.SqueezeExcitation, MobileNetV3 style
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return s * x


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.ReLU())  # 32 -> 16
        self.expand = conv_bn(16, 32, act=nn.ReLU6())
        self.dw = conv_bn(32, 32, 3, groups=32, act=nn.Hardswish())
        self.se = SqueezeExcite(32)
        self.project = conv_bn(32, 16)
        self.down = conv_bn(16, 24, 3, 2, act=HandHardswish())  # 16 -> 8
        self.c_silu = conv_bn(24, 24, act=nn.SiLU())
        self.c_sigmoid = conv_bn(24, 24, 3, act=nn.Sigmoid())
        self.c_leaky = conv_bn(24, 32, act=nn.LeakyReLU(0.1))
        self.c_hsig = conv_bn(32, 32, 3, groups=32, act=nn.Hardsigmoid())
        self.head = conv_bn(32, 64, act=nn.ReLU())
        self.classifier = nn.Linear(64, 10)

    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        x = x + self.project(self.se(self.dw(self.expand(x))))  # inverted residual
        x = self.c_leaky(self.c_sigmoid(self.c_silu(self.down(x))))
        x = self.head(self.c_hsig(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


# ----------------------------------------------------------------------------- BERT
class BertLayer(nn.Module):  # BertSelfAttention(eager) + BertSelfOutput + BertIntermediate + BertOutput
    def __init__(self, hidden, heads, inter, eps):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out, self.attn_ln = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=eps)
        self.inter, self.out = nn.Linear(hidden, inter), nn.Linear(inter, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=eps)

    def heads(self, x):  # transpose_for_scores
        return x.view(x.size()[:-1] + (self.h, self.d)).permute(0, 2, 1, 3)

    def forward(self, x, ext_mask):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + ext_mask
        ctx = torch.matmul(F.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size()[:-2] + (self.h * self.d,))
        x = self.attn_ln(self.attn_out(ctx) + x)
        return self.out_ln(self.out(F.gelu(self.inter(x))) + x)


class TinyBert(nn.Module):
    def __init__(self, vocab=128, hidden=64, layers=2, heads=4, inter=128, max_pos=64, eps=1e-12):
        super().__init__()
        self.word, self.pos, self.tok_type = nn.Embedding(vocab, hidden), nn.Embedding(max_pos, hidden), nn.Embedding(2, hidden)
        self.emb_ln = nn.LayerNorm(hidden, eps=eps)
        self.register_buffer("position_ids", torch.arange(max_pos).expand(1, -1), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, max_pos, dtype=torch.long), persistent=False)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, inter, eps) for _ in range(layers))

    def forward(self, input_ids, attention_mask):
        bsz, seq = input_ids.size()
        tt = self.token_type_ids[:, :seq].expand(bsz, seq)
        x = self.word(input_ids) + self.tok_type(tt) + self.pos(self.position_ids[:, :seq])
        x = self.emb_ln(x)
        ext = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * MIN
        for layer in self.layers:
            x = layer(x, ext)
        return x


# ----------------------------------------------------------------------------- GPT-2
class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D: a Linear with transposed weight (addmm)
    def __init__(self, nf, nx):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(nx, nf) * 0.1), nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Block(nn.Module):
    def __init__(self, hidden, heads, inter, max_pos, eps=1e-5):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.c_attn, self.c_proj = Conv1D(3 * hidden, hidden), Conv1D(hidden, hidden)
        self.c_fc, self.mlp_proj = Conv1D(inter, hidden), Conv1D(hidden, inter)
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)).view(1, 1, max_pos, max_pos), persistent=False)

    def split_heads(self, x):
        return x.view(x.size()[:-1] + (self.h, self.d)).permute(0, 2, 1, 3)

    def forward(self, x, pad_mask, past_k, past_v):
        residual = x
        q, k, v = self.c_attn(self.ln_1(x)).split(self.h * self.d, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        q_len, k_len = q.size(-2), k.size(-2)
        causal = self.bias[:, :, k_len - q_len : k_len, :k_len]
        w = torch.where(causal, w, torch.full([], MIN, dtype=w.dtype)) + pad_mask
        a = torch.matmul(F.softmax(w, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size()[:-2] + (self.h * self.d,))
        x = self.c_proj(a) + residual
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))  # NewGELU
        return x + self.mlp_proj(h), k, v


class TinyGPT2(nn.Module):
    def __init__(self, vocab=128, hidden=64, layers=2, heads=4, inter=128, max_pos=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(max_pos, hidden)
        self.blocks = nn.ModuleList(GPT2Block(hidden, heads, inter, max_pos) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.wte(input_ids) + self.wpe(position_ids)
        pad = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MIN
        presents = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, pad, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.lm_head(self.ln_f(x)), *presents)


# ----------------------------------------------------------------------------- Llama
class RMSNorm(nn.Module):  # LlamaRMSNorm
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, inter):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.d, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.o_proj = nn.Linear(heads * self.d, hidden, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden), RMSNorm(hidden)

    def repeat_kv(self, x):
        b, n, slen, d = x.shape
        rep = self.h // self.kvh
        return x[:, :, None, :, :].expand(b, n, rep, slen, d).reshape(b, n * rep, slen, d)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        residual, h = x, self.input_layernorm(x)
        shape = (*h.shape[:-1], -1, self.d)
        q = self.q_proj(h).view(shape).transpose(1, 2)
        k = self.k_proj(h).view(shape).transpose(1, 2)
        v = self.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2)
        w = torch.matmul(q, self.repeat_kv(k).transpose(2, 3)) * self.d**-0.5 + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(w, self.repeat_kv(v)).transpose(1, 2).contiguous()
        x = residual + self.o_proj(a.reshape(*x.shape[:-1], -1).contiguous())
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), k, v


class TinyLlama(nn.Module):
    def __init__(self, vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, theta=10000.0):
        super().__init__()
        d = hidden // heads
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(LlamaLayer(hidden, heads, kv_heads, inter) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.embed_tokens(input_ids)
        # LlamaRotaryEmbedding
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        # causal + padding mask, additive (0 / finfo.min) like HF's eager mask
        q_len, past_len = input_ids.shape[1], past[0].shape[2]
        q_pos = torch.arange(past_len, past_len + q_len)[:, None]
        k_pos = torch.arange(past_len + q_len)[None, :]
        allowed = (k_pos <= q_pos)[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.where(allowed, torch.tensor(0.0), torch.tensor(MIN))
        presents = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.lm_head(self.norm(x)), *presents)


# ----------------------------------------------------------------------------- export / check
def io_spec(inputs, outputs):
    return {"inputs": [dict(name=n, dtype=t, shape=s) for n, t, s in inputs],
            "outputs": [dict(name=n, dtype=t, shape=s) for n, t, s in outputs]}


def export(model, args, name, exporter, opset, spec, optimize):
    path = HERE / f"{name}_{exporter}.onnx"
    in_names, out_names = [i["name"] for i in spec["inputs"]], [o["name"] for o in spec["outputs"]]
    if exporter == "ts":
        axes = {io["name"]: {ax: d for ax, d in enumerate(io["shape"]) if isinstance(d, str)}
                for io in spec["inputs"] + spec["outputs"]}
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset, input_names=in_names,
                          output_names=out_names, dynamic_axes=axes, training=torch.onnx.TrainingMode.EVAL,
                          do_constant_folding=name != "cnn")  # keep BatchNormalization nodes in the CNN
    else:
        dyn = tuple({ax: torch.export.Dim.DYNAMIC for ax, d in enumerate(i["shape"]) if isinstance(d, str)}
                    for i in spec["inputs"])
        n = model.forward.__code__.co_argcount - 1  # named positional args; the rest is *past
        dyn = dyn if len(dyn) == n else (*dyn[:n], dyn[n:])
        prog = torch.onnx.export(model, args, dynamo=True, opset_version=opset, input_names=in_names,
                                 output_names=out_names, dynamic_shapes=dyn, optimize=optimize)
        prog.save(str(path), external_data=False)
    m = onnx.load(str(path))
    m.ir_version = min(m.ir_version, MAX_IR_VERSION)
    for node in m.graph.node:  # for reproducible bytes: drop stack traces (local paths) and object addresses
        keep = [(p.key, re.sub(r" at 0x[0-9a-f]+", "", p.value)) for p in node.metadata_props
                if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        for k, v in keep:
            node.metadata_props.add(key=k, value=v)
    rename_dims(m, spec)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(path))
    return path, m


def rename_dims(m, spec):
    """Give graph inputs/outputs the symbolic dim names of `spec` (dynamo names them s0, s1, ...)."""
    mapping = {}
    ios = {v.name: v for v in list(m.graph.input) + list(m.graph.output)}
    for io in spec["inputs"] + spec["outputs"]:
        dims = ios[io["name"]].type.tensor_type.shape.dim
        assert len(dims) == len(io["shape"]), (io, dims)
        for d, want in zip(dims, io["shape"]):
            if isinstance(want, str):
                if d.dim_param and d.dim_param != want:
                    mapping.setdefault(d.dim_param, want)
                d.dim_param = want
            else:
                assert d.dim_value == want, (io["name"], d, want)
    if mapping:  # keep intermediate value_info consistent (whole-token replacement)
        pat = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
        for vi in m.graph.value_info:
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param:
                    d.dim_param = pat.sub(lambda mo: mapping[mo.group(1)], d.dim_param)


# Ops each fixture must contain (the unfused patterns the optimizer is tested on) / must not contain.
REQUIRED = {
    "cnn": {"Conv", "BatchNormalization", "Relu", "Clip", "HardSwish", "Div", "Sigmoid", "LeakyRelu", "HardSigmoid", "Add"},
    "bert": {"MatMul", "Softmax", "Erf"}, "bert_ts": {"ReduceMean", "Sub", "Pow", "Sqrt", "Div"},
    "gpt2": {"Gemm", "Split", "Where", "Softmax", "Tanh", "Pow", "LayerNormalization"},
    "llama": {"Cos", "Sin", "Neg", "Expand", "Sigmoid", "Pow", "ReduceMean", "Sqrt", "Softmax"},
}
FORBIDDEN = {"Gelu", "FastGelu", "Attention", "MultiHeadAttention", "GroupQueryAttention", "SkipLayerNormalization",
             "RMSNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding"}


def check_ops(name, exporter, hist):
    missing = (REQUIRED[name] | REQUIRED.get(f"{name}_{exporter}", set())) - set(hist)
    bad = (FORBIDDEN | ({"LayerNormalization"} if (name, exporter) == ("bert", "ts") else set())) & set(hist)
    if missing or bad:
        raise RuntimeError(f"{name}_{exporter}: missing ops {sorted(missing)}, unexpected fused ops {sorted(bad)}")


def check(path, model, cases):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    worst = 0.0
    for case in cases:
        with torch.no_grad():
            ref = model(*case)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = sess.run(None, {n: t.numpy() for n, t in zip(names, case)})
        for r, g in zip(ref, got, strict=True):
            assert r.shape == g.shape, (path.name, r.shape, g.shape)
            worst = max(worst, float(np.abs(r.numpy() - g).max()) if r.numel() else 0.0)
    if not worst < TOL:
        raise RuntimeError(f"{path.name}: ORT vs torch max abs diff {worst:.3g} >= {TOL}")
    return worst


# ----------------------------------------------------------------------------- per-model drivers
def cnn_cases():
    spec = io_spec([("pixel_values", "float32", [B, 3, 32, 32])], [("logits", "float32", [B, 10])])
    return TinyCNN(), spec, (torch.randn(2, 3, 32, 32),), [(torch.randn(b, 3, 32, 32),) for b in (1, 3)], {}


def bert_cases():
    spec = io_spec([("input_ids", "int64", [B, S]), ("attention_mask", "int64", [B, S])],
                   [("last_hidden_state", "float32", [B, S, 64])])
    padded = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    cases = [(torch.randint(0, 128, (2, 7)), padded), (torch.randint(0, 128, (1, 5)), torch.ones(1, 5, dtype=torch.long))]
    return TinyBert(), spec, (torch.randint(0, 128, (2, 6)), torch.ones(2, 6, dtype=torch.long)), cases, {}


def decoder_cases(model, layers, kv_heads, head_dim, heads, vocab=128):
    kv = [B, kv_heads, P, head_dim]
    spec = io_spec([("input_ids", "int64", [B, S]), ("attention_mask", "int64", [B, T]), ("position_ids", "int64", [B, S])]
                   + [(f"past_key_values.{i}.{kind}", "float32", kv) for i in range(layers) for kind in ("key", "value")],
                   [("logits", "float32", [B, S, vocab])]
                   + [(f"present.{i}.{kind}", "float32", [B, kv_heads, T, head_dim]) for i in range(layers) for kind in ("key", "value")])

    def inputs(b, s, p, left_pad=0):
        mask = torch.ones(b, p + s, dtype=torch.long)
        mask[1:, :left_pad] = 0  # rows >= 1 are left-padded
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, p:]  # as HF generate() computes position_ids
        past = [torch.randn(b, kv_heads, p, head_dim) for _ in range(2 * layers)]
        return (torch.randint(0, vocab, (b, s)), mask, pos, *past)

    cases = [inputs(1, 4, 0), inputs(2, 5, 0, left_pad=2), inputs(1, 3, 5), inputs(2, 3, 5, left_pad=3), inputs(2, 1, 7, left_pad=2)]
    meta = dict(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab)
    return model, spec, inputs(2, 3, 5), cases, meta


# name: (builder, TorchScript opset, dynamo opset, dynamo optimize).  optimize=True (torch's default) runs
# onnxscript's optimizer: for the transformers it only folds constants / drops redundant Reshape/Cast/Identity,
# but for the CNN it folds BatchNormalization into Conv, so the CNN uses the raw optimize=False graph.
MODELS = {
    "cnn": (cnn_cases, 17, 18, False),
    "bert": (bert_cases, 14, 18, True),
    "gpt2": (lambda: decoder_cases(TinyGPT2(), 2, 4, 16, 4), 17, 18, True),
    "llama": (lambda: decoder_cases(TinyLlama(), 2, 2, 16, 4), 17, 18, True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--only", nargs="*", choices=list(MODELS), help="subset of models to (re)build")
    opts = ap.parse_args()
    meta_path, rows = HERE / "fixtures.json", []
    entries = {e["name"]: e for e in json.loads(meta_path.read_text())} if meta_path.exists() else {}
    for name in opts.only or MODELS:
        builder, ts_opset, dy_opset, optimize = MODELS[name]
        for exporter, opset in (("ts", ts_opset), ("dynamo", dy_opset)):
            torch.manual_seed(0)
            model, spec, example, cases, meta = builder()
            perturb_norms(model)
            path, m = export(model, example, name, exporter, opset, spec, optimize)
            diff = check(path, model, cases)
            hist = Counter(n.op_type for n in m.graph.node)
            check_ops(name, exporter, hist)
            print(f"\n{path.name}: " + ", ".join(f"{k}={v}" for k, v in hist.most_common()))
            entries[path.name] = dict(name=path.name, model=name, exporter=exporter, opset=opset,
                                      ir_version=m.ir_version, num_nodes=len(m.graph.node), **spec, **meta,
                                      op_histogram=dict(sorted(hist.items())))
            rows.append((path.name, exporter, opset, len(m.graph.node), path.stat().st_size / 1024, diff))
    meta_path.write_text(json.dumps(sorted(entries.values(), key=lambda e: e["name"]), indent=1) + "\n")
    print(f"\n{'file':<20} {'exporter':<8} {'opset':>5} {'nodes':>6} {'KB':>7} {'max diff':>10}")
    for f, e, o, n, kb, d in rows:
        print(f"{f:<20} {e:<8} {o:>5} {n:>6} {kb:>7.1f} {d:>10.2e}")


if __name__ == "__main__":
    main()
