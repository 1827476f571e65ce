"""Graph optimizers side by side: infc, onnxruntime's offline optimizer, onnxslim and onnxsim.

For each test model (tests/models/*.onnx and the three PaddleOCR models of rapidocr-onnxruntime) each
tool runs in its own child process (so a crash or a hang is reported, never fatal), timed around the
optimizing call only. Each result is counted (nodes, subgraphs included) and checked against the
original in onnxruntime with graph optimizations disabled, on the same seeded inputs.

    python bench/optimize.py                      # all models and tools; writes JSON and the docs table
    python bench/optimize.py --models cnn rec     # models whose file name contains any of these
    python bench/optimize.py --no-write           # print only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("infc", "onnxruntime", "onnxslim", "onnxsim")
COMPETITORS = TOOLS[1:]
MATCH_RTOL = 1e-4
DEFAULT_TIMEOUT_S = 600
SEED = 0
# The PaddleOCR models have dynamic H/W; give them the shapes rapidocr feeds (random normal values).
OCR_INPUT_SHAPES = {"det": (1, 3, 640, 640), "rec": (1, 3, 48, 320), "cls": (1, 3, 48, 192)}


# ---- child process: one tool on one model --------------------------------------------------------

def _optimize_infc(path: str, out: str) -> float:
    from infc.compiler.optimize import optimize_model

    model = onnx.load(path)
    start = time.perf_counter()
    result = optimize_model(model)
    seconds = time.perf_counter() - start
    onnx.save(result.model, out)
    return seconds


def _optimize_onnxruntime(path: str, out: str) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = out
    options.log_severity_level = 3
    start = time.perf_counter()  # session creation: load, optimize, write the file, prepare kernels
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def _optimize_onnxslim(path: str, out: str) -> float:
    import onnxslim

    model = onnx.load(path)
    start = time.perf_counter()
    slimmed = onnxslim.slim(model)
    seconds = time.perf_counter() - start
    onnx.save(slimmed, out)
    return seconds


def _optimize_onnxsim(path: str, out: str) -> float:
    import onnxsim

    model = onnx.load(path)
    start = time.perf_counter()
    simplified, _ = onnxsim.simplify(model)
    seconds = time.perf_counter() - start
    onnx.save(simplified, out)
    return seconds


OPTIMIZERS = {"infc": _optimize_infc, "onnxruntime": _optimize_onnxruntime,
              "onnxslim": _optimize_onnxslim, "onnxsim": _optimize_onnxsim}


def worker(tool: str, path: str, out: str) -> None:
    seconds = OPTIMIZERS[tool](path, out)
    Path(out + ".json").write_text(json.dumps({"seconds": seconds}))


# ---- parent: models, feeds, checks -------------------------------------------------------------

def node_count(model: onnx.ModelProto) -> int:
    from infc.compiler.optimize import op_histogram

    return sum(op_histogram(model).values())


def find_models(filters: list[str]) -> tuple[list[tuple[str, Path, str | None]], list[str]]:
    """(name, path, PaddleOCR kind or None) for each model, and notes on what could not be found."""
    fixtures = json.loads((REPO / "tests" / "models" / "fixtures.json").read_text())
    models = [(m["name"], REPO / "tests" / "models" / m["name"], None) for m in sorted(fixtures, key=lambda m: m["name"])]
    notes = []
    try:
        from infc.compiler.ocr import paddleocr_model_paths

        models += [(p.name, p, kind) for kind, p in paddleocr_model_paths().items()]
    except Exception as exc:  # noqa: BLE001 - the fixtures still get benchmarked
        notes.append(f"PaddleOCR models skipped: {exc}")
    if filters:
        models = [m for m in models if any(f in m[0] for f in filters)]
    return models, notes


def make_feeds(model: onnx.ModelProto, ocr_kind: str | None) -> dict[str, np.ndarray]:
    from infc.compiler.feeds import random_feeds

    if ocr_kind is None:
        return random_feeds(model, seed=SEED)
    # A rendered text line, preprocessed as rapidocr does: on noise the detector finds nothing and its
    # near-zero outputs make any relative difference meaningless.
    from infc.compiler import ocr

    line = ocr.render_text_line("infc 2026 optimizer")
    prepare = {"det": ocr.det_input, "rec": ocr.rec_input, "cls": ocr.cls_input}[ocr_kind]
    return {model.graph.input[0].name: prepare(line)}


def _first_line(text: str, limit: int = 160) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no message")[:limit]


def run_tool(tool: str, path: Path, workdir: Path, timeout_s: float, expected, feeds, output_names) -> dict:
    from infc.compiler.verify import compare_outputs, ort_session

    out = workdir / f"{path.stem}.{tool}.onnx"  # tools that drop temp files in their cwd drop them here too
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", tool, str(path), str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=workdir)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"no result after {timeout_s:.0f} s"}
    if done.returncode != 0 or not Path(str(out) + ".json").exists():
        return {"status": "crash", "error": f"exit {done.returncode}: {_first_line(done.stderr or done.stdout)}"}
    result = {"status": "ok", "seconds": json.loads(Path(str(out) + ".json").read_text())["seconds"]}
    try:
        optimized = onnx.load(str(out))
        result["nodes"] = node_count(optimized)
        actual = ort_session(optimized).run(output_names, feeds)
        diffs = compare_outputs(output_names, expected, actual)
    except Exception as exc:  # noqa: BLE001 - a result ORT cannot run is a finding, not a stop
        result.update(status="ort_error", error=_first_line(str(exc)))
        return result
    result["max_rel_diff"] = max((d.max_rel_diff for d in diffs), default=0.0)
    result["max_abs_diff"] = max((d.max_abs_diff for d in diffs), default=0.0)
    result["matches"] = result["max_rel_diff"] <= MATCH_RTOL
    return result


def bench_model(name: str, path: Path, ocr_kind: str | None, tools, timeout_s: float, workdir: Path) -> dict:
    from infc.compiler.verify import ort_session

    original = onnx.load(str(path))
    row = {"model": name, "nodes": node_count(original), "inputs": "random_feeds(seed=0)" if ocr_kind is None
           else f"random normal {'x'.join(map(str, OCR_INPUT_SHAPES[ocr_kind]))} (seed 0)", "tools": {}}
    feeds = make_feeds(original, ocr_kind)
    output_names = [o.name for o in original.graph.output]
    try:
        expected = ort_session(original).run(output_names, feeds)
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"original does not run: {_first_line(str(exc))}"
        return row
    # The relative diff divides by this peak: near zero (e.g. a detector shown noise), it inflates.
    row["output_peak"] = max((float(np.abs(a).max()) for a in map(np.asarray, expected)
                              if a.dtype.kind == "f" and a.size), default=0.0)
    for tool in tools:
        row["tools"][tool] = run_tool(tool, path, workdir, timeout_s, expected, feeds, output_names)
    row["infc_vs_best"] = infc_ratio(row)
    return row


def mismatch_notes(rows: list[dict]) -> list[str]:
    """Models where no tool matches: say how small the original's outputs and the absolute diffs are."""
    notes = []
    for row in rows:
        checked = [r for r in row.get("tools", {}).values() if "matches" in r]
        if checked and not any(r["matches"] for r in checked):
            notes.append(f"no tool is within {MATCH_RTOL:g} relative on {row['model']}; its outputs peak at "
                         f"{row['output_peak']:.2g} on these inputs and the absolute diffs are at most "
                         f"{max(r['max_abs_diff'] for r in checked):.2g}")
    return notes


