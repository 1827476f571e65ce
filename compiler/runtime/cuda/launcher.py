"""Loads a compiled GEMM cubin with CuPy and launches it. Nothing is compiled here: the cubin
comes from the build (or compiler/codegen/compile.py); CuPy is imported when a kernel is loaded.

Arrays are CuPy arrays in device storage: float32, or uint16 bit patterns for bf16/fp16 (CuPy
has no bfloat16 dtype), packed uint8 weights for the skinny families. A kernel object owns its
split-K workspace and counters, so use one object per stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .geometry import ITEMSIZE, Launch, kernel_args, launch_for, output_shape, packed_shape

MAX_SHARED_CARVEOUT = 100  # percent of the unified L1 as shared memory (cudaSharedmemCarveoutMaxShared)


class GemmKernel:
    def __init__(self, cubin: Path | str | None, kernel_name: str, params: Mapping[str, Any], num_sms: int | None = None,
                 module=None):
        """`cubin` a file path, or None with `module` already loaded (a plan's bytes: load_cubin)."""
        import cupy  # noqa: PLC0415 - the CPU runtime never imports CuPy

        self._cp = cupy
        self.params = dict(params)
        self.module = module if module is not None else cupy.RawModule(path=str(cubin))
        self.function = self.module.get_function(kernel_name)
        self.num_sms = num_sms or cupy.cuda.Device().attributes["MultiProcessorCount"]
        # dynamic shared memory opted in so far: the 48 KB a launch gets without opting in covers static and
        # dynamic together, so any dynamic size opts in (a 48 KB skinny ring plus its 2 KB reduction buffer
        # failed to launch on the H200 when only sizes over 48 KB did)
        self._smem_limit = 0
        self._null = cupy.zeros(4, dtype=cupy.float32)
        self._workspace = cupy.empty(0, dtype=cupy.float32)
        self._counters = cupy.zeros(0, dtype=cupy.uint32)

    def launch_for(self, M: int, N: int, K: int, num_splits: int | None = None) -> Launch:
        return launch_for(self.params, M, N, K, self.num_sms, num_splits)

    def __call__(self, a, w, out, M: int, N: int, K: int, *, bias=None, scale=None, residual=None,
                 num_splits: int | None = None) -> Launch:
        launch = self.launch_for(M, N, K, num_splits)
        self._check(a, w, out, bias, scale, residual, M, N, K)
        if launch.smem_bytes > self._smem_limit:
            self._opt_in_smem(launch.smem_bytes)
            self._smem_limit = launch.smem_bytes
        arrays = {"a": a, "w": w, "out": out, "bias": bias, "scale": scale, "residual": residual, "null": self._null}
        if launch.workspace_floats:
            if self._workspace.size < launch.workspace_floats:
                self._workspace = self._cp.empty(launch.workspace_floats, dtype=self._cp.float32)
            if self._counters.size < launch.num_counters:  # zero once; the kernel resets its counters
                self._counters = self._cp.zeros(launch.num_counters, dtype=self._cp.uint32)
            arrays.update(workspace=self._workspace, counters=self._counters)
        pointers = {name: arr for name, arr in arrays.items() if arr is not None}
        args = kernel_args(self.params, launch, M, N, K, pointers, as_int=np.int32)
        self.function(launch.grid, launch.block, args, shared_mem=launch.smem_bytes)
        return launch

    def _opt_in_smem(self, nbytes: int) -> None:
        """RawKernel has a property for it; a Function of a Module loaded from bytes goes through the driver.
        The carveout hint asks for the largest shared-memory share of the unified L1, so that two blocks of
        96 KB (the 128x128x64 mma tile) can share a multiprocessor."""
        if hasattr(self.function, "max_dynamic_shared_size_bytes"):
            self.function.max_dynamic_shared_size_bytes = nbytes
            if hasattr(self.function, "preferred_shared_memory_carveout"):
                self.function.preferred_shared_memory_carveout = MAX_SHARED_CARVEOUT
        else:
            driver = self._cp.cuda.driver
            driver.funcSetAttribute(self.function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
            carveout = getattr(driver, "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", 9)  # 9 in cuda.h
            driver.funcSetAttribute(self.function.ptr, carveout, MAX_SHARED_CARVEOUT)

    def _check(self, a, w, out, bias, scale, residual, M: int, N: int, K: int) -> None:
        """Catches what would otherwise be a silent out-of-bounds access."""
        p = self.params
        out_elems = int(np.prod(output_shape(p, M, N)))
        expect = {"a": (M * K * ITEMSIZE[p["dtype"]], a), "out": (out_elems * ITEMSIZE[p["out_dtype"]], out)}
        if p["family"].startswith("skinny"):
            rows, k = packed_shape(p, N, K)
            expect["w"] = (rows * k * (1 if p["family"] == "skinny_int8" else 2), w)
        else:
            expect["w"] = (N * K * ITEMSIZE[p["dtype"]], w)
        if p.get("residual"):
            expect["residual"] = (expect["out"][0], residual)
        if p.get("bias"):
            expect["bias"] = (N * 4, bias)
        if p["family"] == "skinny_int8":
            expect["scale"] = (N * 4, scale)
        for name, (nbytes, arr) in expect.items():
            if arr is None or arr.nbytes < nbytes or not arr.flags.c_contiguous:
                raise ValueError(f"gemm {p['family']}: '{name}' must be a contiguous array of at least {nbytes} bytes")


def load_cubin(cubin: bytes):
    """A CUDA module from cubin bytes (cuModuleLoadData): no file, no compiler, nothing cached by path."""
    from cupy.cuda import function  # noqa: PLC0415

    module = function.Module()
    module.load(bytes(cubin))
    return module
