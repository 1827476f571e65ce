"""Per-pass statistics; the fusion report is built only from these."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class RuleStats:
    matched: int = 0
    # reason -> the distinct places (root node names) it was given for; a place is counted once
    # even though the pipeline revisits it on every round to the fixed point.
    rejected_at: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def rejected(self) -> dict[str, int]:
        counts = {reason: len(places) for reason, places in self.rejected_at.items()}
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class PassStats:
    name: str
    phase: str
    why: str
    nodes_before: int = 0
    nodes_after: int = 0
    time_s: float = 0.0
    runs: int = 0
    rules: dict[str, RuleStats] = field(default_factory=dict)

    def rule(self, name: str) -> RuleStats:
        return self.rules.setdefault(name, RuleStats())

    def record_match(self, rule: str, count: int = 1) -> None:
        self.rule(rule).matched += count

    def record_rejection(self, rule: str, reason: str, where: str) -> None:
        self.rule(rule).rejected_at[reason].add(where)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "phase": self.phase,
            "why": self.why,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "time_s": round(self.time_s, 6),
            "runs": self.runs,
            "rules": {name: {"matched": r.matched, "rejected": r.rejected()} for name, r in self.rules.items()},
        }
