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
    model, flags = cpu_model_and_all_flags()
    return model, sorted(f for f in ISA_FLAGS if f in flags)


@lru_cache(maxsize=1)
def cpu_model_and_all_flags() -> tuple[str, frozenset[str]]:
    """The CPU's model name and every feature flag /proc/cpuinfo lists (none where it cannot be read)."""
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
    return model, frozenset(flags)


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


def _here_for(plan_fingerprint: dict) -> dict:
    kind = plan_fingerprint.get("kind")
    if kind == "cuda":
        return cuda_fingerprint() or {"kind": "cpu", "gpu": None}  # no device here: every GPU field differs
    return cpu_fingerprint() if kind == "cpu" else {"kind": "cpu"}


def check_target(plan_fingerprint: dict, plan_path: str, model_hint: str | None = None,
                 here: dict | None = None) -> None:
    """`here` defaults to this machine's fingerprint of the plan's kind."""
    here = _here_for(plan_fingerprint) if here is None else here
    differing = [k for k in sorted(set(plan_fingerprint) | set(here)) if plan_fingerprint.get(k) != here.get(k)]
    if differing:
        fields = "; ".join(f"{k}: plan {plan_fingerprint.get(k)!r} vs here {here.get(k)!r}" for k in differing)
        flag = " --target cuda" if plan_fingerprint.get("kind") == "cuda" else ""
        rebuild = f"infc build {model_hint or 'MODEL.onnx'} --profile PROFILE.yaml{flag} -o {plan_path}"
        raise WrongTarget(f"{plan_path}: built for another target ({fields}); rebuild here with: {rebuild}")


# ---- CUDA ---------------------------------------------------------------------------------------
# What a cuda plan is bound to: the cubins are built for one architecture, and the tuned choices
# hold for one GPU model, driver and CUDA runtime. CuPy's version is part of it because the
# runtime's array ops (and the cuBLAS it links) come from it.
CUDA_FIELDS = ("gpu", "cc", "arch", "sms", "driver", "cuda_runtime", "cupy")


def _ort_mix_problem() -> str | None:
    """onnxruntime and onnxruntime-gpu install into one folder; the last one wins and `pip check`
    stays silent, so a half-overwritten install is found by asking for both distributions."""
    from importlib import metadata  # noqa: PLC0415

    installed = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(name)
            installed.append(name)
        except metadata.PackageNotFoundError:
            pass
    if len(installed) == 2:
        return ("onnxruntime and onnxruntime-gpu are both installed into one folder (the last installed "
                "overwrote the other's files): uninstall both, then install one")
    return None


def probe_cuda() -> tuple[dict | None, str | None]:
    """(fingerprint, None) when CuPy imports and device 0 answers, else (None, why not)."""
    problem = _ort_mix_problem()
    if problem:
        return None, problem
    try:
        import cupy  # noqa: PLC0415 - optional: CPU machines never have it
    except Exception as error:  # noqa: BLE001 - ImportError, or a CuPy built for another CUDA
        return None, f"CuPy is not importable ({type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}); " \
                     "install it with pip install 'infc[gpu]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # noqa: BLE001 - no driver: CUDARuntimeError
        return None, f"no CUDA device (CuPy {cupy.__version__}: {str(error).splitlines()[0][:120]})"
    if count < 1:
        return None, f"no CUDA device (CuPy {cupy.__version__} sees none)"
    return cuda_fingerprint_of(cupy, 0), None


def cuda_fingerprint_of(cupy, device: int = 0) -> dict:
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return {"kind": "cuda", "gpu": name, "cc": f"{props['major']}.{props['minor']}",
            "arch": f"sm_{props['major']}{props['minor']}", "sms": int(props["multiProcessorCount"]),
            "driver": int(cupy.cuda.runtime.driverGetVersion()), "cuda_runtime": int(cupy.cuda.runtime.runtimeGetVersion()),
            "cupy": cupy.__version__}


@lru_cache(maxsize=1)
def cuda_fingerprint() -> dict | None:
    return probe_cuda()[0]


def resolve_target(requested: str, log=lambda msg: None) -> str:
    """auto: cuda when CuPy imports and a device answers, else cpu (the build log says why);
    cuda without one: BadInput naming what is missing."""
    from .errors import BadInput  # noqa: PLC0415

    if requested == "cpu":
        return "cpu"
    fingerprint, problem = probe_cuda()
    if requested == "cuda":
        if problem:
            raise BadInput(f"--target cuda: {problem}")
        return "cuda"
    if requested == "auto":
        if problem:
            log(f"target auto: cpu ({problem})")
            return "cpu"
        log(f"target auto: cuda ({fingerprint['gpu']}, {fingerprint['arch']})")
        return "cuda"
    raise BadInput(f"--target {requested}: expected auto, cpu or cuda")


def target_fingerprint(target: str) -> dict:
    if target == "cuda":
        fingerprint = cuda_fingerprint()
        if fingerprint is None:
            from .errors import BadInput  # noqa: PLC0415

            raise BadInput(f"--target cuda: {probe_cuda()[1]}")
        return fingerprint
    return cpu_fingerprint()
