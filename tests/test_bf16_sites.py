"""bf16_sites.bf16_valued: which float32 values of a program hold bf16 values (the GEMMs a bf16
kernel may take), on steps as a bf16 program writes them."""

from __future__ import annotations

from infc.compiler.bf16_sites import BF16, bf16_valued


def _step(op, inputs, outputs, domain="", **attrs):
    return {"op": op, "domain": domain, "inputs": inputs, "outputs": outputs, "attrs": attrs}


def test_cast_pairs_round_trips_and_data_movement_hold_bf16_values():
    steps = [
        _step("Cast", ["x"], ["x/bf16"], to=BF16),
        _step("Cast", ["x/bf16"], ["x/fp32"], to=1),  # the GEMM input of a bf16 program
        _step("Reshape", ["x/fp32", "shape"], ["x/r"]),
        _step("Transpose", ["x/bf16"], ["x/bf16/t"]),  # data movement in bf16, then back
        _step("Cast", ["x/bf16/t"], ["x/t"], to=1),
        _step("RoundTo", ["y"], ["y/rounded"], domain="infc.cpu", to=BF16),  # the executor's fold of a pair
        _step("Concat", ["x/fp32", "y/rounded"], ["xy"], axis=0),
        _step("MatMul", ["x/fp32", "w"], ["z"]),  # arithmetic: its output is not rounded
        _step("Concat", ["x/fp32", "z"], ["xz"], axis=0),
        _step("Cast", ["x"], ["x/f16"], to=10),
        _step("Cast", ["x/f16"], ["x/from_f16"], to=1),  # float16 values are not bf16 values
    ]
    assert bf16_valued(steps, [{"name": "x", "dtype": "float32"}]) == {"x/fp32", "x/r", "x/t", "y/rounded", "xy"}


def test_a_bf16_graph_input_cast_to_float32_holds_bf16_values():
    steps = [_step("Cast", ["ids"], ["ids/fp32"], to=1), _step("Cast", ["x"], ["x/fp32"], to=1)]
    assert bf16_valued(steps, [{"name": "ids", "dtype": "bfloat16"}, {"name": "x", "dtype": "float16"}]) == {"ids/fp32"}


def test_a_value_is_rounded_by_its_readers_when_each_casts_it_to_bfloat16():
    from infc.compiler.bf16_sites import rounded_by_readers

    steps = [_step("MatMul", ["x", "w"], ["y"]), _step("Cast", ["y"], ["y/bf16"], to=BF16),
             _step("Cast", ["y"], ["y/bf16b"], to=BF16), _step("Relu", ["v"], ["r"])]
    assert rounded_by_readers(steps, "y", set())
    assert not rounded_by_readers(steps, "y", {"y"})  # a graph output is read as computed
    assert not rounded_by_readers(steps + [_step("Relu", ["y"], ["s"])], "y", set())
    assert not rounded_by_readers(steps, "v", set()) and not rounded_by_readers(steps, "unread", set())
