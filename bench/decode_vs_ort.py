"""Decoder step latency, infc's plan against onnxruntime running the same export, side by side.

For each batch size B: B prompts of `--prompt-len` random tokens are prefilled together, then
`--output-len` greedy decode steps follow, one token per sequence. infc runs its decoder plan
(paged KV cache, batch-invariant GEMMs) step by step through the model runner, as `infc run` does;
onnxruntime runs the exported model with its past/present key-value tensors, its usual generation
loop (all cores, default settings). Reported per side: prefill time, the median decode step (TPOT
of every sequence) and decode tokens/s; then infc / onnxruntime ratios (below 1: infc is faster),
and whether the greedy tokens agree. Sides alternate, `--repeats` times; the fastest run counts.

    python bench/decode_vs_ort.py --plan build/smollm2.plan --model build/smollm2/model.onnx

The export must take input_ids and attention_mask (position_ids when it has them) and past key
values [batch, kv_heads, past, head_dim] named past_key_values.* / past.* with matching present.*
outputs, as Optimum and torch.onnx exports of Hugging Face decoders do.
Results: bench/results/decode_vs_ort-<plan name>-<date>.json (or --output).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.model_runner import load_model_runner

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
         "tensor(int32)": np.int32}


def infc_loop(runner, prompts: np.ndarray, output_len: int) -> tuple[float, list[float], np.ndarray]:
    """(prefill s, decode step s each, greedy tokens [B, output_len]) through the plan's runner."""
    batch, length = prompts.shape
    size = runner.spec.block_size
    per_seq = -(-(length + output_len) // size)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    chunks = [SeqChunk(i, prompts[i].tolist(), 0, tables[i], True) for i in range(batch)]
    start = time.perf_counter()
    logits = runner.step(chunks)
    prefill = time.perf_counter() - start
    tokens, steps = [logits.argmax(-1)], []
    for index in range(output_len - 1):
        chunks = [SeqChunk(i, [int(tokens[-1][i])], length + index, tables[i], True) for i in range(batch)]
        start = time.perf_counter()
        logits = runner.step(chunks)
        steps.append(time.perf_counter() - start)
        tokens.append(logits.argmax(-1))
    return prefill, steps, np.stack(tokens, 1)


class OrtLoop:
    def __init__(self, model: str, head_dim: int):
        self.session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past = [name for name in inputs if name.startswith(("past_key_values", "past."))]
        if not self.past or "input_ids" not in inputs:
            raise SystemExit(f"error: {model}: needs input_ids and past key/value inputs (past_key_values.* or past.*)")
        self.outputs = outputs = [o.name for o in self.session.get_outputs()]
        self.present = [name for name in outputs if name.startswith("present")]
        if len(self.present) != len(self.past):
            raise SystemExit(f"error: {model}: {len(self.past)} past inputs but {len(self.present)} present outputs")
        self.logits = outputs.index("logits") if "logits" in outputs else 0
        first = inputs[self.past[0]]
        # (heads, width) per past input: a latent cache (DeepSeek's MLA) has keys and values of other widths
        self.dims = {name: (inputs[name].shape[1], inputs[name].shape[3] if isinstance(inputs[name].shape[3], int)
                            else head_dim) for name in self.past}  # genai: 'kv_cache_dim'
        self.kv_type = TYPES[first.type]
        self.has_positions = "position_ids" in inputs
        self.mask_type = TYPES[inputs["attention_mask"].type] if "attention_mask" in inputs else None

    def run(self, prompts: np.ndarray, output_len: int) -> tuple[float, list[float], np.ndarray]:
        batch, length = prompts.shape
        past = {name: np.zeros((batch, heads, 0, width), self.kv_type) for name, (heads, width) in self.dims.items()}
        ids, position, times, tokens = prompts.astype(np.int64), 0, [], []
        for _ in range(output_len):
            feeds = {"input_ids": ids, **past}
            width = ids.shape[1]
            if self.mask_type is not None:
                feeds["attention_mask"] = np.ones((batch, position + width), self.mask_type)
            if self.has_positions:
                feeds["position_ids"] = np.tile(np.arange(position, position + width, dtype=np.int64), (batch, 1))
            start = time.perf_counter()
            results = self.session.run(None, feeds)
            times.append(time.perf_counter() - start)
            past = {p: results[self.outputs.index(q)] for p, q in zip(self.past, self.present)}
            tokens.append(results[self.logits][:, -1].argmax(-1))
            ids, position = tokens[-1][:, None].astype(np.int64), position + width
        return times[0], times[1:], np.stack(tokens, 1)


def summarize(prefill: float, steps: list[float], batch: int) -> dict:
    tpot = float(np.median(steps))
    return {"prefill_ms": prefill * 1e3, "tpot_ms": tpot * 1e3, "decode_tok_s": batch / tpot}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="a decoder plan (infc build with a decode: profile)")
    parser.add_argument("--model", required=True, help="the ONNX export with past key values the plan was built from")
    parser.add_argument("--batches", default="1,4,8", help="batch sizes, comma separated")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", help="results JSON (default bench/results/decode_vs_ort-<plan>-<date>.json)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    runner = load_model_runner(args.plan)
    batches = [int(b) for b in args.batches.split(",")]
    per_seq = -(-(args.prompt_len + args.output_len) // runner.spec.block_size)
    runner.allocate_kv(max(batches) * per_seq + 2)
    runner.warm_up()
    loop = OrtLoop(args.model, runner.spec.head_dim)
    vocab = runner.spec.vocab_size
    rows = []
    for batch in batches:
        prompts = np.random.default_rng(batch).integers(100, min(vocab, 20000), (batch, args.prompt_len))
        best = {}
        for _ in range(args.repeats):
            for side, run in (("infc", lambda: infc_loop(runner, prompts, args.output_len)),
                              ("onnxruntime", lambda: loop.run(prompts, args.output_len))):
                prefill, steps, tokens = run()
                result = summarize(prefill, steps, batch)
                if side not in best or result["tpot_ms"] < best[side][0]["tpot_ms"]:
                    best[side] = (result, tokens)
        agree = float(np.mean(best["infc"][1] == best["onnxruntime"][1]))
        row = {"batch": batch, "infc": best["infc"][0], "onnxruntime": best["onnxruntime"][0],
               "tpot_ratio": best["infc"][0]["tpot_ms"] / best["onnxruntime"][0]["tpot_ms"],
               "prefill_ratio": best["infc"][0]["prefill_ms"] / best["onnxruntime"][0]["prefill_ms"],
               "greedy_agreement": agree}
        rows.append(row)
        print(f"batch {batch}: TPOT infc {row['infc']['tpot_ms']:.1f} ms, onnxruntime {row['onnxruntime']['tpot_ms']:.1f} ms "
              f"({row['tpot_ratio']:.2f}x); prefill {row['infc']['prefill_ms']:.0f} / {row['onnxruntime']['prefill_ms']:.0f} ms "
              f"({row['prefill_ratio']:.2f}x); greedy tokens agree {agree:.0%}", flush=True)

    print("\n| batch | infc TPOT ms | onnxruntime TPOT ms | TPOT infc/ORT | infc prefill ms | ORT prefill ms | prefill infc/ORT | greedy agree |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['infc']['tpot_ms']:.1f} | {r['onnxruntime']['tpot_ms']:.1f} | **{r['tpot_ratio']:.2f}** | "
              f"{r['infc']['prefill_ms']:.0f} | {r['onnxruntime']['prefill_ms']:.0f} | {r['prefill_ratio']:.2f} | {r['greedy_agreement']:.0%} |")
    if not args.no_write:
        date = datetime.date.today().isoformat()
        out = Path(args.output or ROOT / "bench" / "results" / f"decode_vs_ort-{Path(args.plan).stem}-{date}.json")
        out.write_text(json.dumps({"date": date, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                                   "onnxruntime": ort.__version__, "plan": args.plan, "model": args.model,
                                   "prompt_len": args.prompt_len, "output_len": args.output_len, "rows": rows},
                                  indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
