"""The model runner of a decoder plan: one forward pass over the scheduled chunks as a flat batch of
tokens, K/V in a block pool it owns (decode_api.ModelRunner).

    runner = load_model_runner("smollm2.plan")    # checks the plan's target like `infc run`
    runner.allocate_kv(num_blocks)
    logits = runner.step([SeqChunk(...), ...])    # [chunks with needs_logits, vocab] float32
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import BadInput
from ..plan.format import read_plan
from ..target import check_target
from .decode_api import KV_DTYPE, ModelSpec, SeqChunk, host_free_bytes, kv_bytes_per_block
from .executor import Executor
from .invariant_gemm import CHAIN_ROWS
from .session import _weights

META = ("slot_mapping", "block_tables", "query_start_loc", "context_lens")
WARM_UP_ROWS = CHAIN_ROWS + 4  # the warm-up prefill's tokens: past the decode-sized GEMM kernels


class PagedModelRunner:
    def __init__(self, executor: Executor, decoder: dict, inputs: list[dict], extras: dict | None = None, device=None):
        """`decoder`: the plan's meta["decoder"]; `extras`: tokenizer_json (bytes), decode profile; `device`:
        the backend (runtime/cuda/backend.py) of a cuda plan's device executor, where the KV pools live."""
        fields = {k: decoder[k] for k in ModelSpec.__dataclass_fields__ if k in decoder}
        self.spec = ModelSpec(**{**fields, "eos_token_ids": tuple(decoder.get("eos_token_ids", ()))})
        self.executor = executor
        self.logits_name, self.gathers_logits = decoder["logits"], bool(decoder["gathers_logits"])
        self.chat_template: str | None = decoder.get("chat_template")
        self.tokenizer_json: bytes | None = (extras or {}).get("tokenizer_json")
        self.decode_profile: dict = (extras or {}).get("decode_profile", {})
        self._dtypes = {i["name"]: np.dtype(i["dtype"]) for i in inputs}
        self._pools: dict[str, np.ndarray] = {}
        self._device = device

    def kv_bytes_per_block(self) -> int:
        return kv_bytes_per_block(self.spec)

    def allocate_kv(self, num_blocks: int) -> None:
        s = self.spec
        shape = (int(num_blocks), s.num_kv_heads, s.block_size, s.head_dim)
        def zeros():
            return np.zeros(shape, KV_DTYPE) if self._device is None else self._device.adopt(self._device.xp.zeros(shape, KV_DTYPE))
        self._pools = {f"infc.kv.{layer}.{which}": zeros() for layer in range(s.num_layers) for which in ("key", "value")}

    def free_memory_bytes(self) -> int:
        """Memory the KV pool may take (engine.pool_size): the device's free memory for pools on a GPU."""
        cuda = getattr(self._device.xp, "cuda", None) if self._device is not None else None
        return int(cuda.runtime.memGetInfo()[0]) if cuda is not None else host_free_bytes()

    def warm_up(self) -> None:
        """One small prefill (WARM_UP_ROWS tokens) + decode step on the first blocks, which it leaves zeroed. A process's
        first step probes each GEMM shape's row invariance (runtime/invariant_gemm.py) and loads
        the compiled kernels: seconds that would otherwise land on the first requests' latency
        and on the step-cost fit of decode priority."""
        pool = next(iter(self._pools.values()), None)
        if pool is None:
            raise BadInput("warm_up before allocate_kv: the KV block pool is not allocated")
        # more rows than the decode-sized kernels take, so the prefill kernels load (and pack) too
        length = WARM_UP_ROWS
        blocks = -(-length // self.spec.block_size)
        if pool.shape[0] <= blocks:
            length, blocks = 2, 1
        second = min(blocks, pool.shape[0] - 1)
        self.step([SeqChunk(0, [0] * length, 0, list(range(blocks)), True), SeqChunk(1, [0], 1, [second], True)])
        for pool in self._pools.values():
            pool[:second + 1] = 0

    def step(self, chunks: Sequence[SeqChunk]) -> np.ndarray:
        if not chunks:
            return np.zeros((0, self.spec.vocab_size), np.float32)
        if not self._pools:
            raise BadInput("step before allocate_kv: the KV block pool is not allocated")
        feeds, logits_indices = self.feeds(chunks)
        logits = self.executor.run(feeds)[self.logits_name]
        logits = logits.reshape(-1, self.spec.vocab_size)
        return np.ascontiguousarray(logits if self.gathers_logits else logits[logits_indices], dtype=np.float32)

    def feeds(self, chunks: Sequence[SeqChunk]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        spec, block_size = self.spec, self.spec.block_size
        counts = np.array([len(c.token_ids) for c in chunks], np.int64)
        ids = np.concatenate([np.asarray(c.token_ids, np.int64).reshape(-1) for c in chunks])
        positions = np.concatenate([np.arange(c.start_pos, c.start_pos + n) for c, n in zip(chunks, counts)])
        context_lens = np.array([c.start_pos for c in chunks], np.int64) + counts
        if ids.size and (ids.min() < 0 or ids.max() >= spec.vocab_size):
            raise BadInput(f"token id outside the vocabulary [0, {spec.vocab_size})")
        if counts.min() < 1 or context_lens.max() > spec.max_model_len:
            raise BadInput(f"a chunk is empty or runs past max_model_len {spec.max_model_len}")
        tables = np.zeros((len(chunks), max(len(c.block_table) for c in chunks)), np.int32)
        for row, c in enumerate(chunks):
            if len(c.block_table) * block_size < context_lens[row]:
                raise BadInput(f"sequence {c.seq_id}: block table covers {len(c.block_table) * block_size} "
                               f"positions, needs {context_lens[row]}")
            tables[row, :len(c.block_table)] = c.block_table
        owner = np.repeat(np.arange(len(chunks)), counts)
        slots = tables[owner, positions // block_size].astype(np.int64) * block_size + positions % block_size
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        logits_indices = (starts[1:] - 1)[[c.needs_logits for c in chunks]].astype(np.int64)
        values = {"input_ids": ids.reshape(1, -1), "position_ids": positions.reshape(1, -1),
                  "cache_position": positions, "attention_mask": np.ones((1, ids.size), np.int64),
                  "token_type_ids": np.zeros((1, ids.size), np.int64),
                  "infc.slot_mapping": slots, "infc.block_tables": tables, "infc.query_start_loc": starts,
                  "infc.context_lens": context_lens.astype(np.int32), "infc.logits_indices": logits_indices}
        feeds = {name: values[name].astype(dtype, copy=False) for name, dtype in self._dtypes.items() if name in values}
        feeds.update(self._pools)
        return feeds, logits_indices


def load_model_runner(path: str | Path, check_fingerprint: bool = True) -> PagedModelRunner:
    path = Path(path)
    plan = read_plan(path)
    meta = plan.meta
    if meta.get("kind") != "decoder" or "decoder" not in meta:
        raise BadInput(f"{path}: not a decoder plan (kind '{meta.get('kind')}'); build it with a profile that has a 'decode:' block")
    if check_fingerprint:
        check_target(meta["target"], str(path), meta.get("model", {}).get("name"))
    extras = {"tokenizer_json": bytes(plan.sections["tokenizer"]) if "tokenizer" in plan.sections else None,
              "decode_profile": meta.get("profile", {}).get("decode", {})}
    if meta["target"].get("kind") == "cuda":  # the device executor (runtime/cuda/), CuPy loaded only here
        from .cuda.plan_loader import device_executor  # noqa: PLC0415

        executor = device_executor(plan, _weights(plan))
        return PagedModelRunner(executor, meta["decoder"], meta["inputs"], extras, device=executor.backend)
    islands = {name: bytes(view) for name, view in plan.sections.items() if name.startswith("island")}
    executor = Executor(meta["program"], _weights(plan), meta.get("opset", 17), islands,
                        output_names=[o["name"] for o in meta["outputs"]])
    return PagedModelRunner(executor, meta["decoder"], meta["inputs"], extras)
