"""A cuda plan's executor: kernels from the plan's cubin sections (loaded, never compiled), GEMM
sites, the arena, the device backend. Everything up to `load_module` needs no device, so CI checks
that a load compiles nothing (tests/cuda/test_plan_loader.py).

meta["cuda"]:
    kernels  {variant: {"section": "cubin/<variant>", "entry", "params", "arch", "sha256", ...}}
    gemms    [{"step", "w_nk", "N", "K", "choices": [...], "epilogue": {...}}]   (gemm.py)
    chains   {entry: {"section": "cubin/<entry>", "num_inputs", "steps", "arch", "sha256", ...}}  (chain.py)
    rows     {entry: {"section": "cubin/<entry>", "arch", "sha256", ...}}  (rows.py; absent in older plans)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ...errors import BadInput
from .chain import ChainRunner
from .gemm import GemmSpec
from .rows import RowKernels

ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class KernelImage:
    name: str
    entry: str
    params: dict
    arch: str
    cubin: bytes


def kernel_images(plan_path, cuda_meta: Mapping, sections: Mapping[str, Any], arch: str | None = None) -> dict[str, KernelImage]:
    """The plan's cubins, checked: section present, an ELF image, the recorded sha256, the device's arch."""
    return {name: KernelImage(name, info["entry"], dict(info["params"]), info.get("arch", ""),
                              _cubin(plan_path, name, info, sections, arch))
            for name, info in (cuda_meta.get("kernels") or {}).items()}


def chain_images(plan_path, cuda_meta: Mapping, sections: Mapping[str, Any], arch: str | None = None) -> dict[str, ChainImage]:
    """The plan's elementwise-chain cubins (meta["cuda"]["chains"]), checked as the GEMM ones."""
    return {entry: ChainImage(entry, int(info["num_inputs"]), tuple(int(i) for i in info["steps"]),
                              _cubin(plan_path, entry, info, sections, arch))
            for entry, info in (cuda_meta.get("chains") or {}).items()}


def row_images(plan_path, cuda_meta: Mapping, sections: Mapping[str, Any], arch: str | None = None) -> dict[str, bytes]:
    """The plan's row-kernel cubins (meta["cuda"]["rows"]) by entry, checked as the GEMM ones."""
    return {entry: _cubin(plan_path, entry, info, sections, arch) for entry, info in (cuda_meta.get("rows") or {}).items()}


def row_functions(images: Mapping[str, bytes], load_module=None) -> dict[str, Callable]:
    """Row entry -> fn(grid, block, args) from its cubin's module (tests swap in the CPU emulator)."""
    from .launcher import load_cubin  # noqa: PLC0415 - imports CuPy

    load_module = load_module or load_cubin
    return {entry: load_module(cubin).get_function(entry) for entry, cubin in images.items()}


def _cubin(plan_path, name: str, info: Mapping, sections: Mapping[str, Any], arch: str | None) -> bytes:
    """A section present, an ELF image, the recorded sha256, the device's arch."""
    section = info.get("section")
    if section not in sections:
        raise BadInput(f"{plan_path}: kernel '{name}' needs section '{section}', which the plan does not carry")
    cubin = bytes(sections[section])
    if not cubin.startswith(ELF_MAGIC):
        raise BadInput(f"{plan_path}: section '{section}' is not a cubin")
    if info.get("sha256") and hashlib.sha256(cubin).hexdigest() != info["sha256"]:
        raise BadInput(f"{plan_path}: section '{section}' does not match its recorded sha256")
    if arch is not None and info.get("arch") != arch:
        raise BadInput(f"{plan_path}: kernel '{name}' was built for {info.get('arch')}, this device is {arch}")
    return cubin


def chain_functions(images: Mapping[str, ChainImage], program: list[dict], load_module=None) -> dict[str, Callable]:
    """Chain entry -> fn(grid, block, args) from the cubin's module (cuModuleLoadData through CuPy).
    `program` lets a stand-in device (tests) render the same chain for the CPU emulator."""
    from .launcher import load_cubin  # noqa: PLC0415 - imports CuPy

    load_module = load_module or load_cubin
    return {entry: load_module(image.cubin).get_function(entry) for entry, image in images.items()}


@dataclass(frozen=True)
class ChainImage:
    entry: str
    num_inputs: int
    steps: tuple[int, ...]   # the ElementwiseChain steps that run it (identical chains share a cubin)
    cubin: bytes


def gemm_specs(cuda_meta: Mapping) -> list[GemmSpec]:
    return [GemmSpec.from_json(entry) for entry in cuda_meta.get("gemms") or []]


def kernel_launches(images: Mapping[str, KernelImage], load_module: Callable[[bytes], Any] | None = None,
                    num_sms: int | None = None) -> dict[str, Callable]:
    """Variant name -> launch. `load_module(bytes)` defaults to cuModuleLoadData through CuPy."""
    from .launcher import GemmKernel, load_cubin  # noqa: PLC0415 - imports CuPy when a kernel is built

    load_module = load_module or load_cubin
    return {name: GemmKernel(None, image.entry, image.params, num_sms, module=load_module(image.cubin))
            for name, image in images.items()}


def device_executor(plan, weights: dict[str, np.ndarray], backend=None, launches=None):
    """The DeviceExecutor of a loaded cuda plan (session.py dispatches here)."""
    from .arena import Arena, plan_arena  # noqa: PLC0415
    from .backend import cupy_backend  # noqa: PLC0415
    from .executor import DeviceExecutor  # noqa: PLC0415
    from .ops import VIEW_OPS  # noqa: PLC0415

    meta = plan.meta
    cuda_meta = meta.get("cuda") or {}
    backend = backend or cupy_backend()
    arch, num_sms = meta["target"].get("arch"), meta["target"].get("sms") or 132
    if launches is None:
        launches = kernel_launches(kernel_images(plan.path, cuda_meta, plan.sections, arch), num_sms=num_sms)
    images = chain_images(plan.path, cuda_meta, plan.sections, arch)
    functions = chain_functions(images, meta["program"]) if images else {}
    chains = {step: ChainRunner(functions[entry], image.num_inputs, num_sms)
              for entry, image in images.items() for step in image.steps}
    row_cubins = row_images(plan.path, cuda_meta, plan.sections, arch)
    rows = RowKernels(row_functions(row_cubins)) if row_cubins else None
    output_names = [o["name"] for o in meta["outputs"]]
    specs = gemm_specs(cuda_meta)
    arena = None
    shapes = (meta.get("value_shapes") or {}).get("max") or {}
    sizes = {}
    for spec in specs:
        out = spec.epilogue.output if spec.epilogue is not None else meta["program"][spec.step]["outputs"][0]
        if out in shapes:
            sizes[out] = int(np.prod(shapes[out])) * weights[spec.w_nk].dtype.itemsize
    if sizes:  # planned by the executor over the steps as the device runs them (epilogues absorb steps,
        # dropped roundings make a GEMM output live on where its rounded copy did)
        def arena(steps):
            return Arena(plan_arena(steps, output_names, sizes, VIEW_OPS), backend.xp)
    islands = {name: bytes(view) for name, view in plan.sections.items() if name.startswith("island")}
    return DeviceExecutor(meta["program"], weights, meta.get("opset", 17), backend, islands=islands,
                          output_names=output_names, gemms=specs, launches=launches, arena=arena, chains=chains,
                          rows=rows)