def failure_notes(rows: list[dict]) -> list[str]:
    return [f"{tool} on {row['model']}: {r['status']}: {r['error']}" for row in rows
            for tool, r in row.get("tools", {}).items() if r["status"] != "ok"]


def infc_ratio(row: dict) -> dict | None:
    """infc's node count over the fewest nodes of a competitor whose result still matches."""
    infc = row["tools"].get("infc", {})
    rivals = [(r["nodes"], tool) for tool, r in row["tools"].items() if tool != "infc" and r.get("matches")]
    if not infc.get("matches") or not rivals:
        return None
    best_nodes, best_tool = min(rivals)
    return {"best": best_tool, "best_nodes": best_nodes, "nodes_ratio": infc["nodes"] / max(best_nodes, 1)}


# ---- reporting ---------------------------------------------------------------------------------

def cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if result["status"] in ("timeout", "crash"):
        return result["status"].upper()
    nodes = f"{result['nodes']} / {result['seconds']:.2f} s"
    if result["status"] == "ort_error":
        return f"{nodes} / ORT FAILS"
    verdict = "ok" if result["matches"] else "MISMATCH"
    return f"{nodes} / {verdict} {result['max_rel_diff']:.1e}"


def ratio_cell(row: dict) -> str:
    ratio = row.get("infc_vs_best")
    return f"{ratio['nodes_ratio']:.2f} ({ratio['best']})" if ratio else "n/a"


