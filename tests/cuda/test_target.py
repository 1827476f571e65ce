"""CUDA fingerprint and target resolution: auto picks cuda only with CuPy and a device (else cpu,
saying why), --target cuda without one is a one-line error naming what is missing, and a cuda plan
on another GPU / driver / CUDA is refused with exit 3 naming each differing field."""

from __future__ import annotations

import sys
import types

import pytest

from infc.compiler import target
from infc.compiler.errors import BadInput, WrongTarget
from infc.compiler.runtime.session import PlanSession

from .conftest import FAKE_GPU
from .test_plan_loader import cuda_plan  # noqa: F401 - fixture


def fake_cupy(count: int = 1, error: Exception | None = None):
    props = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132}

    def get_count():
        if error:
            raise error
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_count, getDeviceProperties=lambda i: props,
                                    driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13000)
    return types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.fixture
def no_ort_mix(monkeypatch):
    monkeypatch.setattr(target, "_ort_mix_problem", lambda: None)


def test_fingerprint_from_the_device(monkeypatch, no_ort_mix):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    fingerprint, problem = target.probe_cuda()
    assert problem is None
    assert fingerprint == {"kind": "cuda", "gpu": "NVIDIA H200", "cc": "9.0", "arch": "sm_90", "sms": 132,
                           "driver": 13000, "cuda_runtime": 13000, "cupy": "14.2.0"}
    assert set(target.CUDA_FIELDS) <= set(fingerprint)
    assert target.resolve_target("auto") == "cuda"


@pytest.mark.parametrize("cupy, reason", [
    (None, "CuPy is not importable"),
    (fake_cupy(count=0), "no CUDA device (CuPy 14.2.0 sees none)"),
    (fake_cupy(error=RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")), "no CUDA device"),
])
def test_missing_pieces_are_named(monkeypatch, no_ort_mix, cupy, reason):
    monkeypatch.setitem(sys.modules, "cupy", cupy)  # None: `import cupy` raises ImportError
    logged = []
    assert target.resolve_target("auto", logged.append) == "cpu"
    assert logged and logged[0].startswith("target auto: cpu (") and reason in logged[0]
    with pytest.raises(BadInput, match=r"--target cuda: .*" + reason.split(" (")[0]) as caught:
        target.resolve_target("cuda")
    assert caught.value.exit_code == 2


def test_onnxruntime_gpu_mix_is_named(monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "1.30.0")  # both distributions "installed"
    with pytest.raises(BadInput, match="onnxruntime and onnxruntime-gpu are both installed"):
        target.resolve_target("cuda")


def test_plan_on_another_gpu_exits_3_naming_each_field(cuda_plan, monkeypatch):  # noqa: F811
    path, _ = cuda_plan
    other = {**FAKE_GPU, "gpu": "NVIDIA H100 80GB HBM3", "driver": 12080, "cuda_runtime": 12080}
    monkeypatch.setattr(target, "cuda_fingerprint", lambda: other)
    with pytest.raises(WrongTarget) as caught:
        PlanSession(path)
    message = str(caught.value)
    assert caught.value.exit_code == 3
    for field in ("gpu", "driver", "cuda_runtime"):
        assert f"{field}: plan" in message
    assert "cc:" not in message and "--target cuda" in message


def test_plan_without_any_device_exits_3(cuda_plan, monkeypatch):  # noqa: F811
    path, _ = cuda_plan
    monkeypatch.setattr(target, "cuda_fingerprint", lambda: None)
    with pytest.raises(WrongTarget, match="kind: plan 'cuda' vs here 'cpu'"):
        PlanSession(path)
