"""What a decode run measured: per-request latencies (TTFT, TPOT, ITL, end to end) and phase times,
where each step's time went (schedule, runner, post-process), KV pool use, and the live display."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sequence import Sequence


@dataclass
class StepStats:
    num_steps: int = 0
    schedule_s: float = 0.0
    runner_s: float = 0.0
    postprocess_s: float = 0.0
    # KV slot sums over steps (per scheduled sequence): allocated in blocks, holding K/V, and what a
    # contiguous cache reserving max_model_len per sequence would hold.
    allocated_slots: int = 0
    used_slots: int = 0
    contiguous_slots: int = 0

    @property
    def step_s(self) -> float:
        return self.schedule_s + self.runner_s + self.postprocess_s


def percentiles_ms(values_s) -> dict:
    values = np.asarray(list(values_s), dtype=np.float64) * 1e3
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "std": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean()),
            "std": float(values.std())}


def phase_times_s(seq: Sequence) -> dict:
    """queue: arrival to first scheduled; prefill: to the first token; decode: to the last token."""
    def gap(a, b):
        return None if a is None or b is None else b - a
    return {"queue": gap(seq.arrival_s, seq.first_scheduled_s), "prefill": gap(seq.first_scheduled_s, seq.first_token_s),
            "decode": gap(seq.first_token_s, seq.finished_s), "detokenize": seq.detokenize_s}


def _latencies_s(seq: Sequence) -> dict:
    """One request's TTFT, end to end time and inter-token gaps: what the summary's percentiles are
    made of (vLLM's benchmark keeps them per request too)."""
    times = seq.token_times_s
    return {"ttft_s": None if seq.first_token_s is None else seq.first_token_s - seq.arrival_s,
            "e2e_s": None if seq.finished_s is None else seq.finished_s - seq.arrival_s,
            "itl_s": [b - a for a, b in zip(times, times[1:])]}


def request_record(index: int, seq: Sequence) -> dict:
    record = {"index": index, "prompt_tokens": len(seq.prompt_ids), "output_ids": seq.output_ids, "text": seq.text,
              "finish_reason": seq.finish_reason, "phase_s": phase_times_s(seq),
              "prefix_hit_tokens": seq.num_prefix_hit_tokens, "preemptions": seq.num_preemptions,
              **_latencies_s(seq)}
    if seq.error:
        record["error"] = seq.error
    return record


def summarize(seqs: list[Sequence], stats: StepStats, duration_s: float, num_preemptions: int, prefix_hit_pct: float) -> dict:
    served = [s for s in seqs if not s.error]
    num_output = sum(len(s.output_ids) for s in served)
    latencies = [_latencies_s(s) for s in served]
    ttft = [lat["ttft_s"] for lat in latencies if lat["ttft_s"] is not None]
    tpot = [(s.token_times_s[-1] - s.token_times_s[0]) / (len(s.token_times_s) - 1) for s in served if len(s.token_times_s) > 1]
    itl = [gap for lat in latencies for gap in lat["itl_s"]]
    e2e = [lat["e2e_s"] for lat in latencies if lat["e2e_s"] is not None]
    phases = {name: percentiles_ms(p[name] for p in map(phase_times_s, served) if p[name] is not None)
              for name in ("queue", "prefill", "decode", "detokenize")}
    num_prompt = sum(len(s.prompt_ids) for s in served)
    def pct(part, whole):
        return 100.0 * part / whole if whole else 0.0
    def per_s(count):
        return count / duration_s if duration_s > 0 else 0.0
    # besides infc's own keys, what vLLM's benchmark_serving reports (completed, request and total
    # token throughput, std of each latency), named in infc's style
    return {
        "requests": len(seqs), "failed_requests": len(seqs) - len(served), "completed_requests": len(served),
        "output_tokens": num_output, "prompt_tokens": num_prompt,
        "prefill_tokens": sum(s.num_prefill_tokens for s in served),
        "duration_s": duration_s, "output_tok_s": per_s(num_output), "total_tok_s": per_s(num_prompt + num_output),
        "requests_per_s": per_s(len(served)),
        "ttft_ms": percentiles_ms(ttft), "tpot_ms": percentiles_ms(tpot), "itl_ms": percentiles_ms(itl),
        "e2e_ms": percentiles_ms(e2e), "phase_ms": phases,
        "preemptions": num_preemptions, "prefix_hit_pct": prefix_hit_pct,
        "kv_waste_pct": pct(stats.allocated_slots - stats.used_slots, stats.allocated_slots),
        "contiguous_kv_waste_pct": pct(stats.contiguous_slots - stats.used_slots, stats.contiguous_slots),
        "steps": stats.num_steps,
        "step_time_s": {"schedule": stats.schedule_s, "runner": stats.runner_s, "postprocess": stats.postprocess_s},
        "outside_model_pct": pct(stats.step_s - stats.runner_s, stats.step_s),
    }


class LiveDisplay:
    """A one-line rich status on stderr: requests done, output tokens/s, queue length, KV use."""

    def __init__(self, console, num_requests: int, clock):
        from rich.live import Live

        self.num_requests, self.clock, self.start_s = num_requests, clock, clock()
        self.last_update_s = -1.0
        self.live = Live(console=console, refresh_per_second=8, transient=True)

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        return self.live.__exit__(*exc)

    def update(self, engine) -> None:
        now = self.clock()
        if now - self.last_update_s < 0.1:  # the display refreshes 8 times a second anyway
            return
        self.last_update_s = now
        seqs = engine.sequences
        done = sum(s.is_finished for s in seqs)
        tokens = sum(len(s.output_ids) for s in seqs)
        elapsed = max(now - self.start_s, 1e-9)
        blocks = engine.blocks
        self.live.update(f"requests {done}/{self.num_requests} · {tokens / elapsed:,.0f} tok/s · "
                         f"queue {len(engine.scheduler.waiting)} · running {len(engine.scheduler.running)} · "
                         f"KV {100 * blocks.num_used_blocks / blocks.num_blocks:.0f}% of {blocks.num_blocks} blocks")
