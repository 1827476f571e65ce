"""Greedy-token agreement of a reduced-precision decoder program with its fp32 program: the same
seeded prompts run through the decode engine on both, position by position (once a token differs
the continuations differ too, so this is the strict count)."""

from __future__ import annotations

import numpy as np

from ..runtime.decode_api import SeqChunk
from ..runtime.engine import Engine, EngineConfig
from ..runtime.executor import Executor
from ..runtime.model_runner import PagedModelRunner
from ..runtime.sampler import SamplingParams
from ..runtime.scheduler_config import SchedulerConfig
from ..runtime.sequence import Request

NUM_PROMPTS, PROMPT_LEN, NUM_TOKENS = 4, 12, 8


def seeded_prompts(vocab_size: int, num_prompts: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, prompt_len).tolist() for _ in range(num_prompts)]


def program_runner(program, decoder: dict, tokenizer_json: bytes | None = None) -> PagedModelRunner:
    executor = Executor(program.steps, program.weights, program.opset, program.islands,
                        output_names=[o["name"] for o in program.outputs])
    return PagedModelRunner(executor, decoder, program.inputs, {"tokenizer_json": tokenizer_json})


def greedy_tokens(program, decoder: dict, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    return runner_greedy_tokens(program_runner(program, decoder), prompts, num_tokens)


def runner_greedy_tokens(runner: PagedModelRunner, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    blocks_per_seq = -(-(max(map(len, prompts)) + num_tokens) // runner.spec.block_size)
    scheduler = SchedulerConfig(max_num_seqs=len(prompts), max_num_batched_tokens=max(256, len(prompts)))
    engine = Engine(runner, EngineConfig(scheduler, num_kv_blocks=len(prompts) * blocks_per_seq + 1))
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    return [seq.output_ids for seq in engine.run([Request(prompt_ids=p, params=params) for p in prompts])]


def agreement(reference: list[list[int]], candidate: list[list[int]]) -> dict:
    num_agree = sum(a == b for ref, cand in zip(reference, candidate) for a, b in zip(ref, cand))
    num_tokens = sum(len(ref) for ref in reference)
    first_differences = [next((i for i, (a, b) in enumerate(zip(ref, cand)) if a != b), None)
                         for ref, cand in zip(reference, candidate)]
    return {"num_prompts": len(reference), "num_tokens": num_tokens, "num_agree": num_agree,
            "agreement": num_agree / num_tokens if num_tokens else 1.0,
            "num_identical_sequences": sum(d is None for d in first_differences),
            "first_differences": first_differences}


def greedy_agreement(reference_program, candidate_program, decoder: dict, num_prompts: int = NUM_PROMPTS,
                     prompt_len: int = PROMPT_LEN, num_tokens: int = NUM_TOKENS, seed: int = 0) -> dict:
    prompts = seeded_prompts(decoder["vocab_size"], num_prompts, prompt_len, seed)
    found = agreement(greedy_tokens(reference_program, decoder, prompts, num_tokens),
                      greedy_tokens(candidate_program, decoder, prompts, num_tokens))
    return {**found, "prompt_len": prompt_len, "seed": seed}


def teacher_forced_agreement(runner: PagedModelRunner, prompts: list[list[int]], reference: list[list[int]]) -> float:
    """The fraction of steps whose greedy token equals the reference's when every sequence is fed the
    reference's own tokens: per-step precision, without the strict count's divergence after a first
    near-tie flips."""
    num_tokens = min(map(len, reference))
    block_size = runner.spec.block_size
    blocks_per_seq = -(-(max(map(len, prompts)) + num_tokens) // block_size)
    runner.allocate_kv(len(prompts) * blocks_per_seq + 1)
    tables = [tuple(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)) for i in range(len(prompts))]
    chunks = [SeqChunk(i, p, 0, tables[i], True) for i, p in enumerate(prompts)]
    num_agree = 0
    for k in range(num_tokens):
        chosen = runner.step(chunks).argmax(axis=-1)
        num_agree += sum(int(c == ref[k]) for c, ref in zip(chosen, reference))
        chunks = [SeqChunk(i, [ref[k]], len(prompts[i]) + k, tables[i], True) for i, ref in enumerate(reference)]
    return num_agree / (len(prompts) * num_tokens) if num_tokens else 1.0
