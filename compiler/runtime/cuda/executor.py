"""Runs a one-shot plan's program on a device (CuPy), or on NumPy standing in for one (CI).

Placement, decided once at construction, per step:
    host (shape)     every input is shape arithmetic (Shape / Size outputs, small constants, or
                     values computed only from those): the CPU kernel, no copies and no waiting on
                     the device; target shapes and axes stay host values.
    device gemm      a tuned GEMM site (gemm.py), writing into the arena (arena.py); a site with an
                     epilogue also does the steps it absorbed, which are dropped (gemm.device_steps).
    device           an op of the device table (ops.py) over backend.xp; an ElementwiseChain with a
                     cubin in the plan is one generated kernel (chain.py); softmax, attention scores
                     and norms launch the plan's row kernels (rows.py); an fp16/bf16 plan's
                     Cast pairs through the low type are one rounding launch (cast_fold.py).
    host fallback    no device op (or an onnxruntime island): inputs copied to the host, the CPU
                     kernel, outputs copied back when a device step reads them. `report()` and
                     `infc inspect` list these.
Weights go to the device once, on first use by a device step. Inputs arrive on the host; outputs
are copied back at the end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import BadInput, InfcError
from ..executor import ISLAND_OP, _island_runner
from ..kernels import kernel_for
from ..kernels.common import KernelContext, decode_attrs
from .backend import Backend
from .cast_fold import LOW_CODES, elide_repeated_rounding, fold_cast_pairs
from .chain import ChainRunner
from .gemm import GemmSite, GemmSpec, device_steps
from .ops import device_op_for
from .ops_elementwise import EPILOGUE_ACTIVATIONS
from .rows import RowKernels

SHAPE_SOURCES = {("", "Shape"), ("", "Size")}
SMALL_CONSTANT = 64  # elements: constants this small are shape arithmetic or scalars, kept on the host too
HOST_SHAPE, DEVICE, DEVICE_GEMM, HOST_FALLBACK = "host (shape)", "device", "device gemm", "host fallback"


@dataclass
class DeviceContext:
    xp: object
    erf: Callable
    opset: int
    out: list                      # as KernelContext: the number of outputs asked for
    memo: dict = field(default_factory=dict)
    gemm: GemmSite | None = None
    chain: ChainRunner | None = None   # an ElementwiseChain step's generated kernel
    rows: RowKernels | None = None     # the plan's row kernels (softmax, norms), for the ops that use them


@dataclass
class _Step:
    run: Callable
    attrs: dict
    ctx: object
    inputs: tuple
    outputs: tuple
    label: str
    where: str
    host_inputs: frozenset = frozenset()
    frees: tuple = ()


class DeviceExecutor:
    def __init__(self, steps: list[dict], weights: dict[str, np.ndarray], opset: int, backend: Backend, *,
                 islands: dict[str, bytes] | None = None, output_names: list[str] | None = None,
                 gemms: list[GemmSpec] = (), launches: dict | None = None, arena=None,
                 chains: dict[int, ChainRunner] | None = None, rows: RowKernels | None = None):
        self.backend, self.opset, self.rows = backend, int(opset), rows
        self._weights = dict(weights)
        self._device_weights: dict[str, object] = {}
        if output_names is None:
            consumed = {n for s in steps for n in s["inputs"]}
            output_names = [n for s in steps for n in s["outputs"] if n and n not in consumed]
        self.output_names = list(output_names)
        sites = {spec.step: spec for spec in gemms}
        host_values = shape_values(steps, self._weights)
        placed = fold_cast_pairs(device_steps(steps, gemms), host_values, set(self.output_names))
        rounded = {step["outputs"][0]: LOW_CODES[sites[index].rounded_to] for index, step in placed
                   if index in sites and sites[index].rounded_to and step["outputs"] and step["outputs"][0]}
        placed = elide_repeated_rounding(placed, rounded, set(self.output_names))
        # an arena, or how to plan one over the steps as they run here (plan_loader)
        self.arena = arena([step for _, step in placed]) if callable(arena) else arena
        self._steps = [self._prepare(i, s, host_values, sites.get(i), launches or {}, islands or {}) for i, s in placed]
        for step, (index, program_step) in zip(self._steps, placed):
            if index in (chains or {}) and step.where == DEVICE:
                step.ctx.chain = chains[index]
                if program_step["op"] != "ElementwiseChain":  # a standalone activation's one-op chain kernel
                    step.run = _chain_or(step.run)
        self._assign_frees()

    # ---- construction ----------------------------------------------------------------------------
    def _prepare(self, index: int, step: dict, host_values: set, spec: GemmSpec | None, launches, islands) -> _Step:
        domain = step.get("domain") or ""
        label = f"{domain}{'.' if domain else ''}{step['op']} '{step.get('name', '')}'"
        inputs, outputs = tuple(step["inputs"]), tuple(step["outputs"])
        attrs = decode_attrs(step.get("attrs") or {})
        if step["op"] == ISLAND_OP:
            section = step["section"]
            if section not in islands:
                raise BadInput(f"island step needs section '{section}', which the plan does not carry")
            return _Step(_island_runner(islands[section], inputs, outputs), {}, None, inputs, outputs, label, HOST_FALLBACK)
        on_host, device_op = _place(step, attrs, host_values)
        if device_op is None:
            kernel = kernel_for(domain, step["op"])
            if kernel is None:
                raise BadInput(f"no runtime kernel for {label}")
            ctx = KernelContext(self.opset, [None] * len(outputs))
            return _Step(kernel, attrs, ctx, inputs, outputs, label, HOST_SHAPE if on_host else HOST_FALLBACK)
        ctx = DeviceContext(self.backend.xp, self.backend.erf, self.opset, [None] * len(outputs), rows=self.rows)
        where = DEVICE
        if spec is not None:
            bias = spec.epilogue.bias if spec.epilogue is not None else None
            ctx.gemm = GemmSite(spec, self._device_weight(spec.w_nk, spec.dtype), launches, self.backend.xp,
                                bias=None if bias is None else self._device_weight(bias),
                                activate=lambda y, act, ctx=ctx: EPILOGUE_ACTIVATIONS[act](y, ctx))
            if self.arena is not None and outputs and outputs[0]:
                ctx.gemm.alloc = self.arena.alloc_for(outputs[0])
            where = DEVICE_GEMM
        return _Step(device_op, attrs, ctx, inputs, outputs, label, where,
                     frozenset(getattr(device_op, "host_inputs", ())))

    def _assign_frees(self) -> None:
        keep = set(self.output_names) | set(self._weights)
        last: dict[str, int] = {}
        for index, step in enumerate(self._steps):
            for name in step.inputs + step.outputs:
                if name:
                    last[name] = index
        frees: dict[int, list] = {}
        for name, index in last.items():
            if name not in keep:
                frees.setdefault(index, []).append(name)
        for index, step in enumerate(self._steps):
            step.frees = tuple(frees.get(index, ()))

    def _device_weight(self, name: str, dtype: str = "float32"):
        """A weight on the device, uploaded once; a 16-bit GEMM site's (N, K) weight converted on the host first."""
        key = name if dtype == "float32" else f"{name}@{dtype}"
        if key not in self._device_weights:
            host = self._weights[name]
            if dtype != "float32":
                from ...autotune.gpu_gemm import low_dtype  # noqa: PLC0415

                host = host.astype(low_dtype(dtype))
            self._device_weights[key] = self.backend.upload(host)
        return self._device_weights[key]

    # ---- running ---------------------------------------------------------------------------------
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        backend = self.backend
        values: dict[str, object] = dict(feeds)
        uploads: dict[str, object] = {}    # host values already copied to the device in this run
        downloads: dict[str, object] = {}  # device values already copied to the host in this run
        step = None
        try:
            for step in self._steps:
                if step.where in (HOST_SHAPE, HOST_FALLBACK):
                    args = [None if not n else self._on_host(n, values, downloads) for n in step.inputs]
                    results = step.run(args, step.attrs, step.ctx)
                else:
                    args = [None if not n else (self._on_host(n, values, downloads) if i in step.host_inputs
                                                else self._on_device(n, values, uploads))
                            for i, n in enumerate(step.inputs)]
                    results = [None if r is None else backend.adopt(r) for r in step.run(args, step.attrs, step.ctx)]
                for name, value in zip(step.outputs, results):
                    if name:
                        values[name] = value
                        uploads.pop(name, None)
                        downloads.pop(name, None)
                for name in step.frees:
                    values.pop(name, None)
                    uploads.pop(name, None)
                    downloads.pop(name, None)
        except InfcError:
            raise
        except Exception as exc:
            label = step.label if step is not None else "run"
            raise InfcError(f"{label} failed on {backend.name}: {type(exc).__name__}: {exc}") from exc
        return {name: self._on_host(name, values, downloads) for name in self.output_names}

    def _on_device(self, name: str, values: dict, uploads: dict):
        value = values.get(name)
        if value is None and name in self._weights:
            return self._device_weight(name)
        if value is None:
            raise BadInput(f"missing input '{name}'")
        if self.backend.is_device(value):
            return value
        if name not in uploads:
            uploads[name] = self.backend.upload(value)
        return uploads[name]

    def _on_host(self, name: str, values: dict, downloads: dict):
        value = values.get(name)
        if value is None and name in self._weights:
            return self._weights[name]
        if value is None:
            raise BadInput(f"missing input '{name}'")
        if not self.backend.is_device(value):
            return value
        if name not in downloads:
            downloads[name] = self.backend.download(value)
        return downloads[name]

    # ---- reporting -------------------------------------------------------------------------------
    def report(self) -> dict:
        gemm_counts = Counter()
        for step in self._steps:
            if step.where == DEVICE_GEMM:
                gemm_counts.update(step.ctx.gemm.counts)
        chains = [s.ctx.chain for s in self._steps if s.where == DEVICE and s.ctx.chain is not None]
        return {"placement": dict(Counter(s.where for s in self._steps)),
                "host_fallback_ops": sorted({s.label.split(" ")[0] for s in self._steps if s.where == HOST_FALLBACK}),
                "gemm_launches": dict(gemm_counts), "copies": dict(self.backend.copies),
                "chain_kernels": len(chains), "chain_launches": sum(c.launches for c in chains),
                "row_launches": self.rows.launches if self.rows is not None else 0,
                "rounding_steps": sum(s.label.startswith("infc.cuda.RoundTo") for s in self._steps),
                "arena_bytes": self.arena.plan.arena_bytes if self.arena is not None else 0}


