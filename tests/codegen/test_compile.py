"""CI without a GPU: every generated variant compiles to an sm_90 cubin with no register spills
and no local-memory stack frame (ptxas resource report)."""

from __future__ import annotations

import time

import pytest

from infc.compiler.codegen.cache import CubinCache
from infc.compiler.codegen.compile import (CompileError, compile_source, compile_variants, find_nvcc,
                                           parse_ptxas)
from infc.compiler.codegen.generate import kernel_name, render
from infc.compiler.codegen.variants import VARIANTS

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA 13.0) not installed")

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16384 bytes smem
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 98 registers, used 1 barriers
"""


def test_parse_ptxas_reads_each_entry():
    a, b = parse_ptxas(PTXAS_LOG, "k_a"), parse_ptxas(PTXAS_LOG, "k_b")
    assert (a.registers, a.stack_frame, a.spill_stores, a.spill_loads, a.static_smem) == (255, 8, 4, 12, 16384)
    assert a.has_spills and not b.has_spills and b.registers == 98 and b.static_smem == 0
    with pytest.raises(CompileError, match="no ptxas report"):
        parse_ptxas(PTXAS_LOG, "k_c")


@pytest.fixture(scope="session")
def compiled(cubin_dir):
    if find_nvcc() is None:
        pytest.skip("nvcc (CUDA 13.0) not installed")
    start = time.perf_counter()
    results = compile_variants(VARIANTS, CubinCache(cubin_dir), workers=2)
    print(f"\ncompiled {len(results)} variants in {time.perf_counter() - start:.1f} s")
    return results


def test_every_variant_compiles_for_sm90(compiled):
    errors = {name: str(r).splitlines()[-1] for name, r in compiled.items() if isinstance(r, CompileError)}
    assert not errors, f"{len(errors)} variants failed to compile: {errors}"
    assert set(compiled) == {v.name for v in VARIANTS}
    assert all(r.cubin.read_bytes()[:4] == b"\x7fELF" for r in compiled.values())


def test_no_variant_spills(compiled):
    spilling = {name: r.resources for name, r in compiled.items()
                if not isinstance(r, CompileError) and r.resources.has_spills}
    assert not spilling, f"register spills / stack frames: {spilling}"


def test_register_table(compiled):
    """Prints the resource table (pytest -s); every kernel fits the 255-register cap."""
    for name, r in sorted(compiled.items()):
        if not isinstance(r, CompileError):
            print(f"{name:55s} regs {r.resources.registers:3d}  smem {r.resources.static_smem:6d}")
            assert 0 < r.resources.registers <= 255


@needs_nvcc
def test_cache_hits_by_content(tmp_path):
    variant = VARIANTS[0]
    cache = CubinCache(tmp_path)
    first = compile_source(render(variant), kernel_name(variant), cache)
    again = compile_source(render(variant), kernel_name(variant), cache)
    assert again.cubin == first.cubin and again.seconds == 0.0 and again.resources == first.resources
    assert first.cubin.name == f"{first.key}.cubin"
    other = compile_source(render(variant) + "\n// changed\n", kernel_name(variant), cache)
    assert other.cubin != first.cubin


@needs_nvcc
def test_compile_error_is_reported(tmp_path):
    with pytest.raises(CompileError, match="nvcc failed"):
        compile_source('extern "C" __global__ void broken() { undefined_call(); }', "broken", CubinCache(tmp_path))


@needs_nvcc
def test_cached_cubin_serves_a_machine_without_nvcc(tmp_path, monkeypatch):
    from infc.compiler.codegen import compile as compile_module

    variant = VARIANTS[-1]
    first = compile_source(render(variant), kernel_name(variant), CubinCache(tmp_path))
    monkeypatch.setattr(compile_module, "find_nvcc", lambda: None)
    again = compile_source(render(variant), kernel_name(variant), CubinCache(tmp_path))
    assert again.cubin == first.cubin and again.resources == first.resources
    with pytest.raises(CompileError, match="nvcc not found"):
        compile_source(render(VARIANTS[0]), kernel_name(VARIANTS[0]), CubinCache(tmp_path))