def table_rows(rows: list[dict], tools) -> tuple[list[str], list[list[str]]]:
    header = ["model", "nodes"] + list(tools) + ["infc/best"]
    body = [[r["model"], str(r["nodes"])] + ([r["error"]] + [""] * (len(tools) - 1) if "error" in r
            else [cell(r["tools"].get(t)) for t in tools]) + [ratio_cell(r)] for r in rows]
    return header, body


def print_table(rows: list[dict], tools) -> None:
    header, body = table_rows(rows, tools)
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    for line in [header, ["-" * w for w in widths]] + body:
        print("  ".join(text.ljust(w) for text, w in zip(line, widths)))


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in ("infc", "onnx", "onnxruntime", "onnxslim", "onnxsim"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    found["infc_commit"] = _git_commit()
    return found


def _git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + (" + uncommitted changes" if dirty else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_note() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} logical CPUs"


def write_markdown(path: Path, report: dict, tools) -> None:
    header, body = table_rows(report["rows"], tools)
    lines = [
        "# Optimizer benchmark", "",
        f"Measured {report['date']} on {report['machine']}, by `{report['command']}` "
        f"(JSON: `{report['json']}`).", "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".", "",
        "Each cell: nodes after (main graph and subgraphs) / wall-clock seconds of the optimizing call / whether "
        f"onnxruntime (graph optimizations disabled) gives the original's outputs within max relative diff "
        f"{MATCH_RTOL:g} (max |a-b| / max |a| over all outputs, the number shown). onnxruntime's time is the "
        "session creation with `ORT_ENABLE_EXTENDED` and `optimized_model_filepath` on the CPU provider, which "
        "includes loading and writing the model. `infc/best` is infc's node count over the fewest nodes of a "
        "competitor whose result matches (below 1: infc's graph is smaller). Each tool runs in its own process; "
        "default options everywhere, input shapes left dynamic.", "",
        "Inputs: the fixtures get `infc.compiler.feeds.random_feeds(seed=0)`; the PaddleOCR models "
        "(rapidocr-onnxruntime 1.4.4) get the rendered line \"infc 2026 optimizer\" preprocessed as rapidocr "
        "does (`infc.compiler.ocr`): det 1x3x640x640 page, rec 1x3x48x320, cls 1x3x48x192.", "",
        "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
    ] + ["| " + " | ".join(line) + " |" for line in body] + [""]
    lines += [f"Note: {note}" for note in report["notes"]]
    path.write_text("\n".join(lines).rstrip() + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[], help="only models whose file name contains one of these")
    parser.add_argument("--tools", nargs="*", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per tool and model")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--worker", nargs=3, metavar=("TOOL", "MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    models, notes = find_models(args.models)
    rows = []
    with tempfile.TemporaryDirectory(prefix="infc-bench-") as workdir:
        for name, path, ocr_kind in models:
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(bench_model(name, path, ocr_kind, args.tools, args.timeout, Path(workdir)))
    notes += failure_notes(rows) + mismatch_notes(rows)
    print_table(rows, args.tools)
    for note in notes:
        print(f"note: {note}")
    if args.no_write:
        return
    date = datetime.date.today().isoformat()
    json_path = REPO / "bench" / "results" / f"optimize-{date}.json"
    report = {"date": date, "machine": machine_note(), "versions": versions(),
              "command": "python bench/optimize.py" + "".join(f" {a}" for a in sys.argv[1:]),
              "json": str(json_path.relative_to(REPO)), "match_rtol": MATCH_RTOL, "notes": notes, "rows": rows}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    write_markdown(REPO / "docs" / "optimize-benchmark.md", report, args.tools)
    print(f"wrote {report['json']} and docs/optimize-benchmark.md")


if __name__ == "__main__":
    main()