def _chain_or(op: Callable) -> Callable:
    """The step's chain kernel (one launch) where it applies (float32 inputs), else the array op."""
    def run(inputs, attrs, ctx):
        return [ctx.chain(inputs, ctx)] if ctx.chain.may_run(inputs) else op(inputs, attrs, ctx)
    return run


def shape_values(steps: list[dict], weights: dict) -> set[str]:
    """Values that are shape arithmetic: computed on the host without touching the device."""
    host = {n for n, w in weights.items() if w.size <= SMALL_CONSTANT}
    for step in steps:
        key = (step.get("domain") or "", step["op"])
        names = [n for n in step["inputs"] if n]
        if key in SHAPE_SOURCES or (step["op"] != ISLAND_OP and names and all(n in host for n in names)):
            host.update(n for n in step["outputs"] if n)
    return host


def _place(step: dict, attrs: dict, host_values: set) -> tuple[bool, Callable | None]:
    """(runs as host shape arithmetic, the device op or None)."""
    domain = step.get("domain") or ""
    names = [n for n in step["inputs"] if n]
    on_host = (domain, step["op"]) in SHAPE_SOURCES or bool(names and all(n in host_values for n in names))
    return on_host, None if on_host else device_op_for(domain, step["op"], attrs)


def placement(steps: list[dict], weights: dict) -> list[tuple[str, str]]:
    """(op label, where) per step, as the executor will place it (GEMM sites count as device)."""
    host_values = shape_values(steps, weights)
    placed = []
    for step in steps:
        label = f"{step.get('domain') + '.' if step.get('domain') else ''}{step['op']}"
        if step["op"] == ISLAND_OP:
            placed.append((f"onnxruntime island ({', '.join(step.get('ops', []))})", HOST_FALLBACK))
            continue
        on_host, device_op = _place(step, decode_attrs(step.get("attrs") or {}), host_values)
        placed.append((label, HOST_SHAPE if on_host else DEVICE if device_op is not None else HOST_FALLBACK))
    return placed
