"""One request's state as it moves through the decode loop: its tokens, its KV blocks, how much of
it is in the cache, and the timestamps the metrics are made of."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .decode_api import ModelSpec
from .sampler import SamplingParams


@dataclass
class Request:
    """What a user asks for: a text prompt or token ids, sampling parameters, and when it arrives
    (seconds after the run starts). A request that could not even be parsed carries its error;
    `source` says where it came from (a trace's file:line), so a refusal can point there."""

    prompt: str | None = None
    prompt_ids: list[int] | None = None
    params: SamplingParams = SamplingParams()
    arrival_s: float = 0.0
    error: str | None = None
    source: str | None = None


# arrival_s counts seconds from the start of the run; one this late is a timestamp (Unix seconds are
# about 1.7e9) or a rate near zero, which the engine would wait for (or fail to sleep, past time_t)
MAX_ARRIVAL_S = 1e9


def request_problem(request: Request, prompt_ids: list[int] | None, spec: ModelSpec, num_kv_blocks: int) -> str | None:
    """Why a request cannot be served (None when it can)."""
    if prompt_ids is None:
        return "a text prompt needs the model's tokenizer; give prompt_ids" if request.prompt is not None else "no prompt"
    problem = request.params.problem()
    if problem:
        return problem
    if not request.arrival_s < MAX_ARRIVAL_S:
        return (f"arrival_s {request.arrival_s:g} is not seconds after the start of the run (a timestamp? it must be "
                f"under {MAX_ARRIVAL_S:g})")
    if not prompt_ids:
        return "empty prompt"
    outside = [t for t in prompt_ids if not 0 <= t < spec.vocab_size]
    if outside:
        return f"token id {outside[0]} is outside the vocabulary [0, {spec.vocab_size})"
    if len(prompt_ids) >= spec.max_model_len:
        return f"prompt of {len(prompt_ids)} tokens leaves no room in the context of {spec.max_model_len}"
    longest = min(len(prompt_ids) + request.params.max_tokens, spec.max_model_len)
    num_blocks = -(-longest // spec.block_size)
    if num_blocks > num_kv_blocks:  # it could never run to its end, even alone
        return f"needs {num_blocks} KV blocks at full length, the pool has {num_kv_blocks}"
    return None


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator | None  # None for a request refused at once
    arrival_s: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of this sequence's full blocks
    num_computed: int = 0  # tokens whose K/V is in the cache (the next chunk starts here)
    num_cached_blocks: int = 0  # leading blocks registered in the prefix cache
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""
    # timing (seconds on the engine clock); the metrics are derived from these
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    detokenize_s: float = 0.0
    num_prefix_hit_tokens: int = 0
    num_prefill_tokens: int = 0  # prompt (and recomputed) tokens this sequence actually ran
    num_preemptions: int = 0
    skipped_steps: int = 0  # steps it waited while a later request was admitted (aging)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def tokens_between(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building token_ids (a decode step reads one token)."""
        num_prompt = len(self.prompt_ids)
        if start >= num_prompt:
            return self.output_ids[start - num_prompt:end - num_prompt]
        return self.prompt_ids[start:end] if end <= num_prompt else self.token_ids[start:end]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
