"""Tiny random-weight transformers models whose attention adds a relative-position term to the
scores (DeBERTa-v2/v3 disentangled attention, SEW-D, WavLM's gated bias, T5's bucketed bias, MPNet,
Funnel), exported with TorchScript (opset 17) and dynamo (opset 18), each through
`infc optimize --verify`: nodes before and after, fused MultiHeadAttention against the model's
Softmax count, the largest relative difference from onnxruntime, and the attention rule's reasons.
Needs torch, transformers and onnxscript (not infc dependencies); writes ts_NAME.onnx / d_NAME.onnx
and their .opt.onnx in the current folder.

    python scripts/sweep_relattn_encoders.py [--exporter ts|dynamo|both] [--wide] [--no-optimize] [NAME ...]

--wide: 4 layers of hidden 256 (for timing against onnxruntime) instead of 2 of 64; files get a _w suffix.
"""
import argparse, json, subprocess, sys, warnings, torch, onnx, transformers as T

warnings.filterwarnings("ignore")
WIDE = "--wide" in sys.argv
HIDDEN, LAYERS = (256, 4) if WIDE else (64, 2)
small = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=2 * HIDDEN)
speech = dict(small, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
              num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
deberta_v3 = dict(small, vocab_size=100, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                  norm_rel_ebd="layer_norm", share_att_key=True, max_relative_positions=-1)
t5 = dict(vocab_size=100, d_model=HIDDEN, d_kv=HIDDEN // 4, d_ff=2 * HIDDEN, num_layers=LAYERS, num_heads=4,
          decoder_start_token_id=0)
text = lambda s=12: {"input_ids": torch.randint(0, 90, (2, s)), "attention_mask": torch.ones(2, s, dtype=torch.long)}
text_dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
audio = lambda: {"input_values": torch.randn(2, 4000)}
audio_dyn = {"input_values": {0: "batch", 1: "len"}}
seq2seq = lambda: {**text(), "decoder_input_ids": torch.randint(0, 90, (2, 5))}
seq2seq_dyn = {**text_dyn, "decoder_input_ids": {0: "batch", 1: "dec_seq"}}


class T5Decoder(torch.nn.Module):  # the decoder alone, as Optimum exports it (no past)
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask):
        return self.model.decoder(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states,
                                  encoder_attention_mask=encoder_attention_mask, use_cache=False).last_hidden_state


class T5Whole(torch.nn.Module):  # encoder and decoder in one graph: the decoder's last hidden state
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                          use_cache=False).last_hidden_state


class T5DecoderWithPast(torch.nn.Module):  # one decoding step over self- and cross-attention past, as Optimum's
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, *past):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
        layers = self.model.config.num_layers
        self_cache, cross_cache = DynamicCache(config=self.model.config), DynamicCache(config=self.model.config)
        for i in range(layers):
            self_cache.update(past[4 * i], past[4 * i + 1], i)
            cross_cache.update(past[4 * i + 2], past[4 * i + 3], i)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        out = self.model.decoder(input_ids=input_ids, encoder_hidden_states=past[2].transpose(1, 2).flatten(2),
                                 encoder_attention_mask=encoder_attention_mask, past_key_values=cache, use_cache=True)
        return out.last_hidden_state


