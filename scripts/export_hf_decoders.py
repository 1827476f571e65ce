#!/usr/bin/env python
"""Export tiny random-weight Hugging Face decoders the way people export real ones, for `infc build`.

    pip install torch transformers onnxscript          # optional deps: this script only
    python scripts/export_hf_decoders.py [--models qwen2,llama] [--exporters ts,dynamo,optimum] [--out DIR] [--set FIELD=JSON ...]

Each architecture (CONFIGS: Llama to Gemma 2, Falcon, OPT, GPT-J, the ALiBi of Bloom and MPT; then transformers 5.24's
newer families: gpt-oss's sinks, DeepSeek's latent attention, MoE routing forms, and recurrent hybrids infc must refuse)
is its transformers class built from a small config (2 layers, hidden 64, vocab 256; no download), with seeded random weights, exported by:

  ts       torch.onnx.export (TorchScript exporter, opset 17) of a wrapper taking the past key/values
           as flat inputs past_key_values.{i}.key/value and returning present.{i}.key/value
  dynamo   the same wrapper through torch.onnx.export(dynamo=True) (opset 18, the default)
  dynamo23 the same at opset 23, where SDPA exports as the ONNX Attention op
  optimum  optimum.exporters.onnx.main_export(task="text-generation-with-past"); optimum-onnx pins
           transformers < 4.58, so run this one from an environment that has it
  optimum_merged  Optimum's decoder_model_merged.onnx: no-past and with-past decoders in one If on
           use_cache_branch (optimum.onnx.merge_decoders), as transformers.js repos ship them
  ts_nocache  the TorchScript exporter on the model without a KV cache (input_ids, attention_mask,
           position_ids -> logits of every position)

With --attn eager the models use transformers' eager attention instead of SDPA (folder suffix _eager);
classes without SDPA (Gemma 2: its soft-cap) always export eager. Written for transformers 5
(`rope_parameters`; MoE experts export through experts_implementation="batched_mm"); some combinations do not
export (cohere ts, mpt dynamo, falcon dynamo23; with transformers 5.24: glm/glm4/cohere2/ernie4_5/helium ts ("All tensors
must have the same rank"), llama4 and deepseek_v2 either way (complex rotary: aten::polar), apertus ts (expm1),
jetmoe/dbrx ts, gemma4, qwen3_5/qwen3_next (linalg_solve_triangular); recurrent models only as ts_nocache).
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
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM

COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
NO_GQA = ("num_key_value_heads",)  # architectures whose config has no grouped KV heads
GPT2_NAMES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "max_position_embeddings", "pad_token_id")  # configs that name them n_embd, n_layer, n_head, ...
GPT2_SIZES = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "n_positions": 512}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# name: (model_type, the config fields that differ from COMMON, COMMON keys the config does not take).
# The mix covers GQA and MQA, q/k/v biases, tied embeddings, fused projections (per-head interleaved
# too), partial rotary, learned position tables (with an offset), q/k norms, parallel residuals,
# scalar multipliers, logit soft-capping, rope scaling, sliding windows, ALiBi; and masks infc must refuse.
CONFIGS = {
    "qwen2": ("qwen2", {"tie_word_embeddings": False, "use_sliding_window": False}, ()),
    "llama": ("llama", {"tie_word_embeddings": True}, ()),  # SmolLM / TinyLlama shape
    "llama3_rope": ("llama", {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": False}, ()),  # Llama 3.x
    # rotary frequencies picked by the step's longest position (past original_max: the long ones):
    # Phi-3.5-mini, Phi-4-mini (longrope); dynamic NTK scaling
    "phi3_longrope": ("phi3", {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 64, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0], "long_factor": [1.0, 1.5, 2.5, 4.0, 8.0, 16.0]}}, ()),
    # (dynamic NTK does not export through dynamo; TorchScript traces the frequencies of the trace's length)
    "llama_dynamic_rope": ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
                                     "max_position_embeddings": 64}, ()),
    "mistral": ("mistral", {"sliding_window": None, "tie_word_embeddings": False}, ()),
    # a sliding window shorter than any useful max_model_len: infc must page it, not drop it
    "mistral_window": ("mistral", {"sliding_window": 24, "tie_word_embeddings": False}, ()),
    "phi3": ("phi3", {"partial_rotary_factor": 0.75, "tie_word_embeddings": False}, ()),  # Phi-3.5 / Phi-4-mini
    "gpt2": ("gpt2", GPT2_SIZES, GPT2_NAMES),
    # embeddings scaled by sqrt(hidden), RMSNorm as x * (1 + w), GeGLU, an explicit head_dim
    "gemma": ("gemma", {"head_dim": 16, "num_key_value_heads": 1}, ()),
    # + soft-capped attention logits and final logits, query_pre_attn_scalar, pre/post norms, and a
    # sliding window on every other layer (longer than any max_model_len here: plain causal)
    "gemma2": ("gemma2", {"head_dim": 16, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 3.0,
                          "final_logit_softcapping": 5.0, "sliding_window": 4096}, ()),
    "gemma2_window": ("gemma2", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 24}, ()),
    "qwen3": ("qwen3", {"head_dim": 16, "tie_word_embeddings": True}, ()),  # RMSNorm on each head's q and k
    # partial rotary (a quarter of the head), q/k/v biases
    "stablelm": ("stablelm", {"partial_rotary_factor": 0.25, "use_qkv_bias": True}, ()),
    # Pythia: fused QKV laid out per head, partial rotary, parallel residual, biases
    "gpt_neox": ("gpt_neox", {"partial_rotary_factor": 0.25, "use_parallel_residual": True,
                              "tie_word_embeddings": False}, NO_GQA),
    # phi-2: parallel attention and MLP off one LayerNorm, half rotary, gelu_new, biases
    "phi": ("phi", {"partial_rotary_factor": 0.5, "num_key_value_heads": 4}, ()),
    # learned positions read at position_ids + 2, ReLU MLP, biases everywhere
    "opt": ("opt", {"ffn_dim": 128, "word_embed_proj_dim": 64, "pad_token_id": 1}, NO_GQA + ("intermediate_size",)),
    # falcon-7b: one KV head (multi-query), fused QKV, parallel attention
    "falcon": ("falcon", {"num_kv_heads": 1, "multi_query": True, "parallel_attn": True, "ffn_hidden_size": 128,
                          "alibi": False, "new_decoder_architecture": False}, NO_GQA + ("intermediate_size",)),
    # ALiBi positions, paged with their slopes: Bloom's on (B*N)-row baddbmm scores, MPT's sliced from
    # a max_seq_len table (falcon-rw's alibi=True does not export: its bfloat16 slopes become complex
    # numbers in onnxruntime)
    "bloom": ("bloom", {"n_head": 4, "n_layer": 2}, GPT2_NAMES),
    "mpt": ("mpt", {"d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": 512}, GPT2_NAMES),
    "olmo": ("olmo", {"clip_qkv": 8.0}, ()),  # LayerNorm without weights, clamped q/k/v
    "olmo2": ("olmo2", {}, ()),  # RMSNorm over all heads' q and k, norms after attention and MLP
    # granite-3: embedding, attention, residual and logit multipliers instead of the usual constants
    "granite": ("granite", {"embedding_multiplier": 12.0, "attention_multiplier": 0.2, "residual_multiplier": 0.22,
                            "logits_scaling": 8.0}, ()),
    "starcoder2": ("starcoder2", {"sliding_window": None, "use_bias": True}, ()),  # LayerNorm, biases, GQA
    # interleaved partial rotary (every other channel pair) and parallel residual; codegen's fused
    # QKV is split in 4 model-parallel groups
    "gptj": ("gptj", {**GPT2_SIZES, "rotary_dim": 8}, GPT2_NAMES),
    "codegen": ("codegen", {**GPT2_SIZES, "rotary_dim": 8}, GPT2_NAMES),
    "gpt_bigcode": ("gpt_bigcode", {**GPT2_SIZES, "multi_query": True}, GPT2_NAMES),  # StarCoder 1: MQA, fused KV
    # local attention on every other layer, windowed at 512 (beyond max_model_len here); unscaled scores
    "gpt_neo": ("gpt_neo", {"num_layers": 2, "num_heads": 4, "attention_types": [[["global", "local"], 1]],
                            "window_size": 512}, ("num_hidden_layers", "num_attention_heads", "num_key_value_heads")),
    "cohere": ("cohere", {"logit_scale": 0.25}, ()),  # interleaved rotary, parallel block, LayerNorm without bias
    # q/k norms, sliding layers (window beyond max_model_len) with their own rope base
    "gemma3": ("gemma3_text", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4096}, ()),
    "gemma3_window": ("gemma3_text", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 32}, ()),
    "smollm3": ("smollm3", {"no_rope_layer_interval": 2}, ()),  # every other layer without rotary (NoPE)
    "nemotron": ("nemotron", {"head_dim": 16, "partial_rotary_factor": 0.5}, ()),  # relu^2, LayerNorm1P
    "persimmon": ("persimmon", {"partial_rotary_factor": 0.5, "qk_layernorm": True}, NO_GQA),
    # mixture of experts (top-2 of 4); transformers 5's experts do not export (histc, grouped MMs): run
    # these from transformers 4.x, whose Mixtral also slices its rotary tables to past + new tokens
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False}, ()),
    "qwen2_moe": ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                "shared_expert_intermediate_size": 64, "tie_word_embeddings": False}, ()),
    # --- newer families (transformers 5.24; sweep-newdec). MoE experts export through
    # experts_implementation="batched_mm" (each token's top-k expert weights gathered, then batched MMs).
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                "norm_topk_prob": True}, ()),
    "olmoe": ("olmoe", {"num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": 8.0}, ()),
    "granitemoe": ("granitemoe", {"num_local_experts": 4, "num_experts_per_tok": 2, "embedding_multiplier": 12.0,
                                  "attention_multiplier": 0.2, "residual_multiplier": 0.22, "logits_scaling": 8.0}, ()),
    "granitemoeshared": ("granitemoeshared", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                              "shared_intermediate_size": 64}, ()),
    "phimoe": ("phimoe", {"num_local_experts": 4, "num_experts_per_tok": 2}, ()),
    "jetmoe": ("jetmoe", {"num_local_experts": 4, "num_experts_per_tok": 2, "kv_channels": 16}, ()),
    "dbrx": ("dbrx", {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 512,
                      "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
                      "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}}, GPT2_NAMES),
    "glm4_moe": ("glm4_moe", {"head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 64, "first_k_dense_replace": 1, "use_qk_norm": True}, ()),
    # MoE every layer, chunked local attention (chunk beyond max_model_len here), NoPE every other
    # layer with query temperature tuning by position, q/k L2 norms
    "llama4": ("llama4_text", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size": 64,
                               "intermediate_size_mlp": 128, "no_rope_layer_interval": 2, "floor_scale": 16,
                               "attention_chunk_size": 8192}, ()),
    "llama4_chunked": ("llama4_text", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                                       "intermediate_size": 64, "intermediate_size_mlp": 128,
                                       "no_rope_layer_interval": 2, "attention_chunk_size": 32}, ()),
    # attention sinks (a learned logit per head in the softmax), biased q/k/v/o, clamped SwiGLU experts,
    # every other layer a sliding window, yarn rope
    "gpt_oss": ("gpt_oss", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                            "sliding_window": 4096}, ()),
    "gpt_oss_window": ("gpt_oss", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                   "intermediate_size": 64, "sliding_window": 24}, ()),
    # multi-head latent attention: q and kv through low-rank projections, rope on a slice of each head
    # (K head 24 = 16 + 8, V head 16), grouped top-k MoE routing after one dense layer
    "deepseek_v3": ("deepseek_v3", {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                                    "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "n_routed_experts": 4,
                                    "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                                    "first_k_dense_replace": 1, "moe_intermediate_size": 64}, ()),
    "deepseek_v2": ("deepseek_v2", {"kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                                    "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "n_routed_experts": 4,
                                    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                                    "moe_intermediate_size": 64, "n_group": 1, "topk_group": 1}, ()),
    "minicpm3": ("minicpm3", {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                              "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "scale_emb": 12,
                              "dim_model_base": 32, "scale_depth": 1.4}, ()),
    "glm4": ("glm4", {"head_dim": 16}, ()),  # interleaved half rotary, post-attention / post-MLP norms
    "glm": ("glm", {"head_dim": 16}, ()),
    "ministral": ("ministral", {"sliding_window": 4096, "head_dim": 16}, ()),
    "ministral3": ("ministral3", {"head_dim": 16}, ()),
    "olmo3": ("olmo3", {"sliding_window": 24}, ()),  # sliding layers and full ones, q/k norms over all heads
    "exaone4": ("exaone4", {"sliding_window": 24, "sliding_window_pattern": 2}, ()),  # NoPE global layers
    "cohere2": ("cohere2", {"head_dim": 16, "sliding_window": 24, "logit_scale": 0.25}, ()),
    "ernie4_5": ("ernie4_5", {"head_dim": 16}, ()),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", {"head_dim": 16}, ()),
    "seed_oss": ("seed_oss", {"head_dim": 16}, ()),
    "helium": ("helium", {"head_dim": 16}, ()),
    "internlm3": ("internlm3", {"head_dim": 16}, ()),
    "arcee": ("arcee", {"head_dim": 16}, ()),  # ReLU^2 MLP without a gate
    "apertus": ("apertus", {"head_dim": 16}, ()),  # xIELU activation, q/k norms
    "bitnet": ("bitnet", {"head_dim": 16}, ()),  # sub-norms inside attention and MLP, relu^2
    "vaultgemma": ("vaultgemma", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4096}, ()),
    "gemma3n": ("gemma3n_text", {"head_dim": 16, "num_hidden_layers": 4, "vocab_size_per_layer_input": 256,
                                 "hidden_size_per_layer_input": 16, "laurel_rank": 8, "num_kv_shared_layers": 2,
                                 "sliding_window": 4096, "altup_num_inputs": 2,
                                 "layer_types": ["sliding_attention", "full_attention"] * 2,
                                 "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]}, ()),
    "gemma4": ("gemma4_text", {"head_dim": 16, "num_hidden_layers": 4, "vocab_size_per_layer_input": 256,
                               "hidden_size_per_layer_input": 16, "sliding_window": 4096,
                               "layer_types": ["sliding_attention", "full_attention"] * 2}, ()),
    # full-attention layers with the sliding ones' head size (Gemma 4's are 512 wide against 256)
    "gemma4_uniform": ("gemma4_text", {"head_dim": 16, "global_head_dim": 16, "num_hidden_layers": 4,
                                       "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16,
                                       "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 2}, ()),
    # recurrent state beside (or instead of) the KV cache: infc must refuse these by name
    "qwen3_5": ("qwen3_5_text", {"head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                 "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                 "layer_types": ["linear_attention", "full_attention"]}, ()),
    "qwen3_next": ("qwen3_next", {"head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                  "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 4,
                                  "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                  "shared_expert_intermediate_size": 64,
                                  "layer_types": ["linear_attention", "full_attention"]}, ()),
    "lfm2": ("lfm2", {"full_attn_idxs": [1], "block_auto_adjust_ff_dim": False}, ()),  # short convolutions
    "mamba": ("mamba", {"state_size": 8, "expand": 2, "conv_kernel": 4}, ("num_attention_heads", "num_key_value_heads")),
    "mamba2": ("mamba2", {"state_size": 8, "head_dim": 16, "num_heads": 8, "n_groups": 1, "expand": 2}, ()),
    "falcon_h1": ("falcon_h1", {"head_dim": 16, "mamba_d_state": 8, "mamba_n_heads": 8, "mamba_d_head": 16,
                                "mamba_n_groups": 1, "mamba_d_ssm": 128}, ()),
    "bamba": ("bamba", {"mamba_d_state": 8, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
                        "attn_layer_indices": [1]}, ()),
    "jamba": ("jamba", {"mamba_d_state": 8, "num_experts": 4, "num_experts_per_tok": 2, "attn_layer_period": 2,
                        "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
                        "use_mamba_kernels": False}, ()),
    "granitemoehybrid": ("granitemoehybrid", {"num_local_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 8,
                                              "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
                                              "layer_types": ["mamba", "attention"]}, ()),
    "zamba2": ("zamba2", {"mamba_d_state": 8, "mamba_headdim": 16, "n_mamba_heads": 8, "num_mem_blocks": 1,
                          "hybrid_layer_ids": [1], "layers_block_type": ["mamba", "hybrid"]}, ()),
    "rwkv": ("rwkv", {"attention_hidden_size": 64, "context_length": 512}, ("num_attention_heads", "num_key_value_heads")),
    "recurrent_gemma": ("recurrent_gemma", {"head_dim": 16, "lru_width": 64, "attention_window_size": 32,
                                            "block_types": ["recurrent", "attention"]}, ()),
    "xlstm": ("xlstm", {"num_heads": 4, "embedding_dim": 64, "num_blocks": 2, "hidden_size": 64}, ()),
    "kimi_linear": ("kimi_linear", {"qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "linear_head_dim": 16,
                                    "linear_num_heads": 4, "kv_lora_rank": 32, "num_experts": 4, "num_experts_per_token": 2,
                                    "moe_intermediate_size": 64, "layer_types": ["linear_attention", "full_attention"],
                                    "mlp_layer_types": ["dense", "sparse"]}, ()),
}
CHECK_TOL = 1e-4
CHECK_TOL_HALF = 2e-2  # a float16 export against the float16 model: half-precision roundings apart


def make_model(arch: str, attn: str = "sdpa", **overrides) -> nn.Module:
    model_type, fields, dropped = CONFIGS[arch]
    common = {k: v for k, v in COMMON.items() if k not in dropped}
    config = AutoConfig.for_model(model_type, **{**common, **fields, **overrides})
    torch.manual_seed(sum(map(ord, arch)))
    if not MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]._supports_sdpa:  # gemma2: eager (its softcap) only
        attn = "eager"
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    # transformers 5's default experts (grouped MMs, histc) do not export; batched MMs do
    experts = {"experts_implementation": "batched_mm"} if model_class._can_set_experts_implementation() else {}
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, **experts).eval()
    with torch.no_grad():  # weights large enough that greedy tokens are decisive, norms not all ones
        for name, p in model.named_parameters():
            is_norm = "norm" in name or "ln_" in name
            p.copy_(torch.randn_like(p) * (0.2 if is_norm else 0.15) + float(is_norm and "weight" in name))
    return model


def kv_shape(model) -> tuple[int, int, int, int]:
    """(layers, KV heads, key head size, value head size), read off the cache of a one-token run: configs
    name them differently (num_key_value_heads, num_kv_heads + multi_query, n_head, head_dim or not);
    multi-head latent attention (DeepSeek, MiniCPM3) caches keys wider than values."""
    with torch.no_grad():
        cache = model(torch.tensor([[1]]), use_cache=True).past_key_values
    pairs = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else \
        [layer[:2] for layer in cache] if isinstance(cache, tuple) else \
        list(zip(cache.key_cache, cache.value_cache))  # transformers 4: tuples
    return len(pairs), pairs[0][0].shape[1], pairs[0][0].shape[3], pairs[0][1].shape[3]


def past_dims(model) -> dict[str, tuple[int, int]]:
    """(heads, width) of each past input, read off the cache of a one-token run: layers may differ
    (Gemma 4's full-attention layers have wider heads than its sliding ones)."""
    with torch.no_grad():
        cache = model(torch.tensor([[1]]), use_cache=True).past_key_values
    pairs = [(layer.keys, layer.values) for layer in cache.layers] if hasattr(cache, "layers") else \
        [layer[:2] for layer in cache] if isinstance(cache, tuple) else list(zip(cache.key_cache, cache.value_cache))
    past, _ = kv_names(len(pairs))
    return {name: (t.shape[1], t.shape[3]) for name, t in zip(past, [t for kv in pairs for t in kv])}


def kv_names(num_layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{w}" for i in range(num_layers) for w in ("key", "value")]
    return past, [n.replace("past_key_values", "present") for n in past]


class FlatPast(nn.Module):
    """The Hugging Face model with its cache as flat tensors, as exporters want it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

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
    num_layers, kv_heads, head_dim, value_dim = kv_shape(model)
    past, present = kv_names(num_layers)
    dims = past_dims(model)
    dtype = next(model.parameters()).dtype  # a half model's past is half too
    args = (torch.tensor([[5, 6]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[3, 4]]),
            *[torch.randn(1, dims[n][0], 3, dims[n][1]).to(dtype) for n in past])
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "position_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"}, "logits": {0: "batch_size", 1: "sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past},
            **{n: {0: "batch_size", 2: "total_sequence_length"} for n in present}}
    names = {"input_names": ["input_ids", "attention_mask", "position_ids", *past], "output_names": ["logits", *present]}
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


class NoCache(nn.Module):
    """The Hugging Face model without a KV cache: logits of the whole sequence, as a plain export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False).logits


def export_no_cache(model, path: Path) -> None:
    """TorchScript exporter (opset 17) of the model without past inputs or present outputs."""
    args = (torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.int64), torch.tensor([[0, 1, 2]]))
    names = ["input_ids", "attention_mask", "position_ids"]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in [*names, "logits"]}
    with torch.no_grad():
        torch.onnx.export(NoCache(model).eval(), args, str(path), dynamo=False, opset_version=17, dynamic_axes=axes,
                          do_constant_folding=True, input_names=names, output_names=["logits"])


