"""Where the device executor's arrays live: an array module (`xp`) plus the two copies between host
and device. The same executor runs on CuPy (a GPU) and on NumPy (CI), so every placement decision,
layout and arena offset of the GPU path is exercised on the CPU too.

With NumPy, device arrays are `DeviceArray`, an ndarray subclass: a host kernel handed a device
array, or a device op handed a host one, shows up as a wrong type or as an extra counted copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class DeviceArray(np.ndarray):
    """NumPy standing in for device memory (tests and CI)."""


@dataclass
class Backend:
    name: str
    xp: Any
    to_device: Callable          # host ndarray -> device array (a copy)
    to_host: Callable            # device array -> host ndarray (a copy)
    is_device: Callable          # array -> bool
    adopt: Callable              # an op's result -> device array (no copy)
    erf: Callable
    synchronize: Callable = lambda: None
    copies: dict = field(default_factory=lambda: {"to_device": 0, "to_host": 0})

    def upload(self, array):
        self.copies["to_device"] += 1
        return self.to_device(np.ascontiguousarray(array))

    def download(self, array):
        self.copies["to_host"] += 1
        return self.to_host(array)


def numpy_backend() -> Backend:
    from ..kernels.elementwise import erf  # noqa: PLC0415 - the CPU runtime's float32 erf

    def to_device(a):
        return np.array(a, copy=True).view(DeviceArray)

    def adopt(a):
        a = np.asarray(a) if not isinstance(a, np.ndarray) else a
        return a if isinstance(a, DeviceArray) else a.view(DeviceArray)

    return Backend("numpy", np, to_device, lambda a: np.array(a, copy=True).view(np.ndarray),
                   lambda a: isinstance(a, DeviceArray), adopt,
                   lambda x: erf(np.asarray(x)).astype(x.dtype, copy=False).view(DeviceArray))


def _is_extension_16bit(dtype) -> bool:
    """bfloat16 (ml_dtypes): CuPy computes with it but copies it most reliably as its bits."""
    return dtype.itemsize == 2 and dtype.kind not in "fiu"


def cupy_backend() -> Backend:
    import cupy  # noqa: PLC0415 - GPU machines only
    from cupyx.scipy.special import erf  # noqa: PLC0415

    def to_device(a):
        return cupy.asarray(a.view(np.uint16)).view(a.dtype) if _is_extension_16bit(a.dtype) else cupy.asarray(a)

    def to_host(a):
        return cupy.asnumpy(a.view(cupy.uint16)).view(a.dtype) if _is_extension_16bit(a.dtype) else cupy.asnumpy(a)

    return Backend("cupy", cupy, to_device, to_host, lambda a: isinstance(a, cupy.ndarray), cupy.asarray,
                   erf, cupy.cuda.runtime.deviceSynchronize)
