"""The fusion report, built only from pass stats and op histograms: JSON, terminal and HTML."""

from __future__ import annotations

import html
from collections import Counter

from rich.console import Console
from rich.table import Table

from .optimize import OptimizeResult

TOP_REASONS = 3


def report_json(result: OptimizeResult) -> dict:
    rules: dict[str, dict] = {}
    for stats in result.pipeline.stats:
        for name, rule in stats.rules.items():
            entry = rules.setdefault(name, {"pass": stats.name, "matched": 0, "rejected_at": {}})
            entry["matched"] += rule.matched
            # A pass that runs in two phases sees the same declined node twice: count places once.
            for reason, places in rule.rejected_at.items():
                entry["rejected_at"].setdefault(reason, set()).update(places)
    return {
        "nodes_before": result.pipeline.nodes_before,
        "nodes_after": result.pipeline.nodes_after,
        "time_s": round(result.pipeline.time_s, 4),
        "rules": {name: {"pass": e["pass"], "matched": e["matched"],
                         "rejected": dict(Counter({r: len(p) for r, p in e["rejected_at"].items()}).most_common())}
                  for name, e in rules.items()},
        "passes": [s.to_json() for s in result.pipeline.stats],
        "ops_before": dict(result.ops_before.most_common()),
        "ops_after": dict(result.ops_after.most_common()),
    }


def _reasons_text(rejected: dict[str, int]) -> str:
    top = list(rejected.items())[:TOP_REASONS]
    more = len(rejected) - len(top)
    return "; ".join(f"{n}x {r}" for r, n in top) + (f"; +{more} more" if more > 0 else "")


def print_report(report: dict, console: Console) -> None:
    table = Table(title=f"infc passes: {report['nodes_before']} -> {report['nodes_after']} nodes in {report['time_s']:.2f} s")
    for column in ("phase", "pass", "nodes", "time ms", "rule", "matched", "rejected (top reasons)"):
        table.add_column(column)
    for p in report["passes"]:
        rules = [(n, r) for n, r in p["rules"].items() if r["matched"] or r["rejected"]] or [("", None)]
        for i, (name, rule) in enumerate(rules):
            table.add_row(p["phase"] if i == 0 else "", p["name"] if i == 0 else "",
                          f"{p['nodes_before']}->{p['nodes_after']}" if i == 0 else "",
                          f"{p['time_s'] * 1e3:.1f}" if i == 0 else "", name,
                          str(rule["matched"]) if rule else "", _reasons_text(rule["rejected"]) if rule else "")
    console.print(table)
    ops = Table(title="op histogram")
    for column in ("op", "before", "after"):
        ops.add_column(column)
    for op_name in sorted(set(report["ops_before"]) | set(report["ops_after"]),
                          key=lambda o: -max(report["ops_before"].get(o, 0), report["ops_after"].get(o, 0))):
        ops.add_row(op_name, str(report["ops_before"].get(op_name, 0)), str(report["ops_after"].get(op_name, 0)))
    console.print(ops)


def report_html(report: dict, title: str) -> str:
    esc = html.escape
    rows = []
    for p in report["passes"]:
        for name, rule in p["rules"].items():
            reasons = "<br>".join(f"{n}&times; {esc(r)}" for r, n in rule["rejected"].items())
            rows.append(f"<tr><td>{esc(p['phase'])}</td><td>{esc(p['name'])}</td><td>{p['nodes_before']}&rarr;{p['nodes_after']}</td>"
                        f"<td>{p['time_s'] * 1e3:.1f}</td><td>{esc(name)}</td><td>{rule['matched']}</td><td>{reasons}</td></tr>")
        if not p["rules"]:
            rows.append(f"<tr><td>{esc(p['phase'])}</td><td>{esc(p['name'])}</td><td>{p['nodes_before']}&rarr;{p['nodes_after']}</td>"
                        f"<td>{p['time_s'] * 1e3:.1f}</td><td></td><td></td><td></td></tr>")
    ops = "".join(f"<tr><td>{esc(o)}</td><td>{report['ops_before'].get(o, 0)}</td><td>{report['ops_after'].get(o, 0)}</td></tr>"
                  for o in sorted(set(report["ops_before"]) | set(report["ops_after"])))
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
             "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}th{background:#eee}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>{style}</style></head><body>"
            f"<h1>{esc(title)}</h1><p>{report['nodes_before']} &rarr; {report['nodes_after']} nodes in {report['time_s']:.2f} s</p>"
            "<h2>Passes and rules</h2><table><tr><th>phase</th><th>pass</th><th>nodes</th><th>time ms</th><th>rule</th>"
            f"<th>matched</th><th>rejected (reason)</th></tr>{''.join(rows)}</table>"
            f"<h2>Op histogram</h2><table><tr><th>op</th><th>before</th><th>after</th></tr>{ops}</table></body></html>")
