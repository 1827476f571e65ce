"""The cuda build's safety net on the stand-in device (tests/cuda/conftest.py): a GPU op that raises or
returns wrong values, or a failing CuPy call during tuning, makes `--target auto` build a CPU plan
(one log line with the reason, `target: cpu` and `cuda_fallback_reason` in the report, nothing stored
in the engine cache) and makes an explicit `--target cuda` one `error:` line with exit 1. `--verify` on
a cuda plan runs the device executor."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from infc.cli import main
from infc.compiler import build_cuda
from infc.compiler.build import BuildOptions, build
from infc.compiler.codegen.compile import find_nvcc
from infc.compiler.errors import InfcError
from infc.compiler.plan.format import read_plan
from infc.compiler.runtime.cuda import ops
from infc.compiler.runtime.session import PlanSession

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")
MODEL = "tests/models/bert_ts.onnx"
SKIP_LN = ("com.microsoft", "SkipLayerNormalization")


def _wrong_values(inputs, attrs, ctx):  # the real op, then 1% off: what a subtle kernel bug looks like
    results = ops.DEVICE_OPS[("_real",) + SKIP_LN](inputs, attrs, ctx)
    return [results[0] * results[0].dtype.type(1.01)] + list(results[1:])


def _raises(inputs, attrs, ctx):
    raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


@pytest.fixture
def broken_op(monkeypatch, stand_in_device):
    def install(fn):
        monkeypatch.setitem(ops.DEVICE_OPS, ("_real",) + SKIP_LN, ops.DEVICE_OPS[SKIP_LN])
        monkeypatch.setitem(ops.DEVICE_OPS, SKIP_LN, fn)
    return install


def _build(tmp_path, target: str, **options):
    logged = []
    report = build(MODEL, None, str(tmp_path / "model.plan"),
                   BuildOptions(target=target, cache_dir=tmp_path / "cache", show_progress=False, **options), logged.append)
    return report, logged


@pytest.mark.parametrize("fault, reason", [(_wrong_values, "cuda self-check: output"),
                                           (_raises, "RuntimeError: cudaErrorIllegalAddress")])
def test_auto_falls_back_to_a_cpu_plan_and_cuda_errors_out(tmp_path, broken_op, fault, reason):
    broken_op(fault)
    report, logged = _build(tmp_path, "auto")
    assert report["target"] == "cpu" and report["fingerprint"]["kind"] == "cpu"
    assert reason in report["cuda_fallback_reason"]
    lines = [line for line in logged if line.startswith("target auto: cpu (the cuda build failed")]
    assert len(lines) == 1 and reason in lines[0]
    plan = read_plan(tmp_path / "model.plan")
    assert plan.meta["target"]["kind"] == "cpu" and "cuda" not in plan.meta
    assert not any(name.endswith("@nk") for name in plan.meta["weights"])  # the device's copies are gone
    assert not any(name.startswith("cubin/") for name in plan.sections)
    session = PlanSession(tmp_path / "model.plan")
    assert type(session.executor).__name__ == "Executor"

    with pytest.raises(InfcError, match="^--target cuda: ") as caught:
        _build(tmp_path, "cuda")
    assert caught.value.exit_code == 1 and reason in str(caught.value)


def test_failing_cupy_call_during_tuning_falls_back(tmp_path, stand_in_device, monkeypatch):
    def no_device(fingerprint, cache_dir):
        raise RuntimeError("CUDARuntimeError: cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy")

    monkeypatch.setattr(build_cuda, "device_target", no_device)
    report, logged = _build(tmp_path, "auto")
    assert report["target"] == "cpu" and "cudaErrorDevicesUnavailable" in report["cuda_fallback_reason"]
    again, logged = _build(tmp_path, "auto")  # not cached under the cuda key: the next build tries cuda again
    assert again["cache_hit"] is False and again["target"] == "cpu" and again["cuda_fallback_reason"]


def test_cli_reports_the_fallback_and_one_error_line(tmp_path, broken_op):
    broken_op(_raises)
    runner = CliRunner()
    auto = runner.invoke(main, ["build", MODEL, "-o", str(tmp_path / "a.plan"), "--cache-dir", str(tmp_path), "--json"])
    assert auto.exit_code == 0, auto.output
    report = json.loads(auto.stdout)
    assert report["target"] == "cpu" and "cudaErrorIllegalAddress" in report["cuda_fallback_reason"]
    cuda = runner.invoke(main, ["build", MODEL, "-o", str(tmp_path / "c.plan"), "--cache-dir", str(tmp_path), "--target", "cuda"])
    assert cuda.exit_code == 1
    errors = [line for line in cuda.stderr.splitlines() if line.startswith("error")]
    assert errors == [cuda.stderr.strip().splitlines()[-1]] and "Traceback" not in cuda.stderr
    assert errors[0].startswith("error: --target cuda: ") and "cudaErrorIllegalAddress" in errors[0]
    assert not (tmp_path / "c.plan").exists()


def test_verify_runs_the_device_executor(tmp_path, stand_in_device, monkeypatch):
    calls = []
    real = ops.DEVICE_OPS[SKIP_LN]

    def counted(inputs, attrs, ctx):
        calls.append(type(inputs[0]).__name__)
        return real(inputs, attrs, ctx)

    monkeypatch.setitem(ops.DEVICE_OPS, SKIP_LN, counted)
    report, _ = _build(tmp_path, "cuda", verify=True, use_cache=False)
    assert report["target"] == "cuda" and report["verify"]["max_rel_diff"] <= 1e-4
    assert report["cuda_self_check"]["max_rel_diff"] <= 1e-4
    per_run = 4  # bert_ts has four SkipLayerNormalization steps
    assert len(calls) == 2 * per_run and set(calls) == {"DeviceArray"}  # the self-check and --verify


def test_auto_keeps_cuda_only_when_it_runs_faster_than_the_cpu(tmp_path, stand_in_device, monkeypatch):
    monkeypatch.setattr(build_cuda, "SPEED_GUARD", True)  # the stand-in (emulated kernels) is the slower one
    monkeypatch.setattr(build_cuda, "TIMING_RUNS", 2)
    report, logged = _build(tmp_path, "auto")
    assert report["target"] == "cpu" and "the cuda plan ran slower than the CPU" in report["cuda_fallback_reason"]
    assert sum(line.startswith("target auto: cpu (the cuda plan ran slower than the CPU (") for line in logged) == 1
    report, logged = _build(tmp_path, "cuda")  # asked for explicitly: kept, with both times in the report
    check = report["cuda_self_check"]
    assert report["target"] == "cuda" and check["device_ms"] > check["cpu_ms"] > 0
