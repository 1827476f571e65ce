"""The plan header's layout as data (plan/meta_schema.py): what it accepts, what it names."""

from infc.compiler.plan.meta_schema import header_problem, problem

STEP = {"op": "str", "inputs": ("list", "str"), "outputs": ("list", "str"), "attrs?": ("map", "any")}


def test_records_lists_maps_and_alternatives():
    assert problem({"op": "Add", "inputs": ["a", ""], "outputs": ["c"]}, STEP) is None
    assert problem({"op": "Add", "inputs": ["a"], "outputs": ["c"], "extra": 1}, STEP) is None  # new fields pass
    assert problem({"op": "Add", "outputs": []}, STEP) == "the header has no 'inputs'"
    assert problem({"op": "Add", "inputs": ["a", 3], "outputs": []}, STEP) == "inputs[1] is 3, expected a string"
    assert problem({"op": "Add", "inputs": [], "outputs": [], "attrs": []}, STEP) == "attrs is [], expected an object"
    assert problem([{"k": True}], ("list", {"k": ("either", "int", "null")})) == "[0].k is True, expected an integer or null"
    assert problem({"a": 0}, ("map", "count")) == "a is 0, expected an integer >= 1"
    assert problem({"a": "float32", "b": "object"}, ("map", "dtype")) is None
    assert problem("bfloat17", "dtype") == "the header is 'bfloat17', expected a dtype name"


def _header(program, outputs=("y",), weights=None):
    return {"sections": [], "meta": {
        "target": {"kind": "cpu"}, "inputs": [{"name": "x", "dtype": "float32", "shape": ["n", 4]}],
        "outputs": [{"name": name, "dtype": "float32"} for name in outputs], "weights": weights or {},
        "program": [{"op": op, "inputs": list(reads), "outputs": list(writes)} for op, reads, writes in program]}}


def test_every_name_read_is_given_before_it_is_read():
    weights = {"w": {"section": "weights", "offset": 0, "dtype": "float32", "shape": [4, 4]}}
    good = [("MatMul", ["x", "w"], ["t"]), ("Relu", ["t"], ["y"])]
    assert header_problem(_header(good, weights=weights)) is None
    assert "reads 't'" in header_problem(_header(list(reversed(good)), weights=weights))
    assert "reads 'w'" in header_problem(_header(good))
    assert header_problem(_header(good, outputs=("y", "z"), weights=weights)) == "meta.outputs[1] is 'z', which no step gives"
    assert header_problem({"sections": [{"name": "w", "offset": -64, "size": 0, "sha256": ""}], "meta": {}},
                          check_meta=False) == "sections[0].offset is -64, expected an integer >= 0"
