"""What `infc build` prints and what `infc inspect PLAN.bin` explains: target, kernels, tuning
results against the vendor library, memory plan, fallback islands."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from .plan.format import read_plan
from .precision_payoff import payoff_note
from .runtime.row_quantized_gemm import ROW_QUANTIZED

TOP_CANDIDATES = 3  # the fastest few per shape; --json has them all


def plan_report(path: str) -> dict:
    meta = read_plan(path).meta
    memory = meta.get("memory", {})
    islands = [{"ops": s.get("ops", []), "inputs": s["inputs"], "outputs": s["outputs"]}
               for s in meta["program"] if s["op"] == "__island__"]
    return {
        "plan": str(path), "infc_version": meta.get("infc_version"), "kind": meta.get("kind"),
        "target": meta.get("target"), "model": meta.get("model"), "profile": meta.get("profile"),
        "inputs": meta.get("inputs"), "outputs": meta.get("outputs"),
        "kernels": dict(Counter(kernel_name(s) for s in meta["program"]).most_common()),
        "tuning": meta.get("tuning", []),
        "memory": {"arena_bytes": memory.get("arena_bytes"), "sum_activation_bytes": memory.get("sum_activation_bytes"),
                   "arena_fraction": (memory["arena_bytes"] / memory["sum_activation_bytes"]) if memory.get("sum_activation_bytes") else None,
                   "planned_for": memory.get("planned_for")},
        "weights_bytes": sum(_nbytes(w) for w in meta.get("weights", {}).values()),
        "fallback_ops": meta.get("fallback_ops", []), "islands": islands,
        "gpu_host_ops": (meta.get("cuda") or {}).get("host_ops"),  # cuda plans: ops run on the CPU with copies
        "gpu_row_kernels": sorted((meta.get("cuda") or {}).get("rows") or {}),  # fixed kernels (norms, softmax, paged attention)
        "gpu_self_check": (meta.get("cuda") or {}).get("self_check"),  # decoder plans: the device runner against the CPU's
        "onnxruntime_tactics": _tactics_summary(meta),
        "precision": meta.get("precision") or {"precision": (meta.get("options") or {}).get("precision", "fp32")},
        "decoder": _decoder_summary(meta),
    }


DECODER_FIELDS = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size", "max_model_len", "block_size",
                  "eos_token_ids")
# How a decoder plan's GEMMs keep a request's tokens independent of its batch (runtime/invariant_gemm.py)
GEMM_INVARIANCE = ("float32 through a BLAS recipe checked row-invariant per weight shape when the plan first runs, "
                   "decode-sized rows on a kernel with the same sums (where the check fails, that kernel in its own "
                   "order for every row count; `infc run --json` lists the verdicts)")
# A cuda decoder plan's GEMMs and attention (runtime/cuda/ops_paged.py) do not promise that
DEVICE_GEMMS = ("float32 on the GPU through cuBLAS: not batch-invariant, a token's logits may move in the last "
                "bits with the batch around it")


def _print_lm_head(console, precision: str, head: dict | None) -> None:
    """The LM head's precision (decoder/lm_head.py), as the plan stores it (plans before it: nothing)."""
    if head:
        console.print(f"  {precision}: LM head {head['weight']} " + ("float32" if head["kept_fp32"] else "int8"))