def export_optimum(model, path: Path) -> None:
    # imported here: optional, and optimum-onnx needs transformers < 4.58
    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        main_export(tmp, output=Path(tmp) / "onnx", task="text-generation-with-past", do_validation=False)
        shutil.copy(Path(tmp) / "onnx" / "model.onnx", path)
        if (Path(tmp) / "onnx" / "model.onnx_data").exists():
            shutil.copy(Path(tmp) / "onnx" / "model.onnx_data", path.parent)


def export_optimum_merged(model, path: Path) -> None:
    """Optimum's decoder_model_merged.onnx (what transformers.js repos ship): the decoder without
    past inputs (present outputs kept) and the one with them, merged by optimum.onnx.merge_decoders
    into one If on the bool input use_cache_branch, weights shared."""
    from optimum.exporters.onnx import export
    from optimum.exporters.tasks import TasksManager
    from optimum.onnx import merge_decoders

    config_of = TasksManager.get_exporter_config_constructor("onnx", model, task="text-generation-with-past",
                                                             library_name="transformers")
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for name, with_past in (("decoder_model", False), ("decoder_with_past_model", True)):
            config = config_of(model.config, task="text-generation", use_past=True, use_past_in_inputs=with_past)
            parts.append(Path(tmp) / f"{name}.onnx")
            export(model, config, parts[-1], opset=config.DEFAULT_ONNX_OPSET, do_constant_folding=True)
        merge_decoders(parts[0], parts[1], save_path=path)


