"""Runs a generated kernel on the CPU: the rendered source compiled by g++ against
emu/cuda_emu.h (one thread per CUDA thread, PTX fragment layouts emulated), launched with the same
geometry and argument order as the CuPy launcher. For tests of indexing, tails, prepack orders,
split-K and epilogues without a GPU; says nothing about speed. Small shapes only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

from ..runtime.cuda.geometry import kernel_args, launch_for
from .generate import arg_types, kernel_name, render
from .problems import Problem
from .variants import Variant

EMU_HEADER = Path(__file__).parent / "emu" / "cuda_emu.h"
CXX_FLAGS = ("-std=c++20", "-O1", "-g0", "-pthread", "-fPIC", "-shared", "-DINFC_EMU", "-w")


def find_cxx() -> str | None:
    return shutil.which("g++") or shutil.which("clang++")


def _wrapper(entry: str, types: list[tuple[str, str]]) -> str:
    unpack = ", ".join(f"*reinterpret_cast<{t}*>(args[{i}])" for i, (t, _) in enumerate(types))
    return (f'extern "C" void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, int eager, void** args) {{\n'
            f"    emu::launch({{gx, gy, gz}}, {{bx, 1, 1}}, eager != 0, [=] {{ {entry}({unpack}); }});\n}}\n")


def _run_cxx(args: list[str], what: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: emulator build failed:\n{proc.stderr[-4000:]}")


def _header(cxx: str, workdir: Path) -> Path:
    """The emulator header with a precompiled copy beside it (parsing the C++ headers is most of a build)."""
    text = EMU_HEADER.read_text()
    key = hashlib.sha256((text + " ".join(CXX_FLAGS)).encode()).hexdigest()[:12]
    header = workdir / f"cuda_emu_{key}.h"
    if not Path(f"{header}.gch").is_file():
        tmp = workdir / f"cuda_emu_{key}.{os.getpid()}.{threading.get_ident()}.h"
        tmp.write_text(text)
        _run_cxx([cxx, *CXX_FLAGS, "-x", "c++-header", str(tmp), "-o", f"{tmp}.gch"], "cuda_emu.h")
        tmp.replace(header)
        Path(f"{tmp}.gch").replace(f"{header}.gch")
    return header


def build(variant: Variant, workdir: Path) -> Path:
    """Shared library for `variant`, cached in `workdir` by content."""
    return build_source(render(variant), kernel_name(variant), arg_types(variant), workdir)


def build_source(kernel_source: str, entry: str, types: list[tuple[str, str]], workdir: Path) -> Path:
    """Shared library running the kernel `entry` of `kernel_source`, cached in `workdir` by content."""
    cxx = find_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler for the CUDA emulator")
    workdir = Path(workdir)
    header = _header(cxx, workdir)
    source = kernel_source + "\n" + _wrapper(entry, types)
    key = hashlib.sha256((source + header.name + " ".join(CXX_FLAGS)).encode()).hexdigest()[:20]
    lib = workdir / f"emu_{key}.so"
    if not lib.is_file():
        src = workdir / f"emu_{key}.cpp"
        src.write_text(source)
        tmp = workdir / f"emu_{key}.{os.getpid()}.{threading.get_ident()}.so"
        _run_cxx([cxx, *CXX_FLAGS, "-include", str(header), "-x", "c++", str(src), "-o", str(tmp)], entry)
        tmp.replace(lib)
    return lib


SCALAR_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "float": ctypes.c_float}


def _scalar(ctype: str, value):
    return float(value) if ctype == "float" else int(value)


def launch(variant: Variant, lib: Path, grid, block, values, *, eager: bool = True) -> None:
    """One launch: `values` in signature order, addresses (int) for pointers, ints for ints."""
    launch_types(arg_types(variant), lib, grid, block, values, eager=eager)


def launch_types(types: list[tuple[str, str]], lib: Path, grid, block, values, *, eager: bool = True) -> None:
    storage = [SCALAR_CTYPES[t](_scalar(t, v)) if t in SCALAR_CTYPES else ctypes.c_void_p(int(v))
               for (t, _), v in zip(types, values, strict=True)]
    argv = (ctypes.c_void_p * len(storage))(*[ctypes.cast(ctypes.pointer(s), ctypes.c_void_p) for s in storage])
    fn = ctypes.CDLL(str(lib)).emu_launch
    fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.c_int, ctypes.c_void_p]
    fn(*grid, block[0], int(eager), argv)


def run(problem: Problem, lib: Path, *, eager: bool = True, num_splits: int | None = None,
        num_sms: int = 132) -> np.ndarray:
    """The kernel's output (storage dtype) for `problem`, computed by the emulator."""
    params, M, N, K = problem.variant.params, problem.M, problem.N, problem.K
    geometry = launch_for(params, M, N, K, num_sms=num_sms, num_splits=num_splits)
    flat = problem.output_buffer()
    keep = {name: np.ascontiguousarray(arr) for name, arr in problem.arrays.items()}
    keep["out"] = flat
    keep["null"] = np.zeros(4, dtype=np.float32)
    keep["workspace"] = np.full(max(1, geometry.workspace_floats), np.nan, dtype=np.float32)
    keep["counters"] = np.zeros(max(1, geometry.num_counters), dtype=np.uint32)
    pointers = {name: arr.ctypes.data for name, arr in keep.items()}
    launch(problem.variant, lib, geometry.grid, geometry.block, kernel_args(params, geometry, M, N, K, pointers),
           eager=eager)
    if geometry.num_counters and keep["counters"].any():
        raise AssertionError("split-K counters not reset")
    if not problem.guard_intact(flat):
        raise AssertionError("kernel wrote past the end of its output")
    return problem.output_view(flat)


