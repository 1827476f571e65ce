"""GEMM sites of the device executor: a step whose weight is constant runs C = A @ W^T with W stored
(N, K) on the device, through the choice the build tuned for the bucket holding M: a generated
kernel (a launch: GemmKernel on a GPU, the CPU emulator in tests) or cuBLAS (xp.matmul on a
transposed view). M past the last tuned bucket runs cuBLAS, the vendor, which is always a candidate.

The plan records each site in meta["cuda"]["gemms"]: the step, the (N, K) weight's name, N, K, the
choices [{"m_max", "impl": "cublas" | "kernel", "kernel": variant name, "fused": bool}] and, where the
build matched one (compiler/codegen/epilogue_match.py), the epilogue {"bias", "act", "residual",
"own", "absorbed", "output"}. A site with an epilogue always returns the epilogue's result: a "fused"
kernel choice does it in the launch (a variant compiled with that epilogue), cuBLAS and unfused
kernels run it as separate array ops after the GEMM. `own` names the parts that were the step's own
(a Conv's or Gemm's bias, FusedConv's activation: the op must not apply them again); `absorbed` are
the later steps whose work the site does, which the device executor drops (`device_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ...errors import BadInput
from .cast_fold import round_in_place

CUBLAS = "cublas"
# launch(a (M, K), w_nk (N, K), out (M, N), M, N, K) -> None; GemmKernel.__call__ has this shape
Launch = Callable[..., Any]


@dataclass(frozen=True)
class Choice:
    m_max: int
    impl: str            # "cublas" or "kernel"
    kernel: str | None = None
    fused: bool = False  # the kernel applies the site's epilogue itself

    @classmethod
    def from_json(cls, data: Mapping) -> Choice:
        return cls(int(data["m_max"]), str(data["impl"]), data.get("kernel"), bool(data.get("fused", False)))


@dataclass(frozen=True)
class EpilogueSpec:
    output: str                       # the value the site writes (the last absorbed step's output)
    bias: str | None = None           # a (N,) float32 weight
    act: str = "none"                 # none, relu, gelu (erf), silu
    residual: str | None = None       # a value with the output's shape, added last
    own: tuple[str, ...] = ()         # parts that were the site step's own inputs / attributes
    absorbed: tuple[int, ...] = ()    # later steps the site replaces

    @classmethod
    def from_json(cls, data: Mapping) -> EpilogueSpec:
        return cls(str(data["output"]), data.get("bias"), str(data.get("act", "none")), data.get("residual"),
                   tuple(data.get("own", ())), tuple(int(i) for i in data.get("absorbed", ())))

    def to_json(self) -> dict:
        return {"output": self.output, "bias": self.bias, "act": self.act, "residual": self.residual,
                "own": list(self.own), "absorbed": list(self.absorbed)}


@dataclass(frozen=True)
class GemmSpec:
    step: int
    w_nk: str            # plan weight holding W as (N, K) (a conv weight (N, C, kh, kw) reshapes to it)
    n: int
    k: int
    choices: tuple[Choice, ...]
    epilogue: EpilogueSpec | None = None
    dtype: str = "float32"  # bfloat16 / float16: A and W in that type, fp32 accumulate and output

    @classmethod
    def from_json(cls, data: Mapping) -> GemmSpec:
        epilogue = data.get("epilogue")
        dtype = str(data.get("dtype", "float32"))
        if dtype not in ("float32", "bfloat16", "float16"):
            raise BadInput(f"plan: gemm site of step {data['step']}: unknown dtype {dtype!r}")
        return cls(int(data["step"]), str(data["w_nk"]), int(data["N"]), int(data["K"]),
                   tuple(Choice.from_json(c) for c in data["choices"]),
                   EpilogueSpec.from_json(epilogue) if epilogue else None, dtype)

    def owns(self, part: str) -> bool:
        """The site applies this part of its own step (bias / act): the op must not."""
        return self.epilogue is not None and part in self.epilogue.own

    @property
    def rounded_to(self) -> str | None:
        """The low type all of this site's outputs are rounded to, or None: every 16-bit site with no
        epilogue after its GEMM (GemmSite rounds what a generated tile writes, as cuBLAS's 16-bit output
        is), so the program's next rounding is dropped (cast_fold.elide_repeated_rounding)."""
        if self.dtype == "float32" or self.epilogue is not None:
            return None
        return self.dtype

    def choice_for(self, m: int) -> Choice:
        for choice in self.choices:
            if m <= choice.m_max:
                return choice
        return Choice(m, CUBLAS)


