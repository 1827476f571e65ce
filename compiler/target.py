"""Target fingerprints: what a plan is bound to. A plan built elsewhere is refused (exit 3) with
the fields that differ and the command that rebuilds it."""

from __future__ import annotations

import platform
from functools import lru_cache

import numpy as np

from .errors import WrongTarget

# ISA features that change which kernels are valid or fast; everything else in cpuinfo is noise.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "amx_tile", "asimd", "sve")


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "CPU part") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return model, sorted(f for f in ISA_FLAGS if f in flags)


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            return f"{infos[0].get('internal_api')} {infos[0].get('version')}"
    except Exception:  # noqa: BLE001 - a fingerprint field, never a failure
        pass
    return "unknown"


@lru_cache(maxsize=1)
def cpu_fingerprint() -> dict:
    model, flags = _cpu_model_and_flags()
    return {"kind": "cpu", "arch": platform.machine(), "cpu": model, "isa": flags, "numpy": np.__version__, "blas": _blas()}


def fingerprint_id(fingerprint: dict) -> str:
    """A short, stable name for a fingerprint (tuning keys and cache keys embed it)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:12]
    return f"{fingerprint.get('kind', 'cpu')}-{fingerprint.get('arch', '')}-{digest}"


def check_target(plan_fingerprint: dict, plan_path: str, model_hint: str | None = None) -> None:
    here = cpu_fingerprint() if plan_fingerprint.get("kind") == "cpu" else {"kind": "cpu"}
    differing = [k for k in sorted(set(plan_fingerprint) | set(here)) if plan_fingerprint.get(k) != here.get(k)]
    if differing:
        fields = "; ".join(f"{k}: plan {plan_fingerprint.get(k)!r} vs here {here.get(k)!r}" for k in differing)
        rebuild = f"infc build {model_hint or 'MODEL.onnx'} --profile PROFILE.yaml -o {plan_path}"
        raise WrongTarget(f"{plan_path}: built for another target ({fields}); rebuild here with: {rebuild}")
