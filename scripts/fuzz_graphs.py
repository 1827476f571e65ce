"""Differential fuzzing: random small ONNX graphs through `infc optimize` and `infc build`, each
checked against onnxruntime on the original graph.

Single-op conformance is the ONNX backend node tests' job (docs/backend-node-tests.md); what they
cannot reach is how ops combine: a fusion that fires on a chain it should not, a layout pass that
moves a transpose past an op that cares, a kernel fed a strided view, a shape solved at one size
and wrong at another. Each graph draws 3-16 ops from OPS (rules as data: an op applies to a tensor
of some rank and returns the new tensor's shape and which of its axes vary) over one input whose
batch, and sometimes its length or height and width, are symbolic; it branches off earlier values
and exposes every unused value (and sometimes an interior one). Checked:

  optimize   the optimized model in onnxruntime (its own optimizations on) at min, opt and max;
  plan       a CPU plan on infc's own kernels (no whole-model variant, no fallback where it builds)
             at the profile's min, opt and max shapes.

A difference past 1e-4 of an output's largest value is a finding only when infc is also ten times
farther from a float64 run of the model than onnxruntime's float32 run is: random graphs make
ill-conditioned outputs (rounding noise over sqrt(eps), 1 + erf(-5)) where onnxruntime's own
float32 answer is no more right than infc's.

    python scripts/fuzz_graphs.py --seeds 0-199 [--keep DIR] [--json]

A failing seed prints one line and, with --keep, leaves its model and profile in DIR.

The pieces live in scripts/fuzz/: graph.py (the graph a seed grows), ops_*.py (the op forms),
table.py (the op table, as data), builder.py (a seed's model and shapes), reference.py (the float64
run), check.py (optimize and build, judged).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fuzz package beside this script

from fuzz.builder import _feeds, random_case, random_model  # noqa: E402,F401 - the names tests and users import
from fuzz.check import check_precision, check_seed, run_one  # noqa: E402,F401
from fuzz.reference import as_double, run_double  # noqa: E402,F401


def _seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-49", help="e.g. 0-199 or 3,17,40-45")
    parser.add_argument("--keep", type=Path, help="leave failing seeds' models and profiles here")
    parser.add_argument("--json", action="store_true", help="one JSON object per seed on stdout")
    parser.add_argument("--forms", choices=("all", "wide", "edge", "old", "classic"), default="all",
                        help="classic: only the first op table, no opset or float16 variants (the seeds of before); "
                        "wide: the table before the dtype and broadcasting forms; edge: those forms beside the first table; old: forms opsets 7-12 have, written there")
    parser.add_argument("--precision", choices=("fp16", "bf16"), help="check reduced-precision plans instead: "
                        "within their tolerance on fresh inputs, or saying they are not")
    args = parser.parse_args()
    failures = 0
    worker = None  # one process the seeds run in; a native crash (onnxruntime aborting) takes only it down
    for seed in _seeds(args.seeds):
        worker = worker or ProcessPoolExecutor(max_workers=1)
        try:
            result = worker.submit(run_one, seed, args.forms, args.precision).result()
        except BrokenProcessPool:
            result = {"seed": seed, "error": "the process died: a native crash (onnxruntime's optimizer aborts on "
                      "some graphs, scripts/fuzz/check.py run_one)"}
            worker = None
        bad = ["error"] if "error" in result else result.get("findings", [])
        if bad and args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            model, levels = random_case(seed, args.forms)
            onnx.save(model, args.keep / f"fuzz_{seed}.onnx")
            (args.keep / f"fuzz_{seed}.yaml").write_text(json.dumps({"inputs": {
                name: {level: shapes[name] for level, shapes in levels.items()} for name in levels["opt"]}}))
        failures += bool(bad)
        if args.json:
            print(json.dumps({k: v for k, v in result.items() if k != "trace"}), flush=True)
        elif bad:
            detail = result.get("error") or ", ".join(
                f"{k} {result[k]:.2g}" + (" (float64: infc {:.2g}, onnxruntime {:.2g})".format(*result[f"{k}_vs_float64"])
                                         if f"{k}_vs_float64" in result else "") for k in bad)
            print(f"seed {seed}: FAIL {detail} | {' '.join(result.get('ops', []))}", flush=True)
            if "trace" in result:
                print(result["trace"], file=sys.stderr)
        elif "skipped" in result:
            print(f"seed {seed}: skipped ({result['skipped']})", flush=True)
        elif args.precision:
            print(f"seed {seed}: ok ({result['nodes']} nodes, {args.precision} q_rel {result['q_rel']:.1e}, "
                  f"within tolerance: {result['within_tolerance']})", flush=True)
        else:
            print(f"seed {seed}: ok ({result['nodes']} nodes{', islands' if result['fallback'] else ''}, "
                  f"worst {max(result[k] for k in result if k.startswith(('optimize_', 'plan_')) and '_vs_' not in k):.1e})", flush=True)
    print(f"{failures} of {len(_seeds(args.seeds))} seeds failed")
    return 1 if failures else 0



if __name__ == "__main__":
    sys.exit(main())
