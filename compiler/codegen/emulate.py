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


def _wrapper(variant: Variant) -> str:
    unpack = ", ".join(f"*reinterpret_cast<{t}*>(args[{i}])" for i, (t, _) in enumerate(arg_types(variant)))
    return (f'extern "C" void emu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, int eager, void** args) {{\n'
            f"    emu::launch({{gx, gy, gz}}, {{bx, 1, 1}}, eager != 0, [=] {{ {kernel_name(variant)}({unpack}); }});\n}}\n")


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
    cxx = find_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler for the CUDA emulator")
    workdir = Path(workdir)
    header = _header(cxx, workdir)
    source = render(variant) + "\n" + _wrapper(variant)
    key = hashlib.sha256((source + header.name + " ".join(CXX_FLAGS)).encode()).hexdigest()[:20]
    lib = workdir / f"emu_{key}.so"
    if not lib.is_file():
        src = workdir / f"emu_{key}.cpp"
        src.write_text(source)
        tmp = workdir / f"emu_{key}.{os.getpid()}.{threading.get_ident()}.so"
        _run_cxx([cxx, *CXX_FLAGS, "-include", str(header), "-x", "c++", str(src), "-o", str(tmp)], variant.name)
        tmp.replace(lib)
    return lib


def launch(variant: Variant, lib: Path, grid, block, values, *, eager: bool = True) -> None:
    """One launch: `values` in signature order, addresses (int) for pointers, ints for ints."""
    storage = [ctypes.c_int(int(v)) if t == "int" else ctypes.c_void_p(int(v))
               for (t, _), v in zip(arg_types(variant), values, strict=True)]
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
