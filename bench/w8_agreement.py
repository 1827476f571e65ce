"""Weight-only int8 (`--precision w8`) against fp32 on a decoder: greedy tokens of 16 chat prompts x
32 tokens, position by position (strict: after a first difference the continuations differ), plus
the capital-of-France answer, both through `infc run`'s engine. Writes bench/results/w8-<model>.json.

    python bench/w8_agreement.py build/smollm2.plan build/smollm2_w8.plan

Build the plans first:
    infc build build/smollm2/model.onnx --profile profiles/smollm2_decode.yaml -o build/smollm2.plan
    infc build build/smollm2/model.onnx --profile profiles/smollm2_decode.yaml -o build/smollm2_w8.plan --precision w8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

from infc.compiler.quantize.greedy_agreement import (
    agreement,
    runner_greedy_tokens,
    teacher_forced_agreement,
)
from infc.compiler.quantize.w8_sensitivity import TeacherForced
from infc.compiler.runtime.engine import Engine, EngineConfig
from infc.compiler.runtime.model_runner import load_model_runner
from infc.compiler.runtime.sampler import SamplingParams
from infc.compiler.runtime.scheduler_config import SchedulerConfig
from infc.compiler.runtime.sequence import Request
from infc.compiler.runtime.text import TextCodec

PROMPTS = [
    "What is the capital of France?", "Name three primary colors.", "How many legs does a spider have?",
    "Write one sentence about the ocean.", "What is 12 times 7?", "Who wrote Romeo and Juliet?",
    "Explain photosynthesis in one sentence.", "What is the boiling point of water in Celsius?",
    "Give me a synonym for happy.", "What language is spoken in Brazil?", "List two planets near the Sun.",
    "What does a thermometer measure?", "Translate 'good morning' into Spanish.", "What is the largest mammal?",
    "Why is the sky blue?", "Suggest a name for a pet cat.",
]
NUM_TOKENS = 32


def generate(plan: Path, prompts: list[str], num_tokens: int, reference=None):
    """Greedy tokens, their text, seconds, and (given the reference's tokens) teacher-forced agreement."""
    runner = load_model_runner(plan)
    text = TextCodec.for_runner(runner)
    ids = [text.encode_prompt(p) for p in prompts]
    started = time.perf_counter()
    tokens = runner_greedy_tokens(runner, ids, num_tokens)
    elapsed = time.perf_counter() - started
    forced = teacher_forced_agreement(runner, ids, reference) if reference else None
    return tokens, [text.decode(t) for t in tokens], elapsed, forced


def top2_margins(plan: Path, prompts: list[str], tokens: list[list[int]]) -> list[list[float]]:
    """fp32's top-1 minus top-2 logit at each of its own greedy steps: a near-tie flips under any
    perturbation, so the strict count hinges on how many there are."""
    runner = load_model_runner(plan)
    text = TextCodec.for_runner(runner)
    top2 = TeacherForced(runner, [text.encode_prompt(p) for p in prompts], tokens).log_probs()
    top2.partition(top2.shape[-1] - 2, axis=-1)
    return (top2[:, -1] - top2[:, -2]).reshape(len(tokens), -1).tolist()


def answer(plan: Path, prompt: str, max_tokens: int = 16) -> str:
    """As `infc run PLAN --prompt TEXT --max-tokens 16` answers (greedy, through the chat template)."""
    runner = load_model_runner(plan)
    text = TextCodec.for_runner(runner)
    engine = Engine(runner, EngineConfig(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2048), num_kv_blocks=64),
                    text)
    (seq,) = engine.run([Request(prompt_ids=text.encode_prompt(prompt), params=SamplingParams(max_tokens=max_tokens))])
    return text.decode(seq.output_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32_plan", type=Path)
    parser.add_argument("w8_plan", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reference, reference_text, fp32_s, _ = generate(args.fp32_plan, PROMPTS, NUM_TOKENS)
    candidate, candidate_text, w8_s, forced = generate(args.w8_plan, PROMPTS, NUM_TOKENS, reference)
    found = agreement(reference, candidate)
    margins = top2_margins(args.fp32_plan, PROMPTS, reference)
    near_ties = sorted((m, i, k) for i, row in enumerate(margins) for k, m in enumerate(row))[:8]
    paris = {name: answer(plan, PROMPTS[0]) for name, plan in (("fp32", args.fp32_plan), ("w8", args.w8_plan))}
    result = {
        "date": datetime.date.today().isoformat(), "fp32_plan": str(args.fp32_plan), "w8_plan": str(args.w8_plan),
        "plan_bytes": {"fp32": os.path.getsize(args.fp32_plan), "w8": os.path.getsize(args.w8_plan)},
        "num_requests": len(PROMPTS), "num_tokens_each": NUM_TOKENS, **found, "teacher_forced_agreement": forced,
        "fp32_margin_at_first_difference": [None if d is None else round(margins[i][d], 5)
                                            for i, d in enumerate(found["first_differences"])],
        "fp32_smallest_margins": [{"prompt": i, "position": k, "margin": round(m, 5)} for m, i, k in near_ties],
        "generate_s": {"fp32": round(fp32_s, 2), "w8": round(w8_s, 2)},
        "capital_of_france": paris, "says_paris": {k: "Paris" in v for k, v in paris.items()},
        "texts": [{"prompt": p, "fp32": a, "w8": b} for p, a, b in zip(PROMPTS, reference_text, candidate_text)],
    }
    out = args.out or Path(__file__).parent / "results" / f"w8-{args.fp32_plan.stem}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"plan bytes: fp32 {result['plan_bytes']['fp32'] / 1e6:.0f} MB, w8 {result['plan_bytes']['w8'] / 1e6:.0f} MB")
    print(f"greedy tokens: {found['num_agree']}/{found['num_tokens']} agree ({100 * found['agreement']:.1f}%), "
          f"{found['num_identical_sequences']}/{len(PROMPTS)} sequences identical; first differences "
          f"{found['first_differences']}")
    print(f"fp32 top-2 logit margin at each first difference: {result['fp32_margin_at_first_difference']}")
    print(f"teacher-forced (each step fed fp32's tokens): {100 * forced:.1f}% of steps pick fp32's token")
    print(f"capital of France: fp32 {paris['fp32']!r}; w8 {paris['w8']!r}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
