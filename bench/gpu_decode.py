#!/usr/bin/env python
"""Decoder plans on the GPU against the same model's CPU plan, side by side in one process: the
continuous-batching engine serves the same greedy requests from a `--target cuda` plan and a
`--target cpu` plan; prints token agreement and the ratios of TPOT, TTFT and throughput.

    python bench/gpu_decode.py                                   # the llama fixture (+ SmolLM2 if exported)
    python bench/gpu_decode.py --model build/smollm2/model.onnx --profile profiles/smollm2_decode.yaml

Also a section of bench/gpu_check.py ("serve"). Needs CuPy and a device; the device path is checked
on a stand-in in CI (tests/cuda/test_decoder_cuda.py), so this is where its speed is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ((ROOT / "tests/models/llama_ts.onnx", ROOT / "profiles/llama_decode.yaml"),
          (ROOT / "build/smollm2/model.onnx", ROOT / "profiles/smollm2_decode.yaml"))


def serve(plan: Path, prompts: list[list[int]], output_len: int, max_num_seqs: int) -> dict:
    from infc.compiler.runtime.engine import Engine, EngineConfig  # noqa: PLC0415
    from infc.compiler.runtime.model_runner import load_model_runner  # noqa: PLC0415
    from infc.compiler.runtime.sampler import SamplingParams  # noqa: PLC0415
    from infc.compiler.runtime.scheduler_config import SchedulerConfig  # noqa: PLC0415
    from infc.compiler.runtime.sequence import Request  # noqa: PLC0415

    runner = load_model_runner(plan)
    blocks = len(prompts) * -(-(max(map(len, prompts)) + output_len) // runner.spec.block_size) + 1
    engine = Engine(runner, EngineConfig(SchedulerConfig(max_num_seqs=max_num_seqs), num_kv_blocks=blocks))
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    seqs = engine.run([Request(prompt_ids=p, params=params) for p in prompts])
    summary = engine.summary(seqs)
    return {"tokens": [s.output_ids for s in seqs], **{k: summary.get(k) for k in
            ("tpot_ms", "ttft_ms", "output_tok_s", "duration_s", "steps")}}


def compare(model: Path, profile: Path, folder: Path, cache_dir: Path, requests: int, input_len: int,
            output_len: int, seed: int) -> dict:
    from infc.compiler.build import BuildOptions, build  # noqa: PLC0415
    from infc.compiler.plan.format import read_plan  # noqa: PLC0415

    record: dict = {"model": str(model.relative_to(ROOT) if model.is_relative_to(ROOT) else model)}
    plans = {}
    for target in ("cuda", "cpu"):
        plans[target] = folder / f"{model.stem}-{target}.plan"
        start = time.perf_counter()
        build(str(model), str(profile), str(plans[target]),
              BuildOptions(target=target, use_cache=False, cache_dir=cache_dir, show_progress=False), print)
        record[f"{target}_build_s"] = round(time.perf_counter() - start, 2)
    record["self_check"] = read_plan(plans["cuda"]).meta["cuda"]["self_check"]
    rng = np.random.default_rng(seed)
    vocab = read_plan(plans["cpu"]).meta["decoder"]["vocab_size"]
    prompts = [rng.integers(0, vocab, input_len).tolist() for _ in range(requests)]
    runs = {target: serve(plan, prompts, output_len, max_num_seqs=requests) for target, plan in plans.items()}
    pairs = [(a, b) for x, y in zip(runs["cuda"]["tokens"], runs["cpu"]["tokens"]) for a, b in zip(x, y)]
    record["greedy_agreement"] = sum(a == b for a, b in pairs) / max(1, len(pairs))
    for target, run in runs.items():
        record[target] = {k: v for k, v in run.items() if k != "tokens"}

    def p50(run, key):
        value = run.get(key)
        return value.get("p50") if isinstance(value, dict) else value

    for key in ("tpot_ms", "ttft_ms", "output_tok_s"):
        gpu, cpu = p50(record["cuda"], key), p50(record["cpu"], key)
        record[f"{key}_cpu_over_gpu" if key != "output_tok_s" else "output_tok_s_gpu_over_cpu"] = \
            (cpu / gpu if key != "output_tok_s" else gpu / cpu) if gpu and cpu else None
    return record


def measure(folder: Path, cache_dir: Path, models=MODELS, requests: int = 8, input_len: int = 64,
            output_len: int = 32, seed: int = 0) -> list[dict]:
    records = []
    for model, profile in models:
        if not model.is_file():
            records.append({"model": str(model), "skipped": "not exported (scripts/export_smollm2.py)"})
            continue
        try:
            records.append(compare(model, profile, folder, cache_dir, requests, input_len, output_len, seed))
        except Exception:  # noqa: BLE001 - record it; other models and sections go on
            records.append({"model": str(model), "error": traceback.format_exc()[-1500:]})
        print(f"  serve {model.name}: {json.dumps({k: v for k, v in records[-1].items() if k not in ('cuda', 'cpu')})[:400]}")
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the records here as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import import_infc  # noqa: PLC0415

    import_infc()
    models = ((args.model, args.profile),) if args.model else MODELS
    with tempfile.TemporaryDirectory(prefix="infc-gpu-decode-") as tmp:
        records = measure(Path(tmp), ROOT / "cache", models, args.requests, args.input_len, args.output_len)
    if args.out:
        args.out.write_text(json.dumps(records, indent=1))
    for r in records:
        print(f"{r['model']}: agreement {r.get('greedy_agreement')}, TPOT cpu/gpu {r.get('tpot_ms_cpu_over_gpu')}, "
              f"throughput gpu/cpu {r.get('output_tok_s_gpu_over_cpu')} {r.get('error', r.get('skipped', ''))[-200:]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
