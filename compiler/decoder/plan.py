"""`infc build` of a decoder (a profile with a `decode:` block): optimize, page the attention,
lower with batch-invariant GEMMs, smoke-run one mixed prefill/decode step, write the plan."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import onnx

from ... import __version__
from ..errors import BadInput
from ..graph import import_graph
from ..lower import lower_graph, value_info
from ..optimize import optimize_model
from ..plan.format import write_plan
from ..profile import Profile, check_profile_matches_model
from ..quantize.expert_weights import quantize_expert_weights
from ..quantize.greedy_agreement import greedy_agreement, program_runner
from ..quantize.w8_sensitivity import select_fp32_weights
from ..quantize.weight_only import COMPUTE as W8_COMPUTE
from ..quantize.weight_only import (
    dequantized,
    quantizable_weights,
    quantize_program_weights,
)
from ..runtime.decode_api import SeqChunk
from ..runtime.executor import Executor
from ..runtime.kernels import has_kernel
from ..runtime.model_runner import PagedModelRunner
from ..target import target_fingerprint
from .batch_invariant import use_batch_invariant_gemms
from .cache_branch import take_cache_branches
from .canonicalize import LOGITS_INDICES, canonicalize
from .device_plan import device_plan
from .lm_head import keeps_head_fp32, lm_head_weight
from .logits_rows import logits_rows_input
from .dynamic_int8 import COMPUTE as INT8_COMPUTE
from .dynamic_int8 import quantize_decoder_int8
from .dynamic_quant import fold_dynamic_quantization, has_dynamic_quantization
from .float32_export import as_float32, half_kind
from .genai_export import is_genai_export
from .genai_export import unpack as unpack_genai
from .model_folder import chat_template, eos_token_ids, tokenizer_json
from .mask_check import PastModelPositions, check_causal_masks, probes
from .position_tables import read_tables_whole
from .pipeline import DECODER_PIPELINE
from .position_reductions import fold_position_reductions
from .sites import NOT_RECOGNIZED, find_sites
from .weight_codes import attach_codes, store_codes

RUNNER_FED = ("position_ids", "attention_mask")  # fed per step by the runner; a graph may not take them
# fed by the runner too, newer than the profiles users already have: a profile may leave them out
RUNNER_FED_UNLISTED = ("cache_position", "token_type_ids")

PLAN_KIND = "decoder"
DECODER_PRECISIONS = ("fp32", "w8", "int8")


def build_decoder_plan(model_path: Path, handed: list[onnx.ModelProto], profile: Profile, output: Path, options,
                       log=lambda msg: None) -> dict:
    """`handed`: [the loaded model], which the build takes out of the list and drops once it is
    optimized (its weights are as large as the model)."""
    from ..build import _summary, cache_front, weights_section  # here: build imports us

    started = time.perf_counter()
    if options.precision not in DECODER_PRECISIONS:
        raise BadInput(f"--precision {options.precision}: decoder plans are {', '.join(DECODER_PRECISIONS)} "
                       "(w8: int8 weights, activations fp32; int8: int8 weights, activations quantized per token)")
    fingerprint = target_fingerprint(options.target)
    on_device = fingerprint.get("kind") == "cuda"
    if on_device and options.precision != "fp32":
        raise BadInput(f"--precision {options.precision} --target cuda: decoder plans on the GPU are fp32 so far")
    tokenizer = tokenizer_json(model_path)
    folder = {"chat_template": chat_template(model_path), "eos_token_ids": eos_token_ids(model_path)}
    lm_head = options.precision_settings.lm_head
    key_options = {**options.key_options(), "decoder": 3,
                   **({"lm_head": lm_head} if options.precision != "fp32" else {}),
                   "tokenizer": hashlib.sha256(tokenizer).hexdigest() if tokenizer else None,
                   "folder": hashlib.sha256(json.dumps(folder, sort_keys=True).encode()).hexdigest()[:16]}
    cache, components, lookup, report, hit = cache_front(model_path, profile, key_options, fingerprint, options,
                                                          output, started, log)
    if hit:
        return _verified(hit, handed[0], output, options)

    export_dtype = half_kind(handed[0])
    if export_dtype:
        log(f"{export_dtype} export: served in float32 (weights widened exactly; logits come out float32)")
        handed[0] = as_float32(handed[0])
    try:
        program, decoder = _paged_program(handed, profile, options)
    except BadInput as e:  # name the model, as every bad-input error names its file
        if str(e).startswith(NOT_RECOGNIZED):
            raise BadInput(f"{model_path}: {e}") from None
        raise
    if export_dtype:
        decoder["export_dtype"] = export_dtype  # the plan computes its float32 counterpart
    for key, value in folder.items():  # the model's metadata first, then the files beside it
        if not decoder.get(key) and value:
            decoder[key] = value
            log(f"{key.replace('_', ' ')} from the files beside the model")
    precision = weight_only_int8(program, decoder, tokenizer, options, log) if options.precision == "w8" else \
        dynamic_int8(program, decoder, options, log) if options.precision == "int8" else None
    if tokenizer is None:
        log("no tokenizer.json next to the model: the plan runs token ids only")
    cuda, cubins = device_plan(program, decoder, fingerprint, options, log) if on_device else (None, {})
    blob, weight_table = weights_section(program.weights)
    meta = {
        "infc_version": __version__, "kind": PLAN_KIND, "target": fingerprint, "opset": program.opset,
        "model": {"name": model_path.name, "sha256": components["model"]}, "profile": profile.normalized(),
        "options": key_options, "inputs": program.inputs, "outputs": program.outputs, "program": program.steps,
        "weights": weight_table, "memory": {"arena_bytes": 0, "sum_activation_bytes": 0},
        "tuning": [], "fallback_ops": program.fallback_ops, "decoder": decoder, "precision": precision,
        **({"cuda": cuda} if cuda else {}),
    }
    sections = {"weights": blob, **program.islands, **cubins, **({"tokenizer": tokenizer} if tokenizer else {})}
    write_plan(output, meta, sections)
    if options.use_cache:
        cache.store(lookup.key, output, model_path, components, {"summary": _summary(meta)})
    built = {**report, "cache_hit": False, "cache_reason": lookup.reason if lookup else "disabled",
             "build_s": round(time.perf_counter() - started, 4), **_summary(meta), "decoder": _brief(decoder),
             **({"export_dtype": export_dtype} if export_dtype else {}),
             **({"precision": precision} if precision else {})}
    return _verified(built, None, output, options, model_path)


def _verified(report: dict, model, output: Path, options, model_path: Path | None = None) -> dict:
    """--verify: the written plan's runner against onnxruntime on the original export (decoder/verify.py);
    `model`: the loaded export, or None to load it again (the build dropped it once optimized)."""
    if not options.verify:
        return report
    from ..build_phases import phase
    from ..model_io import load_model
    from .verify import verify_decoder_plan

    started = time.perf_counter()
    with phase("verifying the plan against onnxruntime", options.show_progress):
        report["verify"] = verify_decoder_plan(model if model is not None else load_model(model_path), output)
    report["build_s"] = round(report["build_s"] + time.perf_counter() - started, 4)  # as a one-shot build counts it
    return report


def _paged_program(handed: list[onnx.ModelProto], profile: Profile, options):
    """Optimize, find the attention sites, prove what paging drops, page, lower, smoke-run."""
    model = handed.pop()
    original_inputs = [value_info(t) for t in import_graph(model).inputs]
    model, fixed = take_cache_branches(model)  # merged decoders: the with-past branch of If(use_cache_branch)
    model, row_inputs = logits_rows_input(model, LOGITS_INDICES)  # logits_to_keep [k]: the rows needing logits
    ignorable = {f.condition for f in fixed} | set(row_inputs) | set(RUNNER_FED_UNLISTED)
    codes: dict = {}  # MatMulNBits' and dynamically quantized weights' codes, kept in the plan instead of their float32 form
    if is_genai_export(model):  # GroupQueryAttention / MatMulNBits: into the form sites.py pages
        model = unpack_genai(model, codes)
    if has_dynamic_quantization(model):  # quantize_dynamic: float32 GEMMs on the dequantized weights
        model = fold_dynamic_quantization(model, codes)
    optimized = optimize_model(model, DECODER_PIPELINE)
    del model  # the last reference to the loaded model's weights
    graph = import_graph(optimized.model)
    sites = find_sites(graph, _attention_rejections(optimized))
    past = {t.name for s in sites for t in s.past}
    # one decode profile serves exports with and without position_ids (ALiBi, genai) or a KV cache:
    # what the runner feeds per step may be listed for a model that does not take it
    check_profile_matches_model(profile, original_inputs, ignorable=lambda name: name in past or name in ignorable,
                                unused=lambda name: name in RUNNER_FED + RUNNER_FED_UNLISTED or name.startswith("past_key_values"))
    decoder = _spec(sites, profile, optimized.model, [t for t in graph.outputs if not _is_present(t, sites)])
    if fixed:
        decoder["fixed_branches"] = [f.to_json() for f in fixed]
    fold_position_reductions(graph, decoder["max_model_len"])
    read_tables_whole(graph)
    steps = probes(decoder["max_model_len"], profile.decode.get("max_num_batched_tokens", 0))
    try:
        forms = check_causal_masks(graph, sites, steps)
    except PastModelPositions as exc:
        raise BadInput(f"{profile.source}: {exc}") from None
    for site, form in zip(sites, forms):
        site.window, site.alibi_slopes = form.window, form.slopes
    windows = [form.window for form in forms]
    decoder["sliding_windows"] = windows if any(windows) else None
    decoder["position_bias"] = "alibi" if any(form.slopes for form in forms) else None
    decoder.update(canonicalize(graph, sites, decoder["block_size"], decoder["logits"], steps))
    program = lower_graph(graph, has_kernel, allow_fallback=options.allow_fallback)
    use_batch_invariant_gemms(program, {name: t.dtype for name, t in graph.tensors().items()})
    del graph, optimized  # the program holds the weights now: the optimized model's copy can go
    attach_codes(program, store_codes(program, codes))
    _smoke_run(program, decoder)
    return program, decoder


def _head_kept(program, decoder: dict, options, log) -> tuple[str | None, bool | None]:
    """(the LM head's weight, or None where the walk finds none; keeps_head_fp32's answer)."""
    head = lm_head_weight(program, decoder["logits"])
    keep = keeps_head_fp32(options.precision_settings.lm_head, options.precision)
    if head is None and keep is not None:
        log(f"{options.precision}: no LM head GEMM found before the logits output: --lm-head has nothing to keep or quantize")
    return head, keep


def weight_only_int8(program, decoder: dict, tokenizer: bytes | None, options, log) -> dict:
    """Quantize the GEMM weights in place, but for the most sensitive ones (quantize/w8_sensitivity.py)
    and the LM head where --lm-head fp32 says so; the plan's accuracy entry: greedy-token agreement
    of the w8 program with the fp32 one on a few seeded prompts."""
    reference = dataclasses.replace(program, steps=copy.deepcopy(program.steps), weights=dict(program.weights))
    candidates, _ = quantizable_weights(program)
    coded = sum(1 for step in program.steps if "weight_group" in step["attrs"])
    if not candidates and coded:
        log(f"w8: no float32 GEMM weight to quantize: {coded} GEMMs already read the model's own quantized codes")
    head, keep_head = _head_kept(program, decoder, options, log)
    decided = {head} if head in candidates and keep_head is not None else set()  # not the selection's to choose
    sensitivity = select_fp32_weights(program_runner(reference, decoder, tokenizer),
                                      {n: dequantized(program.weights[n], axis) for n, axis in candidates.items()
                                       if n not in decided}, log=log)
    kept = (*sensitivity.kept, *((head,) if keep_head and head in candidates else ()))
    w8 = quantize_program_weights(program, keep_fp32=kept)
    attach_codes(program)
    experts = quantize_expert_weights(program)
    log(f"w8: {w8.num_weights} GEMM weights to int8, {len(w8.kept_fp32)} kept fp32 (calibration KL "
        f"{sensitivity.kl_all_int8:.3g} -> {sensitivity.kl_kept:.3g})"
        + (f", {experts.num_weights} expert weights to int8 ({experts.bytes_fp32 / 1e6:.1f} -> {experts.bytes_int8 / 1e6:.1f} MB)"
           if experts.num_weights else "") + "; checking greedy tokens against fp32")
    greedy = greedy_agreement(reference, program, decoder)
    return {"precision": "w8", "compute": W8_COMPUTE, "w8": {**w8.to_json(), "lm_head": _head_entry(head, w8.kept_fp32),
                                                             "experts": experts.to_json()},
            "accuracy": {"reference": "the fp32 program", "greedy": greedy, "sensitivity": sensitivity.to_json()}}


def _head_entry(head: str | None, kept: list) -> dict | None:
    """What `infc inspect` says of the LM head: its weight and whether it stayed float32."""
    return None if head is None else {"weight": head, "kept_fp32": head in kept}


def dynamic_int8(program, decoder: dict, options, log) -> dict:
    """int8 weights, activations quantized per token (decoder/dynamic_int8.py), the LM head float32
    unless --lm-head int8; the plan's accuracy entry: greedy-token agreement with the fp32 program
    on a few seeded prompts."""
    if getattr(options, "calib", None):
        log("int8 decoder plans quantize each token's activations at run time: --calib is not used")
    reference = dataclasses.replace(program, steps=copy.deepcopy(program.steps), weights=dict(program.weights))
    head, keep_head = _head_kept(program, decoder, options, log)
    int8 = quantize_decoder_int8(program, keep_fp32=(head,) if keep_head and head else ())
    int8["lm_head"] = _head_entry(head, int8["kept_fp32"])
    log(f"int8: {int8['num_weights']} GEMM weights to int8 ({int8['bytes_fp32'] / 1e6:.1f} -> {int8['bytes_int8'] / 1e6:.1f} MB), "
        f"the LM head {'float32' if int8['kept_fp32'] else 'int8' if head else 'not found'}, "
        f"{int8['gemms_quantizing_rows']} GEMMs quantizing their activations per token; checking greedy tokens against fp32")
    greedy = greedy_agreement(reference, program, decoder)
    return {"precision": "int8", "compute": INT8_COMPUTE, "int8_per_token": int8,
            "accuracy": {"reference": "the fp32 program", "greedy": greedy}}


def _attention_rejections(optimized) -> dict[str, int]:
    reasons: dict[str, int] = {}
    for stats in optimized.pipeline.stats:
        for name, rule in stats.rules.items():
            if name.startswith("attention"):
                for reason, count in rule.rejected().items():
                    reasons[reason] = reasons.get(reason, 0) + count
    return reasons


def _is_present(tensor, sites) -> bool:
    return any(tensor is p for s in sites for p in s.present)


def _spec(sites, profile: Profile, model: onnx.ModelProto, outputs: list) -> dict:
    # head sizes may differ by layer (Gemma 4): the pools hold the widest, narrower heads padded (canonicalize.py)
    shapes = {(s.num_heads, s.kv_num_heads) for s in sites}
    if len(shapes) != 1:
        raise BadInput(f"not a recognized decoder: layers differ in head counts {sorted(shapes)}")
    if len(outputs) != 1:
        raise BadInput(f"not a recognized decoder: expected one output besides the present KV, got {[t.name for t in outputs]}")
    if "max_model_len" not in profile.decode:
        raise BadInput(f"{profile.source}: decode.max_model_len: required for a decoder plan")
    (num_heads, kv_heads), head_dim = shapes.pop(), max(s.head_dim for s in sites)
    vocab = outputs[0].shape[-1] if outputs[0].shape else None
    props = {p.key: p.value for p in model.metadata_props}
    eos = props.get("eos_token_ids", props.get("eos_token_id", "[]"))
    try:
        eos_ids = [int(e) for e in (json.loads(eos) if eos.strip().startswith("[") else eos.split(","))]
    except ValueError:
        raise BadInput(f"model metadata eos_token_ids: not a list of integers: {eos!r}") from None
    return {"num_layers": len(sites), "num_heads": num_heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
            "max_model_len": profile.decode["max_model_len"], "block_size": profile.decode.get("block_size", 16),
            "eos_token_ids": eos_ids, "logits": outputs[0].name, "chat_template": props.get("chat_template"),
            "vocab_size": int(vocab) if isinstance(vocab, (int, np.integer)) and vocab > 0 else None}


CHUNK_RTOL = 1e-3  # float rounding of GEMMs over other row counts; positions off by a few change far more


def _smoke_run(program, decoder: dict) -> None:
    """One step with a 3-token prefill and a decode token: the vocabulary size comes from it if the
    graph does not say, and a graph that cannot run fails the build here rather than in `infc run`.
    Then a prompt's last token, prefilled with the prompt and decoded after it behind another
    sequence's tokens in one step, must get the same logits (a graph that derives positions from the
    step's tokens, not position_ids, would not: rotary's relative positions hide it in a prefill)."""
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[o["name"] for o in program.outputs])
    runner = PagedModelRunner(executor, {**decoder, "vocab_size": decoder["vocab_size"] or 8}, program.inputs)
    runner.allocate_kv(5)
    chunks = [SeqChunk(0, [1, 2, 3], 0, [0], True), SeqChunk(1, [4], 1, [1], True)]
    logits = executor.run(runner.feeds(chunks)[0])[decoder["logits"]]
    rows = 2 if decoder["gathers_logits"] else 4
    if logits.ndim < 2 or logits.size != rows * logits.shape[-1] or decoder["vocab_size"] not in (None, logits.shape[-1]):
        raise BadInput(f"not a recognized decoder: logits of shape {list(logits.shape)} for {rows} rows")
    decoder["vocab_size"] = int(logits.shape[-1])

    def last_row(chunks: list[SeqChunk]) -> np.ndarray:
        out = executor.run(runner.feeds(chunks)[0])[decoder["logits"]]
        return out.reshape(-1, out.shape[-1])[-1]

    whole = last_row([SeqChunk(2, [1, 2, 3, 4], 0, [2], True)])
    last_row([SeqChunk(3, [1, 2, 3], 0, [3], True)])
    decoded = last_row([SeqChunk(4, [5, 6], 0, [4], True), SeqChunk(3, [4], 3, [3], True)])
    diff = float(np.abs(decoded - whole).max())
    if not diff <= CHUNK_RTOL * max(1.0, float(np.abs(whole).max())):
        raise BadInput(f"not a recognized decoder: a token decoded after its cached prompt gets logits {diff:.3g} away "
                       "from the same token prefilled with the prompt: the graph derives token positions from the "
                       "step's tokens (export it with a position_ids input), computes with all the step's tokens "
                       "together (a statistic over every row, as a quantization scale), or carries a state along the "
                       "sequence that the paged KV cache does not hold (recurrent, state-space, linear-attention or "
                       "short-convolution layers: Mamba, RWKV, RecurrentGemma, LFM2, Qwen3-Next)")


def _brief(decoder: dict) -> dict:
    return {k: v for k, v in decoder.items() if k != "chat_template"}
