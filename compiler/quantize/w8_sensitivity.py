"""Sensitivity-based mixed precision for weight-only int8: which GEMM weights stay fp32.

On a few calibration sequences (the model's own fp32 greedy continuations of chat-template prompts
when the plan carries a tokenizer, of seeded token ids otherwise), every candidate weight is
quantized alone, in place of its fp32 value, and the teacher-forced logits of all continuation
positions are compared with fp32's by KL divergence. The weights are then kept fp32 most sensitive
first (score per byte, so a large weight must earn its bytes) until the kept scores cover
`coverage` of the sum or the next one would pass `max_fp32_fraction` of the candidates' fp32 bytes.
Perturbations this small add nearly linearly, so the sum of single-weight scores predicts the
combined error; one last run with the chosen weights fp32 measures it.

    fp32 weights ──► quantize one ──► teacher-forced logits ──► KL vs fp32 ──► rank ──► keep fp32
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..runtime.decode_api import SeqChunk
from ..runtime.model_runner import PagedModelRunner
from ..runtime.text import TextCodec
from .greedy_agreement import runner_greedy_tokens, seeded_prompts

# Generic requests for models with a chat template; the continuations come from the model itself.
CALIBRATION_TEXTS = ("Tell me a short story about a lighthouse keeper.", "How do vaccines train the immune system?",
                     "Describe a good breakfast.", "What should I pack for a weekend hike?")
# Each candidate costs one forward over every calibration token (~1 s for SmolLM2's 121 weights).
NUM_SEQUENCES, NUM_TOKENS, RANDOM_PROMPT_LEN = 3, 16, 8
COVERAGE = 0.7  # of the summed single-weight KL kept fp32
MAX_FP32_FRACTION = 0.2  # of the quantizable weights' fp32 bytes


@dataclass
class SensitivityReport:
    calibration: str  # "chat template" or "seeded token ids"
    num_positions: int
    kl_all_int8: float  # mean KL(fp32 || w8) per position, every candidate quantized
    kl_kept: float  # the same with `kept` fp32
    agreement_all_int8: float  # teacher-forced argmax agreement on the calibration positions
    agreement_kept: float
    kept: list  # weight names kept fp32, most sensitive first
    kept_bytes: int  # their fp32 bytes
    scores: dict  # weight -> mean KL with it alone quantized, highest first

    def to_json(self) -> dict:
        return asdict(self)


class TeacherForced:
    """One prefill of each calibration sequence with logits at every continuation position; weights
    are swapped by feeding them (a feed overrides an initializer)."""

    def __init__(self, runner: PagedModelRunner, prompts: list[list[int]], continuations: list[list[int]]):
        self.runner = runner
        block_size = runner.spec.block_size
        lengths = [len(p) + len(c) - 1 for p, c in zip(prompts, continuations)]
        blocks = [-(-n // block_size) for n in lengths]
        runner.allocate_kv(sum(blocks) + 1)
        first = np.cumsum([1] + blocks[:-1])
        chunks = [SeqChunk(i, p + c[:-1], 0, tuple(range(f, f + b)), True)
                  for i, (p, c, f, b) in enumerate(zip(prompts, continuations, first, blocks))]
        self.feeds, _ = runner.feeds(chunks)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.rows = np.concatenate([s + np.arange(len(p) - 1, n) for s, p, n in zip(starts, prompts, lengths)])
        if runner.gathers_logits:
            self.feeds["infc.logits_indices"] = self.rows.astype(self.feeds["infc.logits_indices"].dtype)
        self.labels = np.concatenate(continuations)

    def log_probs(self, weights: dict[str, np.ndarray] | None = None) -> np.ndarray:
        logits = self.runner.executor.run({**self.feeds, **(weights or {})})[self.runner.logits_name]
        logits = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
        if not self.runner.gathers_logits:
            logits = logits[self.rows]
        shifted = logits - logits.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def calibration_prompts(runner: PagedModelRunner, num_sequences: int, seed: int = 0) -> tuple[str, list[list[int]]]:
    codec = TextCodec.for_runner(runner) if runner.chat_template else None
    if codec is not None:
        texts = [CALIBRATION_TEXTS[i % len(CALIBRATION_TEXTS)] for i in range(num_sequences)]
        return "chat template", [codec.encode_prompt(t) for t in texts]
    return "seeded token ids", seeded_prompts(runner.spec.vocab_size, num_sequences, RANDOM_PROMPT_LEN, seed)


def mean_kl(reference: np.ndarray, candidate: np.ndarray) -> float:
    return float((np.exp(reference) * (reference - candidate)).sum(axis=-1).mean())


def select_fp32_weights(runner: PagedModelRunner, quantized: dict[str, np.ndarray], coverage: float = COVERAGE,
                        max_fp32_fraction: float = MAX_FP32_FRACTION, num_sequences: int = NUM_SEQUENCES,
                        num_tokens: int = NUM_TOKENS, seed: int = 0, log=lambda msg: None) -> SensitivityReport:
    """`runner` runs the fp32 program; `quantized`: candidate weight -> its int8 value dequantized."""
    source, prompts = calibration_prompts(runner, num_sequences, seed)
    forced = TeacherForced(runner, prompts, runner_greedy_tokens(runner, prompts, num_tokens))
    reference = forced.log_probs()
    log(f"w8: measuring {len(quantized)} weights one at a time on {len(forced.rows)} teacher-forced positions")
    scores = {name: mean_kl(reference, forced.log_probs({name: value})) for name, value in quantized.items()}
    kept, kept_bytes = _choose(scores, {n: v.nbytes for n, v in quantized.items()}, coverage, max_fp32_fraction)
    all_int8 = forced.log_probs(quantized)
    mixed = forced.log_probs({n: v for n, v in quantized.items() if n not in kept}) if kept else all_int8
    return SensitivityReport(source, len(forced.rows), mean_kl(reference, all_int8), mean_kl(reference, mixed),
                             _agreement(all_int8, forced.labels), _agreement(mixed, forced.labels), kept, kept_bytes,
                             dict(sorted(scores.items(), key=lambda item: -item[1])))


def _choose(scores: dict[str, float], nbytes: dict[str, int], coverage: float, max_fp32_fraction: float):
    budget, total = max_fp32_fraction * sum(nbytes.values()), sum(scores.values())
    kept, kept_bytes, covered = [], 0, 0.0
    for name in sorted(scores, key=lambda n: (-scores[n] / nbytes[n], n)):
        if covered >= coverage * total:
            break
        if kept_bytes + nbytes[name] <= budget:
            kept.append(name)
            kept_bytes += nbytes[name]
            covered += scores[name]
    return kept, kept_bytes


def _agreement(log_probs: np.ndarray, labels: np.ndarray) -> float:
    return float((log_probs.argmax(axis=-1) == labels).mean())
