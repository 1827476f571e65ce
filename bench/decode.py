"""The decode loop, side by side in one run (issue #5):

1. continuous vs static batching, output tokens/s, on a fixed seeded workload: 64 requests, prompt
   and output lengths uniform in [16, 256], EOS ignored, same runner, twice: (a) the same KV budget,
   the memory of a static batch of 8 (`--static-batch`) as contiguous caches of the trace's longest
   request, and continuous batching admits up to `--max-num-seqs` into it (the gain of paging and of
   iteration-level scheduling together, as a server with a fixed memory budget sees it); (b) the same
   max_num_seqs (8) with an ample pool (iteration-level scheduling alone);
2. KV waste of the paged pool against a contiguous reservation of max_model_len (and of the
   trace's longest request) per sequence, on the same trace;
3. the share of step time spent outside the model (scheduling, sampling, Python);
4. while a long prompt (2,048 tokens, or what the context allows) is prefilled in chunks, the
   running requests' p99 inter-token latency against their median;
5. prefix caching on a shared-system-prompt workload: prefill tokens with and without it;
6. optionally, Hugging Face transformers `generate` on the same trace in static batches of 8.

    python bench/decode.py --plan build/smollm2.plan [--hf-model DIR] [--static-batch 8] [--max-num-seqs 64]
    python bench/decode.py --fake        # the fake runner with a cost model: runs anywhere

Results: bench/results/decode-<date>.json (--fake) or decode-<plan name>-<date>.json, and its
markdown tables beside it (.md); --doc FILE writes the tables there instead (docs/decode-benchmark.md
is assembled by hand from such runs: writing it whole would drop its other sections).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from infc.compiler.runtime.engine import Engine, EngineConfig
from infc.compiler.runtime.fake_runner import FakeRunner, StepCost
from infc.compiler.runtime.metrics import percentiles_ms
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.scheduler_config import SchedulerConfig
from infc.compiler.runtime.sequence import Request
from infc.compiler.runtime.workload import synthetic

ROOT = Path(__file__).resolve().parent.parent
# cpu: this process's CPU time, steadier than wall time on a shared machine (BLAS limited to one
# thread then, so spinning worker threads do not count); every request arrives at once here.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# The fake runner's cost: a memory-bound step (weights read once per step) plus compute per token
# and attention reads per token of context; roughly a small model on a CPU.
FAKE_COST = StepCost(per_step_s=0.005, per_token_s=0.00005, per_context_token_s=0.0000001)


def runner_factory(args):
    if args.fake:
        return lambda: FakeRunner(cost=FAKE_COST, is_virtual_time=True)
    from infc.compiler.runtime.model_runner import load_model_runner

    return lambda: load_model_runner(args.plan)


def serve(factory, requests, args, static=False, prefix_caching=True, max_num_batched_tokens=None, on_step=None,
          max_num_seqs=None, itl_factor=EngineConfig.itl_factor, num_blocks=None):
    runner = factory()
    profile = getattr(runner, "decode_profile", None) or {}
    max_num_seqs = max_num_seqs or args.max_num_seqs
    budget = max(max_num_batched_tokens or profile.get("max_num_batched_tokens", 512), max_num_seqs)
    num_blocks = num_blocks or args.num_kv_blocks or profile.get("num_kv_blocks") or 2048
    config = EngineConfig(SchedulerConfig(max_num_seqs, budget, static_batching=static), num_blocks, prefix_caching,
                          itl_factor=itl_factor)
    engine = Engine(runner, config, clock=runner.clock if args.fake else CLOCKS[args.clock])
    seqs = engine.run(requests, on_step=on_step)
    failed = [s.error for s in seqs if s.error]
    if failed:
        sys.exit(f"error: {len(failed)} requests failed: {failed[0]}")
    return engine, seqs, engine.summary(seqs)


def trace(spec, num_requests=64, max_len=256, seed=0):
    return synthetic(num_requests, (16, max_len), (16, max_len), spec.vocab_size, seed=seed, avoid_ids=spec.eos_token_ids)


def same_kv_budget_blocks(spec, args) -> int:
    """The KV memory of `--static-batch` contiguous caches of the trace's longest possible request."""
    longest = 2 * args.max_len  # prompt and output lengths are at most max_len each
    return args.static_batch * -(-longest // spec.block_size)


def batching_and_kv(factory, args, spec, max_num_seqs, num_blocks=None):
    """Both modes, alternating, args.repeats times each; each mode keeps its fastest run (the machine is shared)."""
    requests = trace(spec, args.num_requests, args.max_len)
    rows, outputs = {}, {}
    for _ in range(args.repeats):
        for name, static in (("continuous", False), ("static", True)):
            engine, seqs, summary = serve(factory, requests, args, static=static, max_num_seqs=max_num_seqs,
                                          num_blocks=num_blocks)
            if name in rows and rows[name]["duration_s"] <= summary["duration_s"]:
                continue
            row = rows[name] = {k: summary[k] for k in ("output_tokens", "duration_s", "output_tok_s", "preemptions", "steps",
                                                        "kv_waste_pct", "contiguous_kv_waste_pct", "outside_model_pct")}
            row.update(ttft_ms_p50=summary["ttft_ms"]["p50"], tpot_ms_p50=summary["tpot_ms"]["p50"],
                       output_tokens_per_step=summary["output_tokens"] / max(summary["steps"], 1),
                       itl_ms_p99=summary["itl_ms"]["p99"], num_kv_blocks=engine.blocks.num_blocks,
                       max_num_seqs=engine.scheduler.config.max_num_seqs,
                       max_num_batched_tokens=engine.scheduler.config.max_num_batched_tokens)
            # a contiguous reservation of the trace's longest request (the kindest static reservation)
            longest = max(len(s.prompt_ids) + s.params.max_tokens for s in seqs)
            seq_steps = engine.stats.contiguous_slots / spec.max_model_len
            row["contiguous_trace_max_waste_pct"] = 100 * (1 - engine.stats.used_slots / (seq_steps * longest))
            outputs[name] = [s.output_ids for s in seqs]
    ratio = rows["continuous"]["output_tok_s"] / rows["static"]["output_tok_s"]
    return {"rows": rows, "continuous_over_static": ratio, "same_tokens": outputs["continuous"] == outputs["static"],
            "repeats": args.repeats, "requests": requests}


def step_ratio_sweep(spec, args, sizes=(4, 8, 16, 32)):
    """Static / continuous step counts on the same trace with a free model: the most continuous
    batching can gain when a step costs the same whatever its size."""
    ratios = {}
    for max_num_seqs in sizes:
        steps = []
        for static in (False, True):
            engine = Engine(FakeRunner(dataclasses.replace(spec, vocab_size=257, eos_token_ids=(256,))),
                            EngineConfig(SchedulerConfig(max_num_seqs, 512, static_batching=static), 4096))
            engine.run(trace(engine.spec, args.num_requests, args.max_len))
            steps.append(engine.stats.num_steps)
        ratios[max_num_seqs] = {"continuous_steps": steps[0], "static_steps": steps[1], "ratio": steps[1] / steps[0]}
    return ratios


def long_prompt(factory, args, spec, chunk_tokens, itl_factor, num_running=8):
    """Requests decode; at step 10 a long prompt arrives and is prefilled in chunks of what the
    decodes leave of max_num_batched_tokens, capped by decode priority when itl_factor is set. ITLs of the running requests whose token landed
    while it was being prefilled, against the median of all their ITLs."""
    rng = np.random.default_rng(1)
    long_len = min(2048, spec.max_model_len - 16)
    background = [Request(prompt_ids=rng.integers(3, spec.vocab_size - 1, 32).tolist(),
                          params=SamplingParams(max_tokens=min(256, spec.max_model_len - 40), ignore_eos=True))
                  for _ in range(num_running)]
    state = {}

    def on_step(engine):
        if engine.stats.num_steps == 10:
            long = Request(prompt_ids=rng.integers(3, spec.vocab_size - 1, long_len).tolist(), params=SamplingParams(max_tokens=4))
            state["long"] = engine.add_request(long)

    _, seqs, _ = serve(factory, background, args, max_num_batched_tokens=chunk_tokens, on_step=on_step,
                       max_num_seqs=num_running + 1, itl_factor=itl_factor)
    long_seq = state["long"]
    window = (long_seq.first_scheduled_s, long_seq.first_token_s)
    gaps = [(b - a, b) for s in seqs for a, b in zip(s.token_times_s, s.token_times_s[1:])]
    in_window = [gap for gap, at in gaps if window[0] < at <= window[1]]
    median = float(np.median([gap for gap, _ in gaps])) * 1e3
    p99_window = percentiles_ms(in_window)["p99"]
    return {"long_prompt_tokens": long_len, "chunk_budget_tokens": chunk_tokens, "itl_factor": itl_factor,
            "running_requests": num_running,
            "long_prompt_ttft_ms": (long_seq.first_token_s - long_seq.arrival_s) * 1e3,
            "prefill_steps": sum(1 for _, at in gaps if window[0] < at <= window[1]) // num_running,
            "itl_median_ms": median, "itl_p99_during_prefill_ms": p99_window,
            "itl_p99_all_ms": percentiles_ms(g for g, _ in gaps)["p99"], "p99_over_median": p99_window / median}


def prefix_sharing(factory, args, spec, num_requests=32, system_len=192):
    rng = np.random.default_rng(2)
    system = rng.integers(3, spec.vocab_size - 1, system_len).tolist()
    requests = [Request(prompt_ids=system + rng.integers(3, spec.vocab_size - 1, int(rng.integers(16, 65))).tolist(),
                        params=SamplingParams(max_tokens=16, ignore_eos=True)) for _ in range(num_requests)]
    prefill = {}
    for caching in (False, True):
        _, seqs, summary = serve(factory, requests, args, prefix_caching=caching)
        prefill[caching] = summary["prefill_tokens"]
    total = sum(len(r.prompt_ids) for r in requests)
    return {"requests": num_requests, "system_prompt_tokens": system_len, "prompt_tokens": total,
            "prefill_tokens_without": prefill[False], "prefill_tokens_with": prefill[True],
            "cut_pct": 100 * (1 - prefill[True] / prefill[False]),
            "repeated_prefix_pct": 100 * (num_requests - 1) * system_len / total}


def hf_generate(path: str, requests, clock, batch_size=8):
    """transformers `generate`, greedy, static batches of 8 (left padded), EOS ignored."""
    import torch
    from transformers import AutoModelForCausalLM

    if clock is time.process_time:
        torch.set_num_threads(1)  # like the plan's single BLAS thread: CPU time compares like with like

    path = Path(path)
    model = (AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32) if path.suffix == ".gguf"
             else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).eval()
    pad = 0
    num_tokens, start = 0, clock()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch])
        new = max(r.params.max_tokens for r in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad)
        num_tokens += sum(r.params.max_tokens for r in batch)  # only the tokens each request asked for count
    duration = clock() - start
    return {"output_tokens": num_tokens, "duration_s": duration, "output_tok_s": num_tokens / duration}


