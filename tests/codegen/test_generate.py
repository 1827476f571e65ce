"""Variant list and source generation."""

from __future__ import annotations

import collections
import re

import pytest

from infc.compiler.codegen.generate import arg_types, kernel_name, render
from infc.compiler.codegen.variants import EPILOGUES, VARIANTS, Epilogue, Variant
from infc.compiler.runtime.cuda.geometry import ARGS


def test_variant_list_covers_every_family_and_epilogue():
    families = collections.Counter(v.family for v in VARIANTS)
    assert set(families) == {"simt", "mma", "skinny", "skinny_int8"}
    for family in families:
        epilogues = {v.epilogue for v in VARIANTS if v.family == family}
        assert set(EPILOGUES) <= epilogues, family
        assert any(v.out_dtype != v.dtype for v in VARIANTS if v.family == family), "output cast"
    assert {v.dtype for v in VARIANTS if v.family == "mma"} == {"bfloat16", "float16"}
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)


def test_variant_validation():
    with pytest.raises(ValueError, match="act must be 'none'"):
        Epilogue(act="relu", swiglu=True)
    with pytest.raises(ValueError, match="dtype"):
        Variant("mma", "float32", (128, 128, 32, 2, 2, 4))
    with pytest.raises(ValueError, match="tile needs"):
        Variant("simt", "float32", (128, 128))


@pytest.mark.parametrize("variant", VARIANTS[::7], ids=lambda v: v.name)
def test_render_is_self_contained(variant):
    source = render(variant)
    assert "#include" not in source  # NVRTC and the emulator need no include path
    entry = re.search(r'extern "C" __global__ void __launch_bounds__\((\d+)\)\n(\w+)\((.*)\)', source)
    assert entry and entry.group(2) == kernel_name(variant)
    names = [p.split()[-1] for p in entry.group(3).split(", ")]
    assert names == list(ARGS[variant.family]) == [n for _, n in arg_types(variant)]


def test_render_places_constants_and_epilogue():
    v = Variant("mma", "float16", (64, 128, 32, 2, 2, 4), Epilogue(bias=True, act="gelu", out_dtype="float32"))
    source = render(v)
    assert "gemm_mma<f16, 64, 128, 32, 2, 2, 4, Epi>" in source
    assert "Epilogue<float, true, ACT_GELU, false, false, false>" in source
    assert "__launch_bounds__(128)" in source
    int8 = next(x for x in VARIANTS if x.family == "skinny_int8")
    assert "gemm_skinny<bf16, true," in render(int8) and ", true>;" in render(int8)  # scale epilogue
