"""The cuda tests' stand-in device: a fake CUDA fingerprint, NumPy as the array module, generated
kernels run by the CPU emulator (launches with the CuPy launcher's signature), and a fake bench.
Real cubins are compiled with nvcc where it is installed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from infc.compiler import build_cuda, target
from infc.compiler.autotune.gpu_gemm import GpuTarget
from infc.compiler.codegen import emulate
from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import find_nvcc
from infc.compiler.codegen.chain_kernel import arg_types as chain_arg_types, chain_ops, render_chain
from infc.compiler.codegen.row_kernels import row_source
from infc.compiler.runtime.cuda import backend as backend_module, plan_loader
from infc.compiler.runtime.cuda.rows import ROW_ARGS

FAKE_GPU = {"kind": "cuda", "gpu": "NVIDIA H200 (stand-in)", "cc": "9.0", "arch": "sm_90", "sms": 132,
            "driver": 13000, "cuda_runtime": 13000, "cupy": "14.2.0"}
EMULATED = "simt_f32_64x32x16x4x4_plain"  # the tile the fake bench makes fastest: run by the emulator
# the same for the 16-bit sites of fp16 / bf16 plans
EMULATED_LOW = ("mma_bf16_64x64x64x2x2x4_tof32", "mma_f16_64x64x64x2x2x4_tof32")


def numpy_launch_for(variant):
    """A tile the stand-in serves with NumPy: 16-bit operands arrive as their bits."""
    from infc.compiler.autotune.gpu_gemm import low_dtype

    def launch(a, w, out, M, N, K, **_):
        if variant.dtype != "float32":
            a, w = (x.view(low_dtype(variant.dtype)).astype(np.float32) for x in (a, w))
        np.matmul(a, w.T, out=out)
    return launch


def fake_times(run) -> list[float]:
    """cuBLAS 10 us; the emulated tiles 8 us; other tiles 12 us (served by NumPy)."""
    fastest = run.name == EMULATED or run.name in EMULATED_LOW
    return [8e-6] * 3 if fastest else [1e-5] * 3 if run.name == "cublas" else [1.2e-5] * 3


EMU_CACHE = Path(__file__).resolve().parents[2] / "cache" / "emu"  # git-ignored; libraries named by content


@pytest.fixture(scope="session")
def emu_dir(tmp_path_factory):
    """Emulator builds (a few seconds of g++ each) kept between sessions: names are content hashes and
    writes are renamed into place, so a stale or concurrent entry cannot be picked up."""
    if emulate.find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator")
    try:
        EMU_CACHE.mkdir(parents=True, exist_ok=True)
        return EMU_CACHE
    except OSError:
        return tmp_path_factory.mktemp("emu")


@pytest.fixture(scope="session")
def emulated_kernels(emu_dir):
    """Variant name -> launch: the emulator for EMULATED and its fused-epilogue forms, NumPy for the others."""
    from infc.compiler.codegen.variants import variant_named

    class Launches(dict):
        def __missing__(self, name):
            variant = variant_named(name)
            emulated = {(variant_named(n).family, variant_named(n).dtype, variant_named(n).tile)
                        for n in (EMULATED, *EMULATED_LOW)}
            is_emulated = (variant.family, variant.dtype, variant.tile) in emulated
            self[name] = emulate.Kernel(variant, emu_dir, num_sms=4) if is_emulated else numpy_launch_for(variant)
            return self[name]

    return Launches()


@pytest.fixture
def numpy_gpu(emulated_kernels):
    return GpuTarget(np, "cuda-sm_90-test", lambda variant: emulated_kernels[variant.name], fake_times, seed=5)


@pytest.fixture
def stand_in_device(monkeypatch, numpy_gpu, emulated_kernels, emu_dir):
    """A cuda build and PlanSession on the stand-in: the probe finds FAKE_GPU, tuning uses numpy_gpu, the
    executor NumPy, and plan kernels (checked to be sm_90 cubins) run on the emulator. Returns the loaded images."""
    monkeypatch.setattr(target, "probe_cuda", lambda: (FAKE_GPU, None))
    monkeypatch.setattr(target, "cuda_fingerprint", lambda: FAKE_GPU)
    monkeypatch.setattr(build_cuda, "cuda_fingerprint", lambda: FAKE_GPU)
    monkeypatch.setattr(build_cuda, "device_target", lambda fingerprint, cache_dir: numpy_gpu)
    monkeypatch.setattr(build_cuda, "cubin_cache", lambda cache_dir: CubinCache())  # cache/cubins: by content
    monkeypatch.setattr(backend_module, "cupy_backend", backend_module.numpy_backend)
    monkeypatch.setattr(build_cuda, "SPEED_GUARD", False)  # emulated kernels are slow: no timing comparison
    loaded = {}

    def launches(images, load_module=None, num_sms=None):
        for name, image in images.items():
            assert image.cubin.startswith(b"\x7fELF") and image.arch == "sm_90"
            loaded[name] = image
        return {name: emulated_kernels[name] for name in images}

    def chain_functions(images, program, load_module=None):  # the same chains, rendered for the emulator
        functions = {}
        for entry, image in images.items():
            assert image.cubin.startswith(b"\x7fELF")
            step = program[image.steps[0]]
            source, rendered = render_chain(chain_ops(step), len(step["inputs"]))
            assert rendered == entry
            functions[entry] = emulate.Function(source, entry, chain_arg_types(image.num_inputs), emu_dir)
            loaded[entry] = image
        return functions

    def row_functions(images, load_module=None):  # the plan's row kernels, built for the emulator
        for entry, cubin in images.items():
            assert cubin.startswith(b"\x7fELF")
            loaded[entry] = cubin
        return {entry: emulate.Function(row_source(entry), entry, ROW_ARGS[entry], emu_dir) for entry in images}

    monkeypatch.setattr(plan_loader, "kernel_launches", launches)
    monkeypatch.setattr(plan_loader, "chain_functions", chain_functions)
    monkeypatch.setattr(plan_loader, "row_functions", row_functions)
    return loaded


@pytest.fixture
def compile_elementwise_body(tmp_path):
    """Compiles a CuPy ElementwiseKernel body for sm_90 inside a kernel shaped like CuPy's wrapper (float32
    inputs by value, the output by reference): catches a body NVRTC would reject, without a GPU."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc (CUDA 13.0) not installed")

    def compile_body(body: str, inputs: tuple[str, ...], output: str) -> None:
        src = tmp_path / "body.cu"
        params = ", ".join(f"const float* {name}s" for name in inputs)
        reads = " ".join(f"const float {name} = {name}s[threadIdx.x];" for name in inputs)
        src.write_text(f'extern "C" __global__ void k({params}, float* outs) {{\n    {reads}\n'
                       f"    float& {output} = outs[threadIdx.x];\n    {body};\n}}\n")
        run = subprocess.run([nvcc, "--cubin", "-arch=sm_90", "-o", str(tmp_path / "body.cubin"), str(src)],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    return compile_body
