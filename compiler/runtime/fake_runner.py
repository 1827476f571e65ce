"""A deterministic stand-in for the model runner (tests, `bench/decode.py --fake`).

It keeps a real block pool, holding token ids instead of K/V: each step writes the chunk's tokens
into the slots its block table names, then reads the sequence's whole history back through the
block table and derives the logits from a hash of it. So a wrong block table, a prefix hit on the
wrong block or a read of a slot nobody wrote changes the output (or raises), and a sequence's
tokens depend only on its own history, like a batch-invariant model. An optional cost model
(seconds per step, per token and per token of context read, slept or added to a virtual clock)
makes it usable for benchmarks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .decode_api import ModelSpec, SeqChunk

# Token ids 0-255 are bytes (see byte_tokenizer_json), 256 is the end of sequence.
DEFAULT_SPEC = ModelSpec(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=257,
                         max_model_len=4096, eos_token_ids=(256,), block_size=16)
FAKE_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def byte_tokenizer_json() -> str:
    """A byte-level tokenizer without merges (token id = byte value) plus <|eos|> as id 256: every
    multi-byte character spans several tokens, which is what streaming detokenization must handle."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}  # GPT-2's byte map
    tokenizer = Tokenizer(models.BPE({chars[b]: b for b in range(256)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|eos|>"])
    return tokenizer.to_str()


@dataclass(frozen=True)
class StepCost:
    per_step_s: float = 0.0
    per_token_s: float = 0.0
    per_context_token_s: float = 0.0


class FakeRunner:
    def __init__(self, spec: ModelSpec = DEFAULT_SPEC, cost: StepCost = StepCost(), eos_bias: float = 0.0,
                 has_tokenizer: bool = True, is_virtual_time: bool = False):
        self.spec, self.cost, self.eos_bias = spec, cost, eos_bias
        # virtual time: `clock()` is this process's CPU time outside `step` plus the modelled cost,
        # which is not slept, so a loaded machine's scheduling noise stays out of benchmarks and the
        # stand-in's own bookkeeping (writing and hashing token histories) does not pass for model time
        self.is_virtual_time, self.virtual_s, self.own_cpu_s = is_virtual_time, 0.0, 0.0
        # what a decoder plan's runner carries besides the Protocol (see text.TextCodec.for_runner)
        is_byte_vocab = has_tokenizer and spec.vocab_size == DEFAULT_SPEC.vocab_size
        self.tokenizer_json = byte_tokenizer_json().encode() if is_byte_vocab else None
        self.chat_template = FAKE_CHAT_TEMPLATE if is_byte_vocab else None
        self.decode_profile: dict = {}
        self.pool_NB: np.ndarray | None = None
        self.num_steps = 0
        self.num_tokens_run = 0

    def allocate_kv(self, num_blocks: int) -> None:
        if self.pool_NB is not None:
            raise RuntimeError("the KV pool is allocated once")
        self.pool_NB = np.full((num_blocks, self.spec.block_size), -1, dtype=np.int64)

    def kv_bytes_per_block(self) -> int:
        s = self.spec
        return 2 * s.num_layers * s.num_kv_heads * s.block_size * s.head_dim * 4

    def step(self, chunks: Sequence[SeqChunk]) -> np.ndarray:
        start_s = time.process_time()
        logits = self._step(chunks)
        self.own_cpu_s += time.process_time() - start_s
        return logits

    def _step(self, chunks: Sequence[SeqChunk]) -> np.ndarray:
        assert self.pool_NB is not None, "allocate_kv first"
        size = self.spec.block_size
        # Write every chunk first, as a real runner writes K/V before attending.
        for chunk in chunks:
            end = chunk.start_pos + len(chunk.token_ids)
            if not 0 < len(chunk.token_ids) or len(chunk.block_table) * size < end:
                raise ValueError(f"seq {chunk.seq_id}: block table of {len(chunk.block_table)} blocks "
                                 f"does not cover positions [0, {end})")
            positions = np.arange(chunk.start_pos, end)
            table = np.asarray(chunk.block_table)
            self.pool_NB[table[positions // size], positions % size] = chunk.token_ids
        rows, num_context = [], 0
        for chunk in chunks:
            end = chunk.start_pos + len(chunk.token_ids)
            num_context += end
            if chunk.needs_logits:
                positions = np.arange(end)
                history = self.pool_NB[np.asarray(chunk.block_table)[positions // size], positions % size]
                if (history < 0).any():
                    raise ValueError(f"seq {chunk.seq_id}: read a KV slot that was never written")
                rows.append(self.logits_for(history))
        num_tokens = sum(len(c.token_ids) for c in chunks)
        self.num_steps += 1
        self.num_tokens_run += num_tokens
        self._spend(num_tokens, num_context)
        return np.stack(rows) if rows else np.zeros((0, self.spec.vocab_size), np.float32)

    def logits_for(self, history: np.ndarray) -> np.ndarray:
        seed = hash(tuple(history.tolist())) & 0xFFFF_FFFF_FFFF_FFFF
        logits_V = np.random.default_rng(seed).standard_normal(self.spec.vocab_size).astype(np.float32)
        for eos in self.spec.eos_token_ids:
            logits_V[eos] += self.eos_bias
        return logits_V

    def _spend(self, num_tokens: int, num_context: int) -> None:
        seconds = (self.cost.per_step_s + self.cost.per_token_s * num_tokens
                   + self.cost.per_context_token_s * num_context)
        if self.is_virtual_time:
            self.virtual_s += seconds
        elif seconds > 0:
            time.sleep(seconds)

    def clock(self) -> float:
        return time.process_time() - self.own_cpu_s + self.virtual_s


def reference_tokens(runner: FakeRunner, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> list[int]:
    """Greedy tokens computed straight from the logits function: what any schedule must reproduce."""
    history, out = list(prompt_ids), []
    while len(out) < max_tokens:
        token = int(np.argmax(runner.logits_for(np.asarray(history))))
        out.append(token)
        history.append(token)
        if token in runner.spec.eos_token_ids and not ignore_eos:
            break
    return out