def check(model, path: Path) -> float:
    """onnxruntime on the export against transformers: a 7-token prompt, then one token with its past."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    # an export without a KV cache needs no cache shapes (recurrent models have none to read)
    num_layers, kv_heads, head_dim, value_dim = kv_shape(model) if "past_key_values.0.key" in names else (0, 0, 0, 0)
    past, present = kv_names(num_layers)
    ids = torch.tensor([[1, 17, 33, 200, 9, 4, 77, 150]]) % model.config.vocab_size
    with torch.no_grad():
        want = model(ids).logits.float().numpy()
    half = next(model.parameters()).dtype == torch.float16
    dims = past_dims(model) if past else {}
    feeds = {n: np.zeros((1, dims[n][0], 0, dims[n][1]), np.float16 if half else np.float32) for n in past}
    feeds.update(input_ids=ids[:, :7].numpy(), attention_mask=np.ones((1, 7), np.int64), position_ids=np.arange(7)[None])
    outputs = [o.name for o in session.get_outputs()]
    if "past_key_values.0.key" not in names:  # no KV cache: the whole sequence at once
        feeds.update(input_ids=ids.numpy(), attention_mask=np.ones((1, 8), np.int64), position_ids=np.arange(8)[None])
        got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
        return float(np.abs(got.astype(np.float32) - want).max())
    feeds["use_cache_branch"] = np.array([False])  # merged decoders: the no-past branch first
    out = dict(zip(outputs, session.run(None, {k: v for k, v in feeds.items() if k in names})))
    feeds["use_cache_branch"] = np.array([True])
    feeds.update({n: out[p] for n, p in zip(past, present)})
    feeds.update(input_ids=ids[:, 7:].numpy(), attention_mask=np.ones((1, 8), np.int64), position_ids=np.array([[7]]))
    last = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    return float(max(np.abs(out["logits"].astype(np.float32) - want[:, :7]).max(),
                     np.abs(last.astype(np.float32) - want[:, 7:]).max()))


EXPORTERS = {"ts": lambda m, p: export_torch(m, p, dynamo=False), "dynamo": lambda m, p: export_torch(m, p, dynamo=True),
             "dynamo23": lambda m, p: export_torch(m, p, dynamo=True, opset=23), "optimum": export_optimum,
             "optimum_merged": export_optimum_merged, "ts_nocache": export_no_cache}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--exporters", default="ts,dynamo,optimum", help="comma-separated, of ts, dynamo, dynamo23, optimum")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="transformers attention implementation (default sdpa, what exports get by default)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                        help="export the model in this type (float16: model.half(), folder suffix _fp16)")
    parser.add_argument("--out", default="build/hf_decoders", help="output folder (default build/hf_decoders)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="config fields over the tiny defaults, for models big enough to time (repeatable): "
                             "--set hidden_size=512 --set num_experts=8")
    args = parser.parse_args()
    overrides = {field: json.loads(value) for field, value in (item.split("=", 1) for item in args.set)}
    failed = False
    for arch in args.models.split(","):
        for exporter in args.exporters.split(","):
            suffix = ('' if args.attn == 'sdpa' else '_' + args.attn) + ('_fp16' if args.dtype == 'float16' else '')
            folder = Path(args.out) / f"{arch}_{exporter}{suffix}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "model.onnx"
            model = make_model(arch, args.attn, **overrides).to(getattr(torch, args.dtype))
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
            failed |= diff > (CHECK_TOL if args.dtype == "float32" else CHECK_TOL_HALF)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