class Kernel:
    """A generated kernel run by the emulator with the CuPy launcher's call signature
    (runtime/cuda/launcher.GemmKernel): the device executor's GEMM launches in CI."""

    def __init__(self, variant: Variant, workdir: Path, num_sms: int = 132):
        self.variant, self.num_sms = variant, num_sms
        self.lib = build(variant, workdir)
        self.launches = 0

    def __call__(self, a, w, out, M: int, N: int, K: int, *, bias=None, scale=None, residual=None,
                 num_splits: int | None = None) -> None:
        params = self.variant.params
        geometry = launch_for(params, M, N, K, num_sms=self.num_sms, num_splits=num_splits)
        keep = {"a": a, "w": w, "out": out, "bias": bias, "scale": scale, "residual": residual}
        for name, array in keep.items():
            if array is not None and not (isinstance(array, np.ndarray) and array.flags.c_contiguous):
                raise ValueError(f"emulated {self.variant.name}: '{name}' must be a contiguous ndarray")
        keep = {name: array for name, array in keep.items() if array is not None}
        keep["null"] = np.zeros(4, dtype=np.float32)
        keep["workspace"] = np.full(max(1, geometry.workspace_floats), np.nan, dtype=np.float32)
        keep["counters"] = np.zeros(max(1, geometry.num_counters), dtype=np.uint32)
        pointers = {name: array.ctypes.data for name, array in keep.items()}
        launch(self.variant, self.lib, geometry.grid, geometry.block, kernel_args(params, geometry, M, N, K, pointers))
        self.launches += 1


class Function:
    """A generated kernel run by the emulator with CuPy's RawKernel call convention,
    fn(grid, block, args), args being C-contiguous ndarrays, integers and floats (the chain and row kernels in CI)."""

    def __init__(self, kernel_source: str, entry: str, types: list[tuple[str, str]], workdir: Path):
        self.entry, self.types = entry, types
        self.lib = build_source(kernel_source, entry, types, workdir)
        self.launches = 0

    def __call__(self, grid, block, args) -> None:
        values = []
        for (ctype, name), arg in zip(self.types, args, strict=True):
            if ctype in SCALAR_CTYPES:
                values.append(_scalar(ctype, arg))
            elif not (isinstance(arg, np.ndarray) and arg.flags.c_contiguous):
                raise ValueError(f"emulated {self.entry}: '{name}' must be a contiguous ndarray")
            else:
                values.append(arg.ctypes.data)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        launch_types(self.types, self.lib, grid, tuple(block), values)
        self.launches += 1
