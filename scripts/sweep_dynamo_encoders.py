"""Tiny random-weight transformers encoders exported with torch's dynamo exporter (torch.onnx.export's
default since torch 2.9), each through `infc optimize --verify`: nodes before and after, fused
MultiHeadAttention and SkipLayerNormalization counts, the largest relative difference from
onnxruntime, and the attention rule's rejections. Needs torch, transformers and onnxscript (not infc
dependencies); writes d_NAME.onnx and d_NAME.opt.onnx in the current folder.

    python scripts/sweep_dynamo_encoders.py [NAME ...]
"""
import sys, json, collections, subprocess, torch, transformers as T
torch.manual_seed(0)
small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
text = lambda: {"input_ids": torch.randint(0, 90, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
text_dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
img = lambda s=32: {"pixel_values": torch.randn(2, 3, s, s)}
img_dyn = {"pixel_values": {0: "batch"}}
CASES = {
  "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128)), text, text_dyn),
  "roberta": (lambda: T.RobertaModel(T.RobertaConfig(vocab_size=100, **small)), text, text_dyn),
  "xlmr": (lambda: T.XLMRobertaModel(T.XLMRobertaConfig(vocab_size=100, **small)), text, text_dyn),
  "albert": (lambda: T.AlbertModel(T.AlbertConfig(vocab_size=100, embedding_size=32, **small)), text, text_dyn),
  "electra": (lambda: T.ElectraModel(T.ElectraConfig(vocab_size=100, embedding_size=32, **small)), text, text_dyn),
  "mpnet": (lambda: T.MPNetModel(T.MPNetConfig(vocab_size=100, **small)), text, text_dyn),
  "deberta_v2": (lambda: T.DebertaV2Model(T.DebertaV2Config(vocab_size=100, **small)), text, text_dyn),
  "modernbert": (lambda: T.ModernBertModel(T.ModernBertConfig(vocab_size=100, pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)), text, text_dyn),
  "t5_enc": (lambda: T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)), text, text_dyn),
  "gpt2": (lambda: T.GPT2Model(T.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64)), text, text_dyn),
  "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32,32,32), conv_stride=(5,2,2), conv_kernel=(10,3,3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)), lambda: {"input_values": torch.randn(2, 4000)}, {"input_values": {0: "batch", 1: "len"}}),
  "hubert": (lambda: T.HubertModel(T.HubertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32,32,32), conv_stride=(5,2,2), conv_kernel=(10,3,3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)), lambda: {"input_values": torch.randn(2, 4000)}, {"input_values": {0: "batch", 1: "len"}}),
  "wavlm": (lambda: T.WavLMModel(T.WavLMConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32,32,32), conv_stride=(5,2,2), conv_kernel=(10,3,3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)), lambda: {"input_values": torch.randn(2, 4000)}, {"input_values": {0: "batch", 1: "len"}}),
  "vit": (lambda: T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **small)), img, img_dyn),
  "deit": (lambda: T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **small)), img, img_dyn),
  "clip_vision": (lambda: T.CLIPVisionModel(T.CLIPVisionConfig(image_size=32, patch_size=8, **small)), img, img_dyn),
  "dinov2": (lambda: T.Dinov2Model(T.Dinov2Config(image_size=32, patch_size=8, **small)), img, img_dyn),
  "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)), img, img_dyn),
  "whisper_enc": (lambda: T.WhisperModel(T.WhisperConfig(vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=20)).encoder, lambda: {"input_features": torch.randn(2, 16, 40)}, {"input_features": {0: "batch"}}),
}
names = sys.argv[1:] or list(CASES)
for name in names:
    make, inputs, dyn = CASES[name]
    try:
        m = make().eval(); kw = inputs()
        with torch.no_grad():
            torch.onnx.export(m, (), f"d_{name}.onnx", kwargs=kw, input_names=list(kw), dynamic_axes=dyn, dynamo=True, opset_version=18)
    except Exception as e:
        print(name, "EXPORT FAIL", str(e).splitlines()[0][:150]); continue
    r = subprocess.run(["infc", "optimize", f"d_{name}.onnx", "-o", f"d_{name}.opt.onnx", "--verify", "--json"], capture_output=True, text=True)
    if r.returncode:
        print(name, "OPT FAIL", r.stderr.strip().splitlines()[-1][:200]); continue
    j = json.loads(r.stdout)
    rej = {k: v["rejected"] for k, v in j["rules"].items() if k == "attention_mha" and v["rejected"]}
    print(name, j["nodes_before"], "->", j["nodes_after"], "MHA", j["ops_after"].get("com.microsoft.MultiHeadAttention", 0),
          "SkipLN", j["ops_after"].get("com.microsoft.SkipLayerNormalization", 0), "rel", f'{j["max_rel_diff"]:.1e}', rej, flush=True)
