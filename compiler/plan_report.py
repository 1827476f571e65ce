"""What `infc build` prints and what `infc inspect PLAN.bin` explains: target, kernels, tuning
results against the vendor library, memory plan, fallback islands."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from .plan.format import read_plan

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
        "kernels": dict(Counter(s.get("kernel", s["op"]) for s in meta["program"]).most_common()),
        "tuning": meta.get("tuning", []),
        "memory": {"arena_bytes": memory.get("arena_bytes"), "sum_activation_bytes": memory.get("sum_activation_bytes"),
                   "arena_fraction": (memory["arena_bytes"] / memory["sum_activation_bytes"]) if memory.get("sum_activation_bytes") else None,
                   "planned_for": memory.get("planned_for")},
        "weights_bytes": sum(_nbytes(w) for w in meta.get("weights", {}).values()),
        "fallback_ops": meta.get("fallback_ops", []), "islands": islands,
    }


def _nbytes(info: dict) -> int:
    import numpy as np

    return int(np.prod(info["shape"])) * np.dtype(info["dtype"]).itemsize if info["shape"] else np.dtype(info["dtype"]).itemsize


def _tuning_table(tuning: list[dict]) -> Table:
    table = Table(title="GEMM kernels per shape bucket (time as % of the vendor library; lower is faster)")
    for column in ("GEMM (M bucket x N x K)", "source", "winner", "winner %", "fastest candidates (% of vendor)"):
        table.add_column(column)
    for entry in tuning:
        timed = sorted((c for c in entry.get("candidates", []) if c.get("pct_of_vendor") is not None),
                       key=lambda c: c["pct_of_vendor"])
        others = len(entry.get("candidates", [])) - len(timed)
        cands = ", ".join(f"{c['config']} {c['pct_of_vendor']:.0f}%" for c in timed[:TOP_CANDIDATES])
        cands += f" (+{len(timed) - TOP_CANDIDATES} more)" if len(timed) > TOP_CANDIDATES else ""
        cands += f"; {others} pruned or failed" if others else ""
        table.add_row(entry.get("shape", entry.get("key", "")), entry.get("source", ""), str(entry.get("winner")),
                      f"{entry['winner_pct_of_vendor']:.0f}%" if entry.get("winner_pct_of_vendor") is not None else "-", cands)
    return table


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
    if report["tuning"]:
        console.print(_tuning_table(report["tuning"]))
    if report["islands"]:
        for island in report["islands"]:
            console.print(f"onnxruntime island: {', '.join(island['ops'])} ({len(island['inputs'])} in, {len(island['outputs'])} out)")
    else:
        console.print("no onnxruntime islands: every op runs on a native kernel")


def print_build_report(report: dict, console: Console) -> None:
    state = "hit" if report["cache_hit"] else f"miss ({report['cache_reason']})"
    console.print(f"engine cache: {state}")
    if report.get("timing_cache"):
        tc = report["timing_cache"]
        console.print(f"timing cache: {tc.get('hits', 0)} hits, {tc.get('misses', 0)} tuned now")
    if report.get("tuning"):
        console.print(_tuning_table(report["tuning"]))
    if report.get("fallback_ops"):
        console.print(f"onnxruntime fallback for: {', '.join(report['fallback_ops'])}")
    memory = report.get("memory") or {}
    if memory.get("sum_activation_bytes"):
        console.print(f"memory: arena {memory['arena_bytes'] / 1e6:.2f} MB for {memory['sum_activation_bytes'] / 1e6:.2f} MB of activations")
    if report.get("verify"):
        console.print(f"verify: max abs diff {report['verify']['max_abs_diff']:.3g}, max rel diff {report['verify']['max_rel_diff']:.3g}")
    console.print(f"wrote {report['plan']} in {report['build_s']:.2f} s")