class GemmSite:
    """Callable on A (M, K) contiguous (and the residual as (M, N) when the epilogue has one) -> C (M, N)
    with the epilogue applied, written into `alloc((M, N), dtype)` (the arena). A 16-bit site (spec.dtype)
    takes `w_nk` already in that type, converts A to it and writes C in fp32."""

    def __init__(self, spec: GemmSpec, w_nk, launches: Mapping[str, Launch], xp, *, bias=None,
                 activate: Callable = lambda y, act: y):
        self.spec, self.xp = spec, xp
        self.w_nk = w_nk.reshape(spec.n, spec.k)
        self.low = None if spec.dtype == "float32" else self.w_nk.dtype
        if self.low is not None and self.low.itemsize != 2:
            raise ValueError(f"gemm site of step {spec.step}: a {spec.dtype} site needs a 16-bit weight, got {self.low}")
        missing = sorted({c.kernel for c in spec.choices if c.impl != CUBLAS} - set(launches))
        if missing:
            raise ValueError(f"gemm site of step {spec.step}: no loaded kernel {', '.join(missing)}")
        if spec.epilogue is not None and spec.epilogue.bias is not None and bias is None:
            raise ValueError(f"gemm site of step {spec.step}: the epilogue's bias was not given")
        self.launches, self.bias, self.activate = launches, bias, activate
        self.alloc: Callable = lambda shape, dtype: xp.empty(shape, dtype=dtype)  # the executor's arena
        self.counts: dict[str, int] = {}

    def __call__(self, a, residual=None):
        m, k = a.shape
        if k != self.spec.k:
            raise ValueError(f"gemm site of step {self.spec.step}: A has K={k}, the weight {self.spec.k}")
        epilogue = self.spec.epilogue
        if (residual is not None) != (epilogue is not None and epilogue.residual is not None):
            raise ValueError(f"gemm site of step {self.spec.step}: residual given without a residual epilogue, or missing")
        choice = self.spec.choice_for(m)
        out = self.alloc((m, self.spec.n), a.dtype)
        if self.low is not None:  # the plan rounded A to the low type already: this conversion is exact
            a_low = a.astype(self.low)
            if choice.impl == CUBLAS:
                product = self.xp.matmul(a_low, self.w_nk.T)
                out[...] = product
                rounded = product.dtype == self.low  # a 16-bit product (an array module might widen it)
            else:  # the tile writes fp32 accumulators, through its fused epilogue if it has one
                fused = {"bias": self.bias, "residual": residual} if choice.fused else {}
                self.launches[choice.kernel](a_low.view(np.uint16), self.w_nk.view(np.uint16), out, m, self.spec.n, k,
                                             **fused)
                rounded = False
            if not rounded and epilogue is None:  # GemmSpec.rounded_to promises low-type values
                round_in_place(out, self.spec.dtype)
            # with an epilogue (taken through the plan's rounding: codegen/epilogue_match.py) the output
            # stays fp32 and the program's next rounding, after the absorbed steps, rounds it once
            name = choice.impl if choice.impl == CUBLAS else choice.kernel
        elif choice.impl == CUBLAS:
            self.xp.matmul(a, self.w_nk.T, out=out)
            name = CUBLAS
        elif choice.fused:
            self.launches[choice.kernel](a, self.w_nk, out, m, self.spec.n, k, bias=self.bias, residual=residual)
            name = choice.kernel
        else:
            self.launches[choice.kernel](a, self.w_nk, out, m, self.spec.n, k)
            name = choice.kernel
        self.counts[name] = self.counts.get(name, 0) + 1
        if epilogue is None or choice.fused:
            return out
        return self._epilogue_ops(out, residual)

    def _epilogue_ops(self, y, residual):
        """The epilogue as array ops, in the kernels' order: + bias -> activation -> + residual."""
        epilogue = self.spec.epilogue
        if self.bias is not None:
            y += self.bias
        if epilogue.act != "none":
            y[...] = self.activate(y, epilogue.act)
        if residual is not None:
            y += residual
        return y


def device_steps(steps: list[dict], specs) -> list[tuple[int, dict]]:
    """(program index, step) as the device runs them: a site with an epilogue also reads its residual
    (last input) and writes the epilogue's output; the steps it absorbed are gone. The arena plan and
    the executor both use this."""
    by_step = {spec.step: spec for spec in specs if spec.epilogue is not None}
    dropped = {i for spec in by_step.values() for i in spec.epilogue.absorbed}
    result = []
    for index, step in enumerate(steps):
        if index in dropped:
            continue
        spec = by_step.get(index)
        if spec is not None:
            extra = [spec.epilogue.residual] if spec.epilogue.residual else []
            step = {**step, "inputs": list(step["inputs"]) + extra, "outputs": [spec.epilogue.output]}
        result.append((index, step))
    return result


def split_residual(inputs: list, site: GemmSite | None) -> tuple[list, object]:
    """A site op's own inputs, and the epilogue's residual (appended by device_steps) or None."""
    if site is None or site.spec.epilogue is None or site.spec.epilogue.residual is None:
        return inputs, None
    return inputs[:-1], inputs[-1]


def weight_nk(weight: np.ndarray, layout: str) -> np.ndarray:
    """Build time: the (N, K) weight a site reads. 'kn': ONNX MatMul / Gemm transB=0 (transposed once);
    'nk': Gemm transB=1 and convolutions (as stored)."""
    if layout == "kn":
        return np.ascontiguousarray(weight.T)
    return np.ascontiguousarray(weight.reshape(weight.shape[0], -1))