def _past_inputs(past_len=6, enc_len=12):
    feeds = {"input_ids": torch.randint(0, 90, (2, 1)), "encoder_attention_mask": torch.ones(2, enc_len, dtype=torch.long)}
    for i in range(LAYERS):
        for kind, length in (("decoder", past_len), ("decoder", past_len), ("encoder", enc_len), ("encoder", enc_len)):
            name = f"past_key_values.{i}.{kind}.{'key' if len([k for k in feeds if f'.{i}.{kind}' in k]) == 0 else 'value'}"
            feeds[name] = torch.randn(2, 4, length, HIDDEN // 4)
    return feeds


def _past_dynamic():
    dyn = {"input_ids": {0: "batch"}, "encoder_attention_mask": {0: "batch", 1: "enc_seq"}}
    for name in _past_inputs():
        if name.startswith("past"):
            dyn[name] = {0: "batch", 2: "past_seq" if ".decoder." in name else "enc_seq"}
    return dyn


CASES = {
    "deberta_v2": (lambda: T.DebertaV2Model(T.DebertaV2Config(vocab_size=100, **small)), text, text_dyn),
    "deberta_v2_rel": (lambda: T.DebertaV2Model(T.DebertaV2Config(**dict(deberta_v3, position_buckets=-1, share_att_key=False,
                                                                          norm_rel_ebd="none", max_relative_positions=32))),
                       text, text_dyn),
    "deberta_v3": (lambda: T.DebertaV2Model(T.DebertaV2Config(**deberta_v3)), text, text_dyn),
    "sew_d": (lambda: T.SEWDModel(T.SEWDConfig(**dict(speech, squeeze_factor=2, position_buckets=256, max_position_embeddings=512))),
              audio, audio_dyn),
    "wavlm": (lambda: T.WavLMModel(T.WavLMConfig(**speech)), audio, audio_dyn),
    "t5_enc": (lambda: T.T5EncoderModel(T.T5Config(**t5)), text, text_dyn),
    "t5_dec": (lambda: T5Decoder(T.T5Model(T.T5Config(**t5))),
               lambda: {"input_ids": torch.randint(0, 90, (2, 5)), "encoder_hidden_states": torch.randn(2, 12, HIDDEN),
                        "encoder_attention_mask": torch.ones(2, 12, dtype=torch.long)},
               {"input_ids": {0: "batch", 1: "dec_seq"}, "encoder_hidden_states": {0: "batch", 1: "seq"},
                "encoder_attention_mask": {0: "batch", 1: "seq"}}),
    "t5_dec_past": (lambda: T5DecoderWithPast(T.T5Model(T.T5Config(**t5))), _past_inputs, _past_dynamic()),
    "t5": (lambda: T5Whole(T.T5Model(T.T5Config(**t5))), seq2seq, seq2seq_dyn),
    "mpnet": (lambda: T.MPNetModel(T.MPNetConfig(vocab_size=100, **small)), text, text_dyn),
    "funnel": (lambda: T.FunnelBaseModel(T.FunnelConfig(vocab_size=100, block_sizes=[1, 1], d_model=HIDDEN, n_head=4,
                                                        d_head=HIDDEN // 4, d_inner=2 * HIDDEN)), text, text_dyn),
}


def export(name: str, exporter: str) -> str:
    make, inputs, dyn = CASES[name]
    torch.manual_seed(0)
    model, kw = make().eval(), inputs()
    path = f"{'d' if exporter == 'dynamo' else 'ts'}_{name}{'_w' if WIDE else ''}.onnx"
    with torch.no_grad():
        if exporter == "dynamo":
            torch.onnx.export(model, (), path, kwargs=kw, input_names=list(kw), dynamic_axes=dyn, dynamo=True, opset_version=18)
        else:
            torch.onnx.export(model, tuple(kw.values()), path, input_names=list(kw), dynamic_axes=dyn, dynamo=False,
                              opset_version=17)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exporter", choices=("ts", "dynamo", "both"), default="both")
    ap.add_argument("--wide", action="store_true")
    ap.add_argument("--no-optimize", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    for name in args.names or list(CASES):
        for exporter in ("ts", "dynamo") if args.exporter == "both" else (args.exporter,):
            try:
                path = export(name, exporter)
            except Exception as e:
                print(name, exporter, "EXPORT FAIL", str(e).splitlines()[0][:150], flush=True)
                continue
            if args.no_optimize:
                print(name, exporter, "exported", path, flush=True)
                continue
            softmaxes = sum(n.op_type == "Softmax" for n in onnx.load(path).graph.node)
            out = path.replace(".onnx", ".opt.onnx")
            r = subprocess.run(["infc", "optimize", path, "-o", out, "--verify", "--json"], capture_output=True, text=True)
            if r.returncode:
                print(name, exporter, "OPT FAIL", (r.stderr.strip().splitlines() or ["?"])[-1][:200], flush=True)
                continue
            j = json.loads(r.stdout)
            rej = {k: v["rejected"] for k, v in j["rules"].items() if k == "attention_mha" and v["rejected"]}
            print(name, exporter, j["nodes_before"], "->", j["nodes_after"],
                  f'MHA {j["ops_after"].get("com.microsoft.MultiHeadAttention", 0)}/{softmaxes}',
                  "SkipLN", j["ops_after"].get("com.microsoft.SkipLayerNormalization", 0),
                  "rel", f'{j["max_rel_diff"]:.1e}', rej or "", flush=True)


if __name__ == "__main__":
    main()
