"""Shared fixtures for the CUDA codegen tests: the `gpu` marker's skip, a per-session cubin cache
and emulator folder, and a fake CuPy that runs kernels on the CPU emulator (so the launcher and
bench/gpu_check.py run end to end without a GPU)."""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from infc.compiler.codegen import emulate
from infc.compiler.codegen.generate import arg_types
from infc.compiler.codegen.variants import BY_NAME


@functools.cache
def has_gpu() -> bool:
    try:
        import cupy  # noqa: PLC0415

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device
        return False


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and not has_gpu():
        pytest.skip("needs a CUDA device (run bench/gpu_check.py on one)")


@pytest.fixture(scope="session")
def cubin_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cubins")


@pytest.fixture(scope="session")
def emu_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("emu")


@pytest.fixture(scope="session")
def needs_cxx():
    if emulate.find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator")


class _Event:
    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class _Stream:
    """Stream capture as CuPy spells it; captured work is a list the test's function appends to."""

    def __init__(self, cupy, non_blocking=False):
        self.cupy = cupy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def begin_capture(self):
        self.cupy.captured = []

    def end_capture(self):
        calls, self.cupy.captured = self.cupy.captured, None
        return types.SimpleNamespace(calls=calls, launch=lambda stream=None: self.cupy.replays.append(len(calls)))


class _Function:
    """A RawKernel stand-in: checks what a real launch would reject, then runs the emulator."""

    def __init__(self, variant, lib):
        self.variant, self.lib, self.max_dynamic_shared_size_bytes = variant, lib, 0
        self.launches = 0

    def __call__(self, grid, block, args, shared_mem=0):
        # without the opt-in a launch gets 48 KB of static and dynamic shared memory together: the launcher
        # opts in for any dynamic size, so that a kernel's static buffers never push it over
        assert shared_mem <= self.max_dynamic_shared_size_bytes, "smem opt-in missing"
        values = []
        for (ctype, name), arg in zip(arg_types(self.variant), args, strict=True):
            if ctype == "int":
                assert isinstance(arg, np.int32), f"{name} must be np.int32"
                values.append(int(arg))
            else:
                assert isinstance(arg, np.ndarray) and arg.flags.c_contiguous, f"{name} must be a contiguous array"
                values.append(arg.ctypes.data)
        emulate.launch(self.variant, self.lib, grid, block, values)
        self.launches += 1


class _Module:
    def __init__(self, path, workdir):
        entry = json.loads(Path(path).with_suffix(".json").read_text())["entry"]
        self.entry, self.variant = entry, BY_NAME[entry.removeprefix("infc_")]
        self.lib = emulate.build(self.variant, workdir)

    def get_function(self, name):
        assert name == self.entry
        return _Function(self.variant, self.lib)


@pytest.fixture
def fake_cupy(monkeypatch, emu_dir, needs_cxx):
    """`cupy` (and cupyx.scipy.special.erf) backed by NumPy, kernels by the CPU emulator."""
    rng = np.random.default_rng(123)
    cupy = types.ModuleType("cupy")
    cupy.__getattr__ = lambda name: getattr(np, name)
    cupy.__version__ = "fake"
    cupy.asnumpy = np.asarray
    cupy.RawModule = lambda path: _Module(path, emu_dir)
    cupy.random = types.SimpleNamespace(
        standard_normal=lambda shape, dtype=np.float32: rng.standard_normal(shape).astype(dtype))
    props = {"name": b"Fake GPU (CPU emulator)", "multiProcessorCount": 4, "l2CacheSize": 2**20, "major": 9, "minor": 0}
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props,
                                    deviceSynchronize=lambda: None, driverGetVersion=lambda: 0,
                                    runtimeGetVersion=lambda: 0)
    cupy.captured, cupy.replays = None, []
    cupy.cuda = types.SimpleNamespace(runtime=runtime, Event=_Event, Stream=lambda **kw: _Stream(cupy, **kw),
                                      get_elapsed_time=lambda start, end: (end.t - start.t) * 1e3,
                                      Device=lambda: types.SimpleNamespace(attributes={"MultiProcessorCount": 4}))
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = lambda x: np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    scipy_mod, cupyx = types.ModuleType("cupyx.scipy"), types.ModuleType("cupyx")
    scipy_mod.special, cupyx.scipy = special, scipy_mod
    for name, module in (("cupy", cupy), ("cupyx", cupyx), ("cupyx.scipy", scipy_mod), ("cupyx.scipy.special", special)):
        monkeypatch.setitem(sys.modules, name, module)
    return cupy
