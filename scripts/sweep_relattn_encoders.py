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
    "t5": (lambda: T.T5Model(T.T5Config(**t5)), seq2seq, seq2seq_dyn),
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