def _decoder_summary(meta: dict) -> dict | None:
    decoder = meta.get("decoder")
    if meta.get("kind") != "decoder" or not decoder:
        return None
    gemms = sum(1 for s in meta["program"] if (s.get("domain"), s["op"]) == ("infc", "BatchInvariant"))
    legacy = sum(1 for s in meta["program"] if (s.get("domain"), s["op"]) == ("infc", "Float64"))
    # GEMMs whose decode rows read 8-bit weight codes (decoder/weight_codes.py)
    coded = sum(1 for s in meta["program"] if "weight_group" in (s.get("attrs") or {}))
    # of those, GEMMs of a quantize_dynamic file: activations quantized per row (runtime/row_quantized_gemm.py)
    rows = sum(1 for s in meta["program"] if (s.get("attrs") or {}).get(ROW_QUANTIZED))
    experts = sum(1 for s in meta["program"] if (s.get("domain"), s["op"]) == ("infc.cpu", "ExpertMatMul"))
    return {**{k: decoder.get(k) for k in DECODER_FIELDS}, "chat_template": bool(decoder.get("chat_template")),
            "batch_invariant_gemms": gemms, "float64_gemms": legacy, "gemms_reading_codes": coded,
            "gemms_quantizing_rows": rows, "expert_gemm_steps": experts,
            "gemm_invariance": DEVICE_GEMMS if decoder.get("batch_invariant") is False else GEMM_INVARIANCE if gemms
            else "float64 (a plan built before float32 GEMMs)",
            "attention": _attention_options(meta["program"]),
            "decode": dict((meta.get("profile") or {}).get("decode") or {}),  # the profile's decode: section
            "kv_cache": _kv_cache(decoder, (meta.get("profile") or {}).get("decode") or {}),
            "attention_kind": _attention_kind(decoder["num_heads"], decoder["num_kv_heads"]),
            "architecture": _architecture(meta["program"]),
            **({"fixed_branches": decoder["fixed_branches"]} if decoder.get("fixed_branches") else {})}


