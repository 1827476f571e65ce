"""The instruction-set features of the CPU that numba compiles for (llvmlite's host features), by
LLVM's names ("avx512f", "avx512vnni", "avx512bf16", "amx-bf16", ...): which register-tile kernels
may run here. Empty without llvmlite, and then no kernel is compiled at all."""

from __future__ import annotations

import functools


@functools.cache
def host_features() -> dict:
    try:
        from llvmlite import binding  # noqa: PLC0415 - numba's own dependency
        return dict(binding.get_host_cpu_features())
    except Exception:  # noqa: BLE001 - no llvmlite: no compiled kernels either
        return {}


@functools.cache
def has(*names: str) -> bool:
    """The host has every one of these features (kept: kernels ask on every call, 120 times a decode step)."""
    features = host_features()
    return all(features.get(name) for name in names)