def markdown(results) -> str:
    lines = [f"# Decode loop benchmark ({results['date']})", "",
             f"Command: `{results['command']}` on {results['machine']}; runner: {results['runner']}; times are "
             + {"cpu": "this process's CPU time, all its threads (BLAS on one, large GEMMs shared with a helper).",
                "wall": "wall-clock time.",
                "virtual": "the process's CPU time plus the fake runner's modelled step cost "
                           f"({FAKE_COST.per_step_s * 1e3:g} ms a step, {FAKE_COST.per_token_s * 1e3:g} ms a token, "
                           f"{FAKE_COST.per_context_token_s * 1e6:g} us a token of context)."}[results["clock"]], ""]
    b = results.get("batching")
    if b:
        lines += [f"Workload: {b['num_requests']} requests, prompt and output lengths uniform in [16, {b['max_len']}] "
                  f"(seed 0), EOS ignored, all arriving at once; both modes use the same runner; fastest of {b['repeats']} "
                  "alternating runs each. A static batch is formed first come first served and held until its longest "
                  "member finishes; it reserves one contiguous cache row per member at its longest member's length.", ""]
    for key, title in (("batching", "Same KV budget: the memory of {static_batch} contiguous caches of the trace's longest "
                                    "request ({blocks} blocks of 16 tokens); continuous batching admits up to max_num_seqs "
                                    "{seqs} into it, static batches hold as many as fit"),
                       ("batching_same_seqs", "Same max_num_seqs ({seqs}) and an ample pool ({blocks} blocks): "
                                              "iteration-level scheduling alone")):
        part = results.get(key)
        if not part:
            continue
        c = part["rows"]["continuous"]
        lines += [title.format(static_batch=results.get("static_batch"), blocks=c["num_kv_blocks"], seqs=c["max_num_seqs"]) + ":", "",
                  "| batching | output tok/s | duration s | steps | output tokens a step | preemptions | TTFT p50 ms | TPOT p50 ms "
                  "| ITL p99 ms | KV waste paged % | contiguous max_model_len % | contiguous trace-max % | outside model % |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in part["rows"].items():
            lines.append(f"| {name} | {r['output_tok_s']:.1f} | {r['duration_s']:.2f} | {r['steps']} "
                         f"| {r.get('output_tokens_per_step', 0):.1f} | {r['preemptions']} "
                         f"| {r['ttft_ms_p50']:.1f} | {r['tpot_ms_p50']:.2f} | {r['itl_ms_p99']:.2f} | {r['kv_waste_pct']:.2f} "
                         f"| {r['contiguous_kv_waste_pct']:.1f} | {r['contiguous_trace_max_waste_pct']:.1f} "
                         f"| {r['outside_model_pct']:.1f} |")
        if key == "batching" and results.get("hf_generate"):
            h = results["hf_generate"]
            lines.append(f"| HF transformers generate, static batches of 8 | {h['output_tok_s']:.1f} | {h['duration_s']:.2f} "
                         "| | | | | | | | | | |")
        lines += ["", f"Continuous / static: **{part['continuous_over_static']:.2f}x** output tokens/s "
                  f"(max_num_batched_tokens {c['max_num_batched_tokens']}); same tokens in both modes: {part['same_tokens']}.", ""]
    h = results.get("hf_generate")
    if h and not b:
        lines += ["| reference | output tok/s | duration s |", "|---|---|---|",
                  f"| HF transformers generate, static batches of 8 | {h['output_tok_s']:.1f} | {h['duration_s']:.2f} |", ""]
    for r in results.get("long_prompt", [])[:1]:
        lines += [f"Long prompt: {r['long_prompt_tokens']} tokens arrive while {r['running_requests']} requests decode, "
                  "and are prefilled in chunks of what the decodes leave of the step's token budget, with decode priority "
                  "(the prefill tokens of a step with decodes capped so that the step stays within the ITL factor of a "
                  "decode-only step, from the engine's online step-cost fit) or without:", "",
                  "| token budget | ITL factor | prefill steps | long prompt TTFT ms | running ITL median ms | ITL p99 during the prefill ms "
                  "| p99 / median | ITL p99 over the run ms |", "|---|---|---|---|---|---|---|---|"]
    for r in results.get("long_prompt", []):
        lines.append(f"| {r['chunk_budget_tokens']} | {r['itl_factor'] or 'off'} | {r['prefill_steps']} | {r['long_prompt_ttft_ms']:.0f} "
                     f"| {r['itl_median_ms']:.2f} | {r['itl_p99_during_prefill_ms']:.2f} | **{r['p99_over_median']:.2f}x** "
                     f"| {r['itl_p99_all_ms']:.2f} |")
    if results.get("long_prompt"):
        lines.append("")
    sweep = results.get("step_ratio_sweep")
    if sweep:
        lines += ["Static / continuous steps on the same trace with a free model (the gain when a step costs the same "
                  "whatever its size), by max_num_seqs: " + ", ".join(
                      f"{n}: {r['static_steps']}/{r['continuous_steps']} = {r['ratio']:.2f}x" for n, r in sweep.items()) + ".", ""]
    px = results.get("prefix_caching")
    if px:
        lines += [f"Prefix caching: {px['requests']} requests behind a {px['system_prompt_tokens']}-token system prompt "
                  f"({px['prompt_tokens']} prompt tokens): prefill {px['prefill_tokens_without']} tokens without, "
                  f"{px['prefill_tokens_with']} with: cut **{px['cut_pct']:.1f}%** (repeated prefix share "
                  f"{px['repeated_prefix_pct']:.1f}%).", ""]
    return "\n".join(lines)


PARTS = ("batching", "long_prompt", "prefix", "sweep")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", help="a decoder plan (infc build with a decode: profile)")
    source.add_argument("--fake", action="store_true",
                        help="the fake runner with a CPU-like cost model, on a virtual clock (its cost is not slept)")
    parser.add_argument("--static-batch", type=int, default=8,
                        help="the same-KV-budget comparison's pool: this many contiguous caches of the trace's longest request; "
                             "also max_num_seqs of the same-max_num_seqs comparison")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="max_num_seqs of the same-KV-budget comparison")
    parser.add_argument("--num-kv-blocks", type=int, help="default: the plan's profile (2048 for --fake)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=256, help="prompt and output lengths are uniform in [16, MAX_LEN]")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each batching mode, alternating; the fastest counts")
    parser.add_argument("--chunk-tokens", default="512", help="token budgets of a step in the long-prompt test (comma separated)")
    parser.add_argument("--itl-factors", default="off,1.5",
                        help="decode-priority ITL factors in the long-prompt test (comma separated; off: no cap)")
    parser.add_argument("--hf-model", help="a transformers model folder or .gguf for the HF generate reference")
    parser.add_argument("--comparisons", default="same-kv,same-seqs",
                        help="which continuous-vs-static comparisons the batching part runs")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)} to run")
    parser.add_argument("--output", help="results JSON (default bench/results/decode[-<plan name>]-<date>.json)")
    parser.add_argument("--doc", help="markdown tables (default: beside the results JSON)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="cpu: time by this process's CPU time (a shared, loaded machine; not with --fake)")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither results nor docs")
    args = parser.parse_args()
    if args.clock == "cpu" and args.fake:
        parser.error("--clock: the fake runner has its own (virtual) clock")
    if args.clock == "cpu":
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    parts = set(args.parts.split(","))
    factory = runner_factory(args)
    spec = factory().spec
    date = datetime.date.today().isoformat()
    results = {"date": date, "command": "python bench/decode.py " + " ".join(sys.argv[1:]),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "runner": "fake (cost model)" if args.fake else f"plan {args.plan}",
               "clock": "virtual" if args.fake else args.clock,
               "spec": dataclasses.asdict(spec)}
    results["static_batch"] = args.static_batch
    if "batching" in parts:
        settings = (("batching", "same-kv", args.max_num_seqs, same_kv_budget_blocks(spec, args)),
                    ("batching_same_seqs", "same-seqs", args.static_batch, None))
        for key, _, max_num_seqs, num_blocks in (s for s in settings if s[1] in args.comparisons.split(",")):
            batching = batching_and_kv(factory, args, spec, max_num_seqs, num_blocks)
            batching.pop("requests")
            results[key] = {**batching, "num_requests": args.num_requests, "max_len": args.max_len}
            print(key, json.dumps(results[key]["rows"], default=str), flush=True)
    if args.hf_model:
        try:
            results["hf_generate"] = hf_generate(args.hf_model, trace(spec, args.num_requests, args.max_len), CLOCKS[args.clock])
        except Exception as exc:  # noqa: BLE001 - the reference is optional; keep the measured parts
            print(f"HF generate failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if "long_prompt" in parts:
        factors = [None if f == "off" else float(f) for f in args.itl_factors.split(",")]
        results["long_prompt"] = [long_prompt(factory, args, spec, int(budget), factor)
                                  for budget in args.chunk_tokens.split(",") for factor in factors]
    if "prefix" in parts:
        results["prefix_caching"] = prefix_sharing(factory, args, spec)
    if "sweep" in parts:
        results["step_ratio_sweep"] = step_ratio_sweep(spec, args)
    text = markdown(results)
    print(text)
    if not args.no_write:
        (ROOT / "bench" / "results").mkdir(exist_ok=True)
        name = f"decode-{date}.json" if args.fake else f"decode-{Path(args.plan).stem}-{date}.json"
        output = Path(args.output or ROOT / "bench" / "results" / name)
        output.write_text(json.dumps(results, indent=2, default=str))
        Path(args.doc or output.with_suffix(".md")).write_text(text + "\n")


if __name__ == "__main__":
    main()
