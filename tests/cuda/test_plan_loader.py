"""Loading a cuda plan compiles nothing: every compile entry point (nvcc, NVRTC, the emulator's g++,
subprocesses) is made to raise, and the plan's kernel table is still built from its cubin sections
through the loader's own code path, down to the module load from bytes (where a device is needed:
here a recorder stands in for cuModuleLoadData)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import types

import numpy as np
import pytest

from infc.compiler.codegen import compile as compile_module, emulate, nvrtc
from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import compile_variant, find_nvcc
from infc.compiler.codegen.generate import kernel_name
from infc.compiler.codegen.variants import BY_NAME
from infc.compiler.errors import BadInput
from infc.compiler.plan.format import read_plan, write_plan
from infc.compiler.runtime.cuda import launcher, plan_loader
from infc.compiler.runtime.cuda.backend import numpy_backend

from .conftest import FAKE_GPU

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")
VARIANT = "simt_f32_64x32x16x4x4_plain"


def _forbid(*_, **__):
    raise AssertionError("a plan load must not compile anything")


@pytest.fixture
def cuda_plan(tmp_path):
    """A one-step plan (MatMul on a constant weight) whose GEMM site runs a real sm_90 cubin."""
    variant = BY_NAME[VARIANT]
    cubin = compile_variant(variant, CubinCache(tmp_path / "cubins")).cubin.read_bytes()
    w = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
    weights = {"w": w, "w@nk": np.ascontiguousarray(w.T)}
    blob, table = b"", {}
    for name, array in weights.items():
        table[name] = {"section": "weights", "offset": len(blob), "dtype": "float32", "shape": list(array.shape)}
        blob += array.tobytes() + b"\0" * ((-array.nbytes) % 64)
    meta = {"kind": "one_shot", "target": FAKE_GPU, "opset": 17, "weights": table,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [8, 24]}], "outputs": [{"name": "y", "dtype": "float32"}],
            "program": [{"op": "MatMul", "name": "mm", "inputs": ["x", "w"], "outputs": ["y"]}],
            "value_shapes": {"max": {"x": [8, 24], "y": [8, 40]}},
            "cuda": {"gemms": [{"step": 0, "w_nk": "w@nk", "N": 40, "K": 24,
                                "choices": [{"m_max": 8, "impl": "kernel", "kernel": VARIANT}]}],
                     "kernels": {VARIANT: {"section": f"cubin/{VARIANT}", "entry": kernel_name(variant),
                                           "params": variant.params, "arch": "sm_90",
                                           "sha256": hashlib.sha256(cubin).hexdigest()}}}}
    path = tmp_path / "cuda.plan"
    write_plan(path, meta, {"weights": blob, f"cubin/{VARIANT}": cubin})
    return path, cubin


def _fake_cupy():
    cupy = types.ModuleType("cupy")
    cupy.float32, cupy.uint32 = np.float32, np.uint32
    cupy.zeros, cupy.empty = np.zeros, np.empty
    cupy.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(attributes={"MultiProcessorCount": 132}))
    return cupy


def test_plan_load_compiles_nothing(cuda_plan, monkeypatch):
    path, cubin = cuda_plan
    for module, name in ((compile_module, "compile_source"), (compile_module, "compile_variant"),
                         (compile_module, "cubin_for"), (compile_module, "find_nvcc"), (nvrtc, "compile_nvrtc"),
                         (emulate, "build"), (subprocess, "run"), (subprocess, "Popen")):
        monkeypatch.setattr(module, name, _forbid)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    loaded = []

    class Module:
        def get_function(self, name):
            loaded.append(name)
            return types.SimpleNamespace(ptr=0)

    def load_cubin(data):
        assert data == cubin  # the section's bytes, unchanged
        return Module()

    monkeypatch.setattr(launcher, "load_cubin", load_cubin)
    plan = read_plan(path)
    from infc.compiler.runtime.session import _weights

    executor = plan_loader.device_executor(plan, _weights(plan), backend=numpy_backend())
    assert loaded == [kernel_name(BY_NAME[VARIANT])]
    assert executor.report()["placement"] == {"device gemm": 1}
    assert executor.arena is not None and executor.arena.plan.arena_bytes >= 8 * 40 * 4


def test_corrupt_or_foreign_cubin_is_refused(cuda_plan):
    path, _ = cuda_plan
    plan = read_plan(path)
    meta = plan.meta["cuda"]
    with pytest.raises(BadInput, match="built for sm_90, this device is sm_100"):
        plan_loader.kernel_images(path, meta, plan.sections, arch="sm_100")
    with pytest.raises(BadInput, match="is not a cubin"):
        plan_loader.kernel_images(path, meta, {f"cubin/{VARIANT}": b"not an ELF image"}, arch="sm_90")
    with pytest.raises(BadInput, match="does not carry"):
        plan_loader.kernel_images(path, meta, {}, arch="sm_90")


def test_a_gemm_site_of_an_unknown_operand_type_is_bad_input():
    """A 16-bit site records its dtype; anything else in a plan is refused with a one-line error."""
    from infc.compiler.runtime.cuda.gemm import GemmSpec

    entry = {"step": 3, "w_nk": "w@nk", "N": 8, "K": 16, "choices": [{"m_max": 4, "impl": "cublas"}]}
    assert GemmSpec.from_json(entry).dtype == "float32"
    assert GemmSpec.from_json({**entry, "dtype": "float16"}).dtype == "float16"
    with pytest.raises(BadInput, match="step 3: unknown dtype 'int4'"):
        GemmSpec.from_json({**entry, "dtype": "int4"})
