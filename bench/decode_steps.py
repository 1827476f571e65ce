"""Decode step time of several decoder plans of one model, side by side: fp32 against w8 or an int4
conversion, say. Each plan runs in its own process (one plan's weights would evict another's from
the caches), the plans take turns for `--rounds` rounds, and the median step counts.

    python bench/decode_steps.py build/smollm2.plan build/smollm2_w8.plan [--batches 1,4,8] [--rounds 3]

A round: load the plan, prefill `--context` tokens per sequence, then time `--steps` decode steps of
one token per sequence at each batch size. Prints each plan's median step time and its ratio to the
first plan's; writes bench/results/decode_steps-<first plan>-<date>.json (or --output).

`--base-code DIR` also runs every plan on another checkout of infc (DIR holds it as DIR/infc, e.g. from
`git archive COMMIT | tar -x -C DIR/infc`), in turns with this one: a code change's effect on the same
plans, each row then also as "<plan> @base". Step times are wall time; `--clock cpu` takes the process's
CPU time (all threads), steadier on a loaded machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = r"""
import json, sys, time
clock = time.process_time if sys.argv[5] == "cpu" else time.perf_counter
from infc.compiler.runtime.decode_api import SeqChunk
from infc.compiler.runtime.model_runner import load_model_runner
plan, batches, context, steps = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
runner = load_model_runner(plan)
per_seq = -(-(context + steps + 1) // runner.spec.block_size)
runner.allocate_kv(per_seq * max(batches))
runner.warm_up()
times = {}
for batch in batches:
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    runner.step([SeqChunk(i, [(7 * i + j) % 200 + 10 for j in range(context)], 0, tables[i], False) for i in range(batch)])
    took = []
    for step in range(steps):
        chunks = [SeqChunk(i, [5], context + step, tables[i], True) for i in range(batch)]
        started = clock()
        runner.step(chunks)
        took.append(clock() - started)
    times[batch] = took
print(json.dumps(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--context", type=int, default=128, help="prompt tokens prefilled per sequence")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per batch size and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base-code", type=Path, help="a folder holding another checkout of infc as infc/")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.base_code is not None and not (args.base_code / "infc" / "__init__.py").is_file():
        parser.error(f"--base-code {args.base_code}: no infc/__init__.py there")
    sides = [("", None)] + ([(" @base", str(args.base_code.resolve()))] if args.base_code is not None else [])
    runs = [(f"{p}{tag}", p, code) for p in args.plans for tag, code in sides]
    samples = {name: {b: [] for b in batches} for name, _, _ in runs}
    for round_ in range(args.rounds):
        for name, plan, code in runs:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))) if code else None
            done = subprocess.run([sys.executable, "-c", ROUND, str(plan), args.batches, str(args.context), str(args.steps),
                                   args.clock], check=True, capture_output=True, text=True, env=env)
            for batch, took in json.loads(done.stdout.strip().splitlines()[-1]).items():
                samples[name][int(batch)] += took
            print(f"round {round_ + 1}: {Path(name).name} done", file=sys.stderr)
    medians = {p: {b: statistics.median(t) * 1e3 for b, t in by_batch.items()} for p, by_batch in samples.items()}
    first = runs[0][0]
    print("| plan | " + " | ".join(f"batch {b} step ms (x first)" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for plan in medians:
        cells = [f"{medians[plan][b]:.1f} ({medians[plan][b] / medians[first][b]:.2f})" for b in batches]
        print(f"| {Path(plan).name} | " + " | ".join(cells) + " |")
    today = datetime.date.today().isoformat()
    output = args.output or Path(__file__).parent / "results" / f"decode_steps-{args.plans[0].stem}-{today}.json"
    output.write_text(json.dumps({"date": today, "context": args.context, "steps": args.steps, "rounds": args.rounds,
                                  "clock": args.clock, "base_code": str(args.base_code) if args.base_code else None,
                                  "median_step_ms": medians}, indent=1) + "\n")
    print(f"wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
