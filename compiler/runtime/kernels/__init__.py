"""The kernel registry: a data table (domain, op) -> kernel, merged from each family's KERNELS dict.

Domains: "" is the default ONNX domain (also spelled "ai.onnx"), "com.microsoft" ORT's contrib ops,
"infc.cpu" the build's own lowered forms (tuned GEMMs, elementwise chains, convolution epilogues).
"""

from __future__ import annotations

from typing import Callable

from . import (activation, attention, cast, conv, elementwise, gather_scatter, gemm, loss, norm, pool, quant,
               reduce, resize, rnn, shape, signal, tuned_gemm, vision)
from . import paged_attention
from . import batch_invariant
from . import chain
from . import conv_epilogue

FAMILIES = (elementwise, cast, activation, reduce, shape, gather_scatter, conv, pool, gemm, norm, attention, resize,
            quant, loss, vision, signal, rnn, tuned_gemm, paged_attention, batch_invariant, chain,
            conv_epilogue)


def _merge() -> dict[tuple[str, str], Callable]:
    table: dict[tuple[str, str], Callable] = {}
    for family in FAMILIES:
        for key, kernel in family.KERNELS.items():
            if key in table:
                raise RuntimeError(f"kernel {key} registered twice ({family.__name__})")
            table[key] = kernel
    return table


KERNELS = _merge()


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def kernel_for(domain: str, op: str) -> Callable | None:
    return KERNELS.get((_domain(domain or ""), op))


def has_kernel(domain: str, op: str) -> bool:
    return kernel_for(domain, op) is not None