def _kv_cache(decoder: dict, decode: dict) -> dict:
    """The paged KV cache `infc run` allocates for this plan (runtime/model_runner.py; a pool of
    `auto` blocks is sized at run time from max_num_seqs and the free memory, engine.pool_size)."""
    import numpy as np

    from .runtime.decode_api import KV_DTYPE, ModelSpec, kv_bytes_per_block

    fields = {k: decoder[k] for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                                      "max_model_len", "block_size")}
    per_block = kv_bytes_per_block(ModelSpec(**fields, eos_token_ids=()))
    num_blocks = decode.get("num_kv_blocks")
    is_fixed = isinstance(num_blocks, int) and not isinstance(num_blocks, bool)
    block_size = fields["block_size"]
    return {"layout": f"paged: per layer, a key and a value pool of [blocks, {fields['num_kv_heads']} KV heads, "
                      f"{block_size} tokens, {fields['head_dim']}] {np.dtype(KV_DTYPE).name}, read through each "
                      "sequence's block table",
            "dtype": np.dtype(KV_DTYPE).name, "num_blocks": num_blocks if is_fixed else "auto",
            "bytes_per_block": per_block, "bytes_per_token": per_block // block_size,
            "pool_tokens": num_blocks * block_size if is_fixed else None,
            "pool_bytes": num_blocks * per_block if is_fixed else None,
            "bytes_per_full_context": per_block * -(-fields["max_model_len"] // block_size)}


def _attention_kind(num_heads: int, num_kv_heads: int) -> str:
    if num_kv_heads == num_heads:
        return f"multi-head ({num_heads} heads)"
    if num_kv_heads == 1:
        return f"multi-query ({num_heads} query heads share one KV head)"
    return f"grouped-query ({num_heads} query heads over {num_kv_heads} KV heads, {num_heads // num_kv_heads} each)"


# What the build recognized, read off the fused ops the plan runs (first match wins)
ARCHITECTURE_TRAITS = (
    ("positions", (("RotaryEmbedding", "rotary"),)),
    ("norm", (("SimplifiedLayerNormalization", "RMSNorm"), ("SkipSimplifiedLayerNormalization", "RMSNorm"),
              ("LayerNormalization", "LayerNorm"), ("SkipLayerNormalization", "LayerNorm"))),
    ("mlp", (("ExpertMatMul", "mixture of experts (rows grouped per expert, one GEMM each)"), ("GatedActivation", "gated"))),
)


def _architecture(program: list[dict]) -> dict:
    ops = {s["op"] for s in program}
    traits = {name: next((label for op, label in rules if op in ops), None) for name, rules in ARCHITECTURE_TRAITS}
    alibi = any((s.get("attrs") or {}).get("alibi_slopes") for s in program if s["op"] == "PagedAttention")
    traits["positions"] = traits["positions"] or ("ALiBi" if alibi else "absolute (no rotary or ALiBi)")
    traits["mlp"] = traits["mlp"] or "plain"
    return traits


def _attention_options(program: list[dict]) -> dict:
    """What the paged attention adds to plain causal attention, over the layers: sliding windows,
    soft-caps, ALiBi slopes (decoder/mask_check.py), attention sinks (passes/fuse/attention_sinks.py)."""
    layers = [s.get("attrs") or {} for s in program if (s.get("domain"), s["op"]) == ("infc", "PagedAttention")]
    options = {"sliding_windows": sorted({a["window"] for a in layers if a.get("window")}),
               "softcaps": sorted({a["softcap"] for a in layers if a.get("softcap")}),
               "alibi_slopes": next((a["alibi_slopes"] for a in layers if a.get("alibi_slopes")), None),
               "sink_layers": sum(1 for a in layers if a.get("sinks"))}  # gpt-oss: a logit per head in each softmax
    return {k: v for k, v in options.items() if v}


def _tactics_summary(meta: dict) -> dict | None:
    """Which steps the build gave to onnxruntime as the vendor tactic, and the program times that
    decided it (tune_context.confirm_in_context)."""
    context = meta.get("conv_tactics")
    if not context:
        return None
    in_vendor = [s for s in meta["program"] if s.get("tactic")]
    return {"num_steps": len(meta["program"]), "num_in_onnxruntime": len(in_vendor),
            "num_timed": sum(1 for s in in_vendor if s.get("tactic_ratio") is not None),
            "num_bridges": context.get("num_bridges", 0), "num_sessions": context.get("num_sessions"),
            "kept": context.get("kept"), "program_ms": context.get("program_ms", {}),
            "whole_model": bool(context.get("whole_model")), "whole_model_threads": context.get("whole_model_threads")}


def kernel_name(step: dict) -> str:
    """What runs a step: its kernel, with the vendor tactic the tuner picked for it (tune_vendor.py)
    or, for a bf16 plan's convolution, infc's kernel on AMX-BF16 tiles (kernels/amx_conv.py)."""
    kernel = step.get("kernel", step["op"])
    if step.get("tactic"):
        return f"{kernel} [{step['tactic']}]"
    return f"{kernel} [amx-bf16 tiles]" if step.get("bf16_tiles") else kernel


def _nbytes(info: dict) -> int:
    """The weight's bytes in the plan (an encoded one's stored bytes: plan/weight_encoding.py)."""
    import numpy as np

    from .plan.weight_encoding import stored_itemsize

    itemsize = stored_itemsize(info) or np.dtype(info["dtype"]).itemsize
    return int(np.prod(info["shape"])) * itemsize if info["shape"] else itemsize


def _tuning_table(tuning: list[dict], whole_model: bool = False) -> Table:
    # a plan kept whole runs none of these: say so rather than leave them looking like the plan's kernels
    unused = "; tuned before the whole model won, not run by this plan" if whole_model else ""
    table = Table(title="Tuned kernels per shape (time as % of the vendor library: BLAS for a GEMM's recipes, "
                        f"onnxruntime for convolution and GEMM steps; lower is faster{unused})")
    for column in ("problem (GEMM: M bucket x N x K)", "source", "winner", "winner %", "fastest candidates (% of vendor)"):
        table.add_column(column)
    for entry in tuning:
        timed = sorted((c for c in entry.get("candidates", []) if c.get("pct_of_vendor") is not None),
                       key=lambda c: c["pct_of_vendor"])
        others = len(entry.get("candidates", [])) - len(timed)
        cands = ", ".join(f"{c['config']} {c['pct_of_vendor']:.0f}%" for c in timed[:TOP_CANDIDATES])
        cands += f" (+{len(timed) - TOP_CANDIDATES} more)" if len(timed) > TOP_CANDIDATES else ""
        cands += f"; {others} pruned or failed" if others else ""
        cands += f"; {entry['note']}" if entry.get("note") else ""  # e.g. the vendor kept after a head-to-head
        table.add_row(entry.get("shape", entry.get("key", "")), entry.get("source", ""), str(entry.get("winner")),
                      f"{entry['winner_pct_of_vendor']:.0f}%" if entry.get("winner_pct_of_vendor") is not None else "-", cands)
    return table


def _size(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def print_plan_report(report: dict, console: Console) -> None:
    target = report["target"] or {}
    console.print(f"plan {report['plan']} (infc {report['infc_version']}, {report['kind']}) for "
                  + ", ".join(f"{k}={v}" for k, v in target.items()))
    memory = report["memory"]
    if memory["sum_activation_bytes"]:
        console.print(f"memory: arena {memory['arena_bytes'] / 1e6:.2f} MB for {memory['sum_activation_bytes'] / 1e6:.2f} MB of "
                      f"activations ({100 * memory['arena_fraction']:.0f}%), planned for {memory['planned_for']}; "
                      f"weights {report['weights_bytes'] / 1e6:.2f} MB")
    console.print("kernels: " + ", ".join(f"{k} x{n}" for k, n in report["kernels"].items()))
    decoder = report.get("decoder")
    if decoder:
        console.print(f"decoder: {decoder['num_layers']} layers, {decoder['num_heads']} heads ({decoder['num_kv_heads']} KV), "
                      f"head dim {decoder['head_dim']}, vocab {decoder['vocab_size']}, context {decoder['max_model_len']}, "
                      f"KV blocks of {decoder['block_size']} tokens, chat template: {'yes' if decoder['chat_template'] else 'no'}; "
                      f"{decoder['batch_invariant_gemms'] + decoder['float64_gemms']} GEMMs in {decoder['gemm_invariance']}"
                      + (f"; {decoder['expert_gemm_steps']} expert GEMM steps, each expert's GEMM the same way"
                         if decoder.get("expert_gemm_steps") else ""))
        attention = decoder.get("attention") or {}
        if attention:
            parts = [f"sliding windows of {', '.join(map(str, attention['sliding_windows']))} keys"
                     if "sliding_windows" in attention else "",
                     f"soft-cap {', '.join(f'{c:g}' for c in attention['softcaps'])}" if "softcaps" in attention else "",
                     "ALiBi position bias, slopes " + ", ".join(f"{x:.3g}" for x in attention["alibi_slopes"])
                     if "alibi_slopes" in attention else "",
                     f"attention sinks on {attention['sink_layers']} layers" if "sink_layers" in attention else ""]
            console.print("  paged attention: " + "; ".join(p for p in parts if p))
        decode, kv = decoder.get("decode") or {}, decoder.get("kv_cache") or {}
        if kv:
            pool = (f"{kv['num_blocks']} blocks ({kv['pool_tokens']} tokens, {_size(kv['pool_bytes'])})"
                    if kv["pool_bytes"] is not None else "auto blocks (sized at run time within the free memory)")
            console.print(f"  decode: up to {decode.get('max_num_seqs', '?')} sequences and "
                          f"{decode.get('max_num_batched_tokens', '?')} tokens a step; KV pool {pool}, "
                          f"{_size(kv['bytes_per_block'])} a block, {_size(kv['bytes_per_token'])} a token, "
                          f"{_size(kv['bytes_per_full_context'])} a full context")
            console.print(f"  KV cache: {kv['layout']}; {decoder['attention_kind']} attention")
        if decoder.get("architecture"):
            arch = decoder["architecture"]
            console.print(f"  recognized: decoder-only transformer; positions: {arch['positions']}; "
                          f"norm: {arch['norm'] or 'none'}; MLP: {arch['mlp']}")
        for fixed in decoder.get("fixed_branches") or []:  # merged decoders (decoder/cache_branch.py)
            console.print(f"  merged decoder: If '{fixed['if']}' on '{fixed['condition']}' fixed to its {fixed['branch']} "
                          "(the with-past decoder; the KV pools hold the past)")
        coded, rows = decoder.get("gemms_reading_codes") or 0, decoder.get("gemms_quantizing_rows") or 0
        if coded > rows:
            console.print(f"  {coded - rows} of them read 8-bit weight codes for decode rows "
                          "(the same sums as on the dequantized weights)")
        if rows:
            console.print(f"  {rows} of them quantize each token's activations to 8 bits, as the model's "
                          "DynamicQuantizeLinear does but per token, and sum exact integers")
    if report["tuning"]:
        console.print(_tuning_table(report["tuning"], bool((report.get("onnxruntime_tactics") or {}).get("whole_model"))))
    if report.get("gpu_host_ops"):
        console.print(f"GPU plan: on the CPU with host copies (no device kernel): {', '.join(report['gpu_host_ops'])}")
    if report.get("gpu_row_kernels"):
        console.print(f"GPU row kernels: {', '.join(report['gpu_row_kernels'])}")
    if report.get("gpu_self_check"):
        console.print(f"GPU self-check: logits within {report['gpu_self_check']['max_rel_diff']:.2g} of the CPU runner's "
                      f"over {report['gpu_self_check']['steps']} steps")
    tactics = report.get("onnxruntime_tactics")
    if tactics and tactics.get("whole_model"):
        ms = tactics["program_ms"]
        ours = {label: v for label, v in ms.items() if label != tactics["kept"]}
        fastest = min(ours, key=ours.get) if ours else None
        threads = " of one intra-op thread" if tactics.get("whole_model_threads") == 1 else ""
        console.print(f"the whole model runs in one onnxruntime session{threads} (tune_whole.py): {ms.get(tactics['kept'], float('nan')):.3g} ms "
                      f"at the opt shapes, against {ours.get(fastest, float('nan')):.3g} ms for the fastest program on infc's "
                      f"kernels ({fastest}); INFC_WHOLE_MODEL=0 or --no-fallback builds infc's own")
    elif tactics and tactics["num_in_onnxruntime"]:
        ms = tactics["program_ms"]
        console.print(f"onnxruntime tactics: {tactics['num_in_onnxruntime']} of {tactics['num_steps']} steps run in onnxruntime "
                      f"({tactics['num_timed']} timed against infc alone, {tactics['num_bridges']} bridges between them) in "
                      f"{tactics['num_sessions']} session{'' if tactics['num_sessions'] == 1 else 's'}: the program at "
                      f"the opt shapes took "
                      f"{ms.get(tactics['kept'], float('nan')):.3g} ms so, {ms.get('none', float('nan')):.3g} ms on infc's kernels alone")
    elif tactics:
        console.print("onnxruntime tactics: none kept (no subset beat infc's kernels in context: "
                      + ", ".join(f"{k} {v:.3g} ms" for k, v in tactics["program_ms"].items()) + ")")
    if report["islands"]:
        for island in report["islands"]:
            console.print(f"onnxruntime island: {', '.join(island['ops'])} ({len(island['inputs'])} in, {len(island['outputs'])} out)")
    else:
        console.print("no onnxruntime islands: every op has a native kernel")
    print_precision(report["precision"], console)


def print_precision(precision: dict, console: Console) -> None:
    """What a reduced-precision plan computes, what the repair pinned, and its accuracy against fp32."""
    if precision.get("precision", "fp32") == "fp32":
        return
    console.print(f"precision {precision['precision']}: {precision.get('compute', '')}")
    conversion, repair = precision.get("conversion"), precision.get("repair")
    if conversion:
        console.print(f"  {conversion['num_emulated']} ops emulated (fp32 between casts), {conversion['num_low']} in "
                      f"{precision['precision']}, fp32 by rule: "
                      + (", ".join(f"{r} x{n}" for r, n in conversion["fp32_by_reason"].items()) or "none"))
    if repair:
        pinned = ", ".join(f"{name} ({op})" for name, op in repair["pinned"]) or "none"
        console.print(f"  self-repair ({repair['metric']} <= {repair['tolerance']:g}): error {repair['error_before']:.3g} -> "
                      f"{repair['error_after']:.3g}; pinned to fp32: {pinned}"
                      + ("" if repair["is_within_tolerance"] else "  [tolerance NOT reached]"))
    note = payoff_note(precision.get("payoff"), precision["precision"])
    if note:
        console.print(f"  {note}")
    if precision.get("int8"):
        int8 = precision["int8"]
        console.print(f"  int8 {int8['method']} over {int8['num_samples']} samples: quantized {int8['quantized']}")
    if precision.get("int8_per_token"):  # a decoder plan's int8 (decoder/dynamic_int8.py)
        int8 = precision["int8_per_token"]
        console.print(f"  int8: {int8['num_weights']} GEMM weights int8 ({int8['bytes_fp32'] / 1e6:.1f} MB fp32 -> "
                      f"{int8['bytes_int8'] / 1e6:.1f} MB int8 + scales), {int8['gemms_quantizing_rows']} GEMMs quantize "
                      "their activations per token")
        _print_lm_head(console, "int8", int8.get("lm_head"))
    if precision.get("w8"):
        w8 = precision["w8"]
        console.print(f"  w8: {w8['num_weights']} GEMM weights int8 ({w8['bytes_fp32'] / 1e6:.1f} MB fp32 -> "
                      f"{w8['bytes_int8'] / 1e6:.1f} MB int8 + scales)")
        _print_lm_head(console, "w8", w8.get("lm_head"))
        experts = w8.get("experts") or {}
        if experts.get("num_weights"):  # quantize/expert_weights.py
            console.print(f"  w8: {experts['num_weights']} expert weights int8 ({experts['bytes_fp32'] / 1e6:.1f} MB fp32 -> "
                          f"{experts['bytes_int8'] / 1e6:.1f} MB int8 + scales per expert and channel), rebuilt per call")
        kept, sense = w8.get("kept_fp32", []), (precision.get("accuracy") or {}).get("sensitivity")
        if sense:
            console.print(f"  w8: {len(kept)} weights kept fp32 by sensitivity ({w8['kept_fp32_bytes'] / 1e6:.1f} MB), "
                          f"KL to fp32 {sense['kl_all_int8']:.2g} -> {sense['kl_kept']:.2g} on {sense['num_positions']} "
                          f"teacher-forced positions ({sense['calibration']})"
                          + (f": {', '.join(kept[:6])}{f' +{len(kept) - 6} more' if len(kept) > 6 else ''}" if kept else ""))
    accuracy = precision.get("accuracy") or {}
    for out in accuracy.get("outputs", []):
        top1 = f", top-1 agreement {100 * out['top1_agreement']:.1f}%" if "top1_agreement" in out else ""
        console.print(f"  accuracy {out['name']}: max rel {out['max_rel']:.3g}, q99.9 rel {out['q_rel']:.3g}, "
                      f"mean rel {out['mean_rel']:.3g}{top1} ({accuracy['num_inputs']} inputs vs {accuracy['reference']})")
    if "greedy" in accuracy:
        greedy = accuracy["greedy"]
        console.print(f"  greedy tokens: {greedy['num_agree']}/{greedy['num_tokens']} agree with fp32 "
                      f"({100 * greedy['agreement']:.1f}%) over {greedy['num_prompts']} seeded prompts")


def print_build_report(report: dict, console: Console) -> None:
    state = "hit" if report["cache_hit"] else f"miss ({report['cache_reason']})"
    console.print(f"engine cache: {state}")
    if report.get("timing_cache"):
        tc = report["timing_cache"]
        console.print(f"timing cache: {tc.get('hits', 0)} hits, {tc.get('misses', 0)} tuned now")
    if report.get("tuning"):
        console.print(_tuning_table(report["tuning"], bool((report.get("conv_tactics") or {}).get("whole_model"))))
    if report.get("fallback_ops"):
        console.print(f"onnxruntime fallback for: {', '.join(report['fallback_ops'])}")
    memory = report.get("memory") or {}
    if memory.get("sum_activation_bytes"):
        console.print(f"memory: arena {memory['arena_bytes'] / 1e6:.2f} MB for {memory['sum_activation_bytes'] / 1e6:.2f} MB of activations")
    if report.get("precision"):
        print_precision(report["precision"], console)
    if report.get("verify", {}).get("skipped"):
        console.print(f"verify: not run: {report['verify']['skipped']}")
    elif report.get("verify"):
        console.print(f"verify: max abs diff {report['verify']['max_abs_diff']:.3g}, max rel diff {report['verify']['max_rel_diff']:.3g}"
                      + (f" against {report['verify']['reference']}" if report['verify'].get('reference') else ""))
        if report["verify"].get("greedy_tokens_agree"):
            console.print(f"verify: greedy tokens agree {report['verify']['greedy_tokens_agree']}")
        if report["verify"].get("note"):
            console.print(f"verify note: {report['verify']['note']}")
    console.print(f"wrote {report['plan']} in {report['build_s']:.2f} s")
