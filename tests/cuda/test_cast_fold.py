"""Cast pairs through the low type (x -> fp16/bf16 -> fp32) run as one rounding op on the device:
which pairs fold, the bf16 rounding arithmetic the CUDA kernel uses, and a folded plan's results."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from infc.compiler.runtime.cuda.cast_fold import (BODIES, ROUND_OP, elide_repeated_rounding, fold_cast_pairs,
                                                  round_bf16_bits, round_to)


def cast(name, src, to):
    return {"op": "Cast", "domain": "", "name": name, "inputs": [src], "outputs": [name], "attrs": {"to": to}}


def relu(name, src):
    return {"op": "Relu", "domain": "", "name": name, "inputs": [src], "outputs": [name], "attrs": {}}


def test_a_pair_whose_low_value_has_one_use_folds_into_one_step():
    steps = [relu("a", "x"), cast("a16", "a", 16), cast("a32", "a16", 1), relu("b", "a32"),
             cast("b16", "b", 10), cast("b32", "b16", 1), relu("c", "b16"),   # b16 read twice: kept
             cast("s16", "shape", 10), cast("s32", "s16", 1),                  # host shape arithmetic: kept
             cast("o16", "c", 16), cast("o32", "o16", 1)]                     # o16 is a graph output: kept
    placed = fold_cast_pairs(list(enumerate(steps)), host_values={"shape"}, keep={"o16"})
    ops = [(index, step["op"]) for index, step in placed]
    assert ops == [(0, "Relu"), (1, "RoundTo"), (3, "Relu"), (4, "Cast"), (5, "Cast"), (6, "Relu"),
                   (7, "Cast"), (8, "Cast"), (9, "Cast"), (10, "Cast")]
    folded = placed[1][1]
    assert (folded["domain"], folded["op"]) == ROUND_OP
    assert folded["inputs"] == ["a"] and folded["outputs"] == ["a32"] and folded["attrs"] == {"to": 16}


def round_to_step(name, src, to):
    return {"op": ROUND_OP[1], "domain": ROUND_OP[0], "name": name, "inputs": [src], "outputs": [name],
            "attrs": {"to": to}}


def step(op, inputs, outputs):
    return {"op": op, "domain": "", "name": outputs[0], "inputs": list(inputs), "outputs": list(outputs), "attrs": {}}


def test_rounding_a_value_that_holds_low_type_values_already_is_dropped():
    steps = [round_to_step("a", "x", 16),                        # x: unknown values, kept
             step("Reshape", ["a", "shape"], ["r"]), round_to_step("r16", "r", 16),       # reshape of rounded: dropped
             step("Split", ["g", "split"], ["s0", "s1"]), round_to_step("s0r", "s0", 16),  # g rounded by cuBLAS: dropped
             round_to_step("s1h", "s1", 10),                    # another type: kept
             step("Add", ["r16", "s0r"], ["sum"]), round_to_step("sumr", "sum", 16),      # arithmetic: kept
             step("Transpose", ["sumr"], ["t"]), round_to_step("out", "t", 16),          # a graph output: kept
             step("Relu", ["s0r"], ["z"])]
    placed = elide_repeated_rounding(list(enumerate(steps)), rounded={"g": 16}, keep={"out"})
    names = [s["name"] for _, s in placed]
    assert names == ["a", "r", "s0", "s1h", "sum", "sumr", "t", "out", "z"]
    by_name = {s["name"]: s for _, s in placed}
    assert by_name["sum"]["inputs"] == ["r", "s0"] and by_name["z"]["inputs"] == ["s0"]  # readers read the input
    assert steps[6]["inputs"] == ["r16", "s0r"]  # the program itself is left as it was


def test_bf16_rounding_arithmetic_matches_ml_dtypes_on_ties_overflow_and_nan():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1.0 + 2**-8,
                        1.0 + 3 * 2**-8, 1e-40, -1e-45], dtype=np.float32)
    nan_low_payload = np.array([0x7F800001, 0xFF800001, 0x7FFFFFFF], dtype=np.uint32).view(np.float32)
    for values in (x, special, nan_low_payload):
        got = round_bf16_bits(values)
        want = values.astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def test_the_stand_in_op_rounds_like_the_two_casts():
    class Ctx:
        xp = np

    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32) * 1e3
    for to, low in ((10, np.float16), (16, ml_dtypes.bfloat16)):
        (got,) = round_to([x], {"to": to}, Ctx())
        assert got.dtype == np.float32 and np.array_equal(got, x.astype(low).astype(np.float32))


def test_the_cuda_bodies_compile_for_sm90(compile_elementwise_body):
    """The fp16 body once named CuPy's float16, which NVRTC rejected on the H200."""
    for body in BODIES.values():
        compile_elementwise_body(body, ("x",), "y")


def test_every_16_bit_site_without_an_epilogue_rounds_its_output():
    from infc.compiler.runtime.cuda.gemm import Choice, EpilogueSpec, GemmSpec

    cublas, tile = Choice(64, "cublas"), Choice(4096, "kernel", "mma_bf16_128x128x32x2x2x4_tof32")
    assert GemmSpec(3, "w@nk", 8, 8, (cublas, tile), None, "bfloat16").rounded_to == "bfloat16"
    assert GemmSpec(3, "w@nk", 8, 8, (cublas,), None, "float16").rounded_to == "float16"
    assert GemmSpec(3, "w@nk", 8, 8, (cublas,), None, "float32").rounded_to is None
    with_bias = GemmSpec(3, "w@nk", 8, 8, (cublas,), EpilogueSpec.from_json({"bias": "b", "output": "y"}), "bfloat16")
    assert with_bias.rounded_to is None  # the bias add after the GEMM leaves fp32 values


def test_a_16_bit_site_rounds_what_a_generated_tile_writes():
    import ml_dtypes

    from infc.compiler.runtime.cuda.cast_fold import round_in_place

    x = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    y = x.copy()
    round_in_place(y, "bfloat16")
    assert np.array_equal(y, x.astype(ml_dtypes.bfloat16).astype(np.float32)) and not np.array_equal(x, y)


def test_a_16_bit_site_rounds_a_widened_cublas_product_too():
    """GemmSpec.rounded_to promises low-type values; an array module whose 16-bit matmul returned fp32
    must not break that promise."""
    import types

    import ml_dtypes

    from infc.compiler.runtime.cuda.gemm import Choice, GemmSite, GemmSpec

    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 16)).astype(ml_dtypes.bfloat16).astype(np.float32)  # rounded, as the plan's are
    w = rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
    widening = types.SimpleNamespace(**{name: getattr(np, name) for name in ("empty", "asarray")},
                                     matmul=lambda x, y: np.matmul(x.astype(np.float32), y.astype(np.float32)))
    site = GemmSite(GemmSpec(0, "w@nk", 8, 16, (Choice(64, "cublas"),), None, "bfloat16"), w, {}, widening)
    out = site(a)
    assert np.array_equal(out, out.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.abs(out - a @ w.astype(np.float32).T).max() < 0.05
