"""The decode loop. One step: schedule (which sequences, how many tokens each) -> execute (one
`runner.step` over all their chunks) -> post-process (commit the K/V, sample, detokenize, stop)."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .decode_api import ModelRunner, SeqChunk, host_free_bytes
from .metrics import StepStats, summarize
from .sampler import make_generator, sample_batch
from .scheduler import Scheduler
from .scheduler_config import SchedulerConfig
from .step_cost import StepCostModel, attended_positions
from .sequence import MAX_ARRIVAL_S, Request, Sequence, Status, request_problem
from .text import StreamDetokenizer, TextCodec

KV_MEMORY_FRACTION = 0.4  # of the free memory, when the pool size is not given
# decode priority never takes a long prompt below this many tokens a step: it always progresses
MIN_PREFILL_CAP = 4


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = SchedulerConfig()
    num_kv_blocks: int | None = None  # None: enough for max_num_seqs full contexts, within free memory
    enable_prefix_caching: bool = True
    seed: int = 0  # sampling seed of the requests that bring none
    # Decode priority for latency: a step carrying decodes is kept within this factor of a
    # decode-only step by capping its prefill tokens (None: prefill chunks take whatever the token
    # budget leaves, which is best for throughput; the cap costs some, see docs/decode-benchmark.md).
    itl_factor: float | None = None
    cold_prefill_cap: int = 64  # the cap until the step-cost model has seen steps of different sizes


def pool_size(runner: ModelRunner, config: EngineConfig) -> int:
    if config.num_kv_blocks:
        return config.num_kv_blocks
    spec = runner.spec
    wanted = config.scheduler.max_num_seqs * -(-spec.max_model_len // spec.block_size)
    free_bytes = getattr(runner, "free_memory_bytes", host_free_bytes)()  # a runner on a GPU: the device's
    return max(1, min(wanted, int(free_bytes * KV_MEMORY_FRACTION) // runner.kv_bytes_per_block()))


class Engine:
    def __init__(self, runner: ModelRunner, config: EngineConfig = EngineConfig(), text: TextCodec | None = None,
                 clock=time.perf_counter, on_text=None):
        self.runner, self.spec, self.text, self.clock, self.on_text = runner, runner.spec, text, clock, on_text
        self.config = config
        num_blocks = pool_size(runner, config)
        runner.allocate_kv(num_blocks)
        if hasattr(runner, "warm_up"):  # one-time costs before the first request's clock and the step-cost fit
            runner.warm_up()
        self.blocks = BlockManager(num_blocks, self.spec.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.blocks)
        self.step_cost = StepCostModel(config.itl_factor, config.cold_prefill_cap, MIN_PREFILL_CAP) \
            if config.itl_factor else None
        if self.step_cost:
            self.scheduler.prefill_cap = self.step_cost.prefill_cap
        self.stats = StepStats()
        self.sequences: list[Sequence] = []
        self.detokenizers: dict[Sequence, StreamDetokenizer] = {}
        self.duration_s = 0.0

    def add_request(self, request: Request, arrival_s: float | None = None) -> Sequence:
        """Queue a request; a request that cannot be served comes back finished, with its error."""
        prompt_ids = self._prompt_ids(request)
        index = len(self.sequences)
        problem = self._problem(request, prompt_ids)  # before the generator: a bad seed is one of them
        seq = Sequence(index, list(prompt_ids or []), request.params,
                       None if problem else make_generator(request.params, self.config.seed, index),
                       self.clock() if arrival_s is None else arrival_s)
        self.sequences.append(seq)
        if problem:
            seq.error, seq.status, seq.finish_reason, seq.finished_s = problem, Status.FINISHED, "error", seq.arrival_s
            return seq
        # the context bounds the output
        seq.params = dataclasses.replace(seq.params, max_tokens=min(seq.params.max_tokens,
                                                                    self.spec.max_model_len - len(seq.prompt_ids)))
        if self.text is not None:
            self.detokenizers[seq] = StreamDetokenizer(self.text, seq.prompt_ids, seq.params.stop)
        self.scheduler.add(seq)
        return seq

    def _prompt_ids(self, request: Request) -> list[int] | None:
        if request.prompt_ids is None and request.prompt is not None and self.text is not None:
            return self.text.encode(request.prompt)
        return request.prompt_ids

    def _problem(self, request: Request, prompt_ids: list[int] | None) -> str | None:
        if request.error:
            return request.error
        problem = request_problem(request, prompt_ids, self.spec, self.blocks.num_blocks)
        return f"{request.source}: {problem}" if problem and request.source else problem

    def tokenized(self, request: Request) -> Request:
        """The request with its text prompt encoded (what add_request would serve)."""
        return dataclasses.replace(request, prompt_ids=self._prompt_ids(request))

    def refusal(self, request: Request) -> str | None:
        """Why add_request would refuse this request, naming its source (None: it would serve it),
        so a caller can reject a whole workload before serving any of it."""
        return self._problem(request, self._prompt_ids(request))

    def cancel(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self.detokenizers.pop(seq, None)
            self.scheduler.finish(seq, "cancelled")
            seq.finished_s = self.clock()

    def step(self) -> list[Sequence]:
        """One iteration; returns the sequences that finished in it."""
        start_s = self.clock()
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        chunks = [self._chunk(seq, num_new, start_s) for seq, num_new in scheduled]
        run_s = self.clock()
        logits = self.runner.step(chunks)
        done_s = self.clock()
        if self.step_cost:
            self.step_cost.observe(sum(num_new for _, num_new in scheduled), done_s - run_s,
                                   attended_positions([(c.start_pos, len(c.token_ids)) for c in chunks]))
        finished = self._postprocess(scheduled, logits, done_s)
        self.stats.num_steps += 1
        self.stats.schedule_s += run_s - start_s
        self.stats.runner_s += done_s - run_s
        self.stats.postprocess_s += self.clock() - done_s
        return finished

    def _chunk(self, seq: Sequence, num_new: int, now_s: float) -> SeqChunk:
        if seq.first_scheduled_s is None:
            seq.first_scheduled_s = now_s
        end = seq.num_computed + num_new
        self.stats.allocated_slots += len(seq.block_table) * self.blocks.block_size
        self.stats.used_slots += end
        self.stats.contiguous_slots += self.spec.max_model_len
        return SeqChunk(seq.seq_id, seq.tokens_between(seq.num_computed, end), seq.num_computed, tuple(seq.block_table),
                        needs_logits=end == seq.num_tokens)

    def _postprocess(self, scheduled: list[tuple[Sequence, int]], logits, now_s: float) -> list[Sequence]:
        sampling = [seq for seq, num_new in scheduled if seq.num_computed + num_new == seq.num_tokens]
        self.scheduler.commit(scheduled)
        tokens = sample_batch(logits, [s.params for s in sampling], [s.rng for s in sampling])
        finished = []
        for seq, token in zip(sampling, tokens):
            seq.output_ids.append(token)
            seq.token_times_s.append(now_s)
            if seq.first_token_s is None:
                seq.first_token_s = now_s
            detokenizer = self.detokenizers.get(seq)
            if detokenizer:
                self._detokenize(seq, detokenizer.push, token)
            if token in self.spec.eos_token_ids and not seq.params.ignore_eos or detokenizer and detokenizer.is_stopped:
                reason = "stop"
            else:
                reason = "length" if len(seq.output_ids) >= seq.params.max_tokens else None
            if reason:
                if detokenizer:
                    self._detokenize(seq, detokenizer.flush)  # what waited for the end of a character
                    del self.detokenizers[seq]
                self.scheduler.finish(seq, reason)
                seq.finished_s = now_s
                finished.append(seq)
        return finished

    def _detokenize(self, seq: Sequence, method, *args) -> None:
        start_s = self.clock()
        piece = method(*args)
        seq.text = self.detokenizers[seq].text
        if self.on_text and piece:
            self.on_text(seq, piece)
        seq.detokenize_s += self.clock() - start_s

    def run(self, requests: list[Request], on_step=None) -> list[Sequence]:
        """Serve requests arriving at their arrival_s (seconds after the start); results in request order."""
        start_s = self.clock()
        seqs: dict[int, Sequence] = {}
        # a request that can never arrive (request_problem) is refused now, not waited for
        can_arrive = [r.arrival_s < MAX_ARRIVAL_S for r in requests]
        for index in (i for i, ok in enumerate(can_arrive) if not ok):
            seqs[index] = self.add_request(requests[index], start_s)
        pending = deque(sorted((i for i, ok in enumerate(can_arrive) if ok), key=lambda i: requests[i].arrival_s))
        while pending or self.scheduler.has_work():
            now_s = self.clock()
            while pending and start_s + requests[pending[0]].arrival_s <= now_s:
                index = pending.popleft()
                seqs[index] = self.add_request(requests[index], start_s + requests[index].arrival_s)
            if not self.scheduler.has_work():
                if pending:
                    time.sleep(max(0.0, start_s + requests[pending[0]].arrival_s - self.clock()))
                continue
            self.step()
            if on_step:
                on_step(self)
        self.duration_s = self.clock() - start_s
        return [seqs[i] for i in range(len(requests))]

    def summary(self, seqs: list[Sequence]) -> dict:
        return summarize(seqs, self.stats, self.duration_s, self.scheduler.num_preemptions,
                         self.blocks.prefix_hit_pct)
