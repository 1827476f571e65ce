"""The kernel registry: a data table (domain, op) -> kernel, merged from each family's KERNELS dict.

Domains: "" is the default ONNX domain (also spelled "ai.onnx"), "com.microsoft" ORT's contrib ops,
"infc.cpu" the build's own lowered forms (tuned GEMMs, elementwise chains, convolution epilogues).

ONNX float arithmetic is IEEE: log(0) = -inf, 0/0 = NaN and a cast of NaN are values the graph may
select away (T5's relative-position buckets take log(0) and mask it), not errors. NumPy reports them
as RuntimeWarnings from the kernel that computed them, which onnxruntime never prints; they are
ignored for these modules only (a warnings filter costs nothing per call, np.errstate ~7 us). The
filter is (re)installed by each kernel lookup, so a `warnings.catch_warnings()` block around an
import (pytest wraps collection in one) cannot take it away before kernels run.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from . import (
    activation,
    attention,
    batch_invariant,
    cast,
    chain,
    conv,
    conv_epilogue,
    elementwise,
    expert_gemm,
    fake_quant,
    gather_scatter,
    gemm,
    loss,
    norm,
    paged_attention,
    pool,
    quant,
    reduce,
    resize,
    rnn,
    shape,
    signal,
    text,
    tuned_gemm,
    view_fold,
    vision,
)
from .half import WIDENED, widen_half

_THESE_MODULES = re.escape(__name__) + r"(\.|$)"

FAMILIES = (elementwise, cast, activation, reduce, shape, gather_scatter, conv, pool, gemm, norm, attention, resize,
            quant, loss, vision, signal, text, rnn, tuned_gemm, paged_attention, batch_invariant, chain,
            conv_epilogue, fake_quant, expert_gemm, view_fold)


def _merge() -> dict[tuple[str, str], Callable]:
    table: dict[tuple[str, str], Callable] = {}
    for family in FAMILIES:
        for key, kernel in family.KERNELS.items():
            if key in table:
                raise RuntimeError(f"kernel {key} registered twice ({family.__name__})")
            table[key] = kernel
    for key, typed_outputs in WIDENED.items():  # float16 data computes in float32 (half.py)
        table[key] = widen_half(table[key], typed_outputs)
    return table


KERNELS = _merge()


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def kernel_for(domain: str, op: str) -> Callable | None:
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=_THESE_MODULES)  # moves to the front, never doubles
    return KERNELS.get((_domain(domain or ""), op))


def has_kernel(domain: str, op: str) -> bool:
    return kernel_for(domain, op) is not None
