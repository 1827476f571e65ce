"""NVRTC through CuPy, for machines without nvcc: source -> cubin for one architecture.

Notes from GUIDE 9: cupy.cuda.nvrtc's getCUBIN drops the cubin's last byte (append one zero byte);
NVRTC 13.5 emits PTX the 13.0 toolchain rejects, so cubins (not PTX) are what plans carry. The
generated sources include no headers, so NVRTC needs no CUDA include folder for them.
"""

from __future__ import annotations

from .compile import CompileError, Resources, parse_ptxas

ELF_MAGIC = b"\x7fELF"


def compile_nvrtc(source: str, entry: str, arch: str = "sm_90") -> tuple[bytes, Resources | None]:
    try:
        from cupy.cuda import nvrtc  # noqa: PLC0415 - optional
    except Exception as error:  # noqa: BLE001 - no CuPy, or its NVRTC library is missing
        raise CompileError(f"{entry}: neither nvcc nor NVRTC (CuPy) is available: {error}") from None
    options = (f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v")
    try:
        program = nvrtc.createProgram(source, f"{entry}.cu", (), ())
    except Exception as error:  # noqa: BLE001 - libnvrtc not found
        raise CompileError(f"{entry}: NVRTC is not usable: {error}") from None
    try:
        try:
            nvrtc.compileProgram(program, options)
        except Exception as error:  # noqa: BLE001 - NVRTCError carries the log separately
            raise CompileError(f"{entry}: NVRTC failed: {error}\n{nvrtc.getProgramLog(program)[-4000:]}") from None
        cubin = nvrtc.getCUBIN(program)
        log = nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)
    if isinstance(cubin, str):
        cubin = cubin.encode("latin-1")
    cubin = bytes(cubin) + b"\0"  # see the module docstring
    if not cubin.startswith(ELF_MAGIC):
        raise CompileError(f"{entry}: NVRTC returned no cubin")
    try:
        resources = parse_ptxas(log, entry)
    except CompileError:
        resources = None  # this NVRTC wrote no ptxas report
    return cubin, resources
