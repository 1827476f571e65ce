import pytest
import yaml

from infc.compiler.errors import BadInput
from infc.compiler.profile import check_profile_matches_model, defaulted_dims_note, load_profile, parse_profile

MODEL_INPUTS = [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 224, 224]}]


def test_static_range_and_named_dims():
    profile = parse_profile({
        "dims": {"batch": {"min": 1, "opt": 4, "max": 8}},
        "inputs": {"pixel_values": ["batch", 3, 224, 224],
                   "input_ids": {"min": [1, 1], "opt": [8, 128], "max": [8, 1024]}},
        "tune": {"m_buckets": [64, 1, 8], "budget_s": 5},
        "decode": {"max_num_seqs": 8, "num_kv_blocks": "auto"},
    }, "p.yaml")
    assert profile.inputs["pixel_values"].max == (8, 3, 224, 224)
    assert profile.inputs["input_ids"].opt == (8, 128)
    assert profile.m_buckets == (1, 8, 64)
    assert profile.normalized() == parse_profile(yaml.safe_load(yaml.safe_dump(profile.normalized() | {"inputs": {
        "pixel_values": {"min": [1, 3, 224, 224], "opt": [4, 3, 224, 224], "max": [8, 3, 224, 224]},
        "input_ids": {"min": [1, 1], "opt": [8, 128], "max": [8, 1024]}}, "tune": {"m_buckets": [1, 8, 64], "budget_s": 5}})), "q").normalized()


@pytest.mark.parametrize("data,fragment", [
    ([1, 2], "a profile is a mapping"),
    ({"inputs": {}}, "'inputs' must map"),
    ({"inputs": {"x": [1, "n"]}}, "inputs.x: dim 'n'"),
    ({"inputs": {"x": {"min": [1], "max": [2]}}}, "inputs.x: a range needs exactly min, opt and max"),
    ({"inputs": {"x": {"min": [4], "opt": [2], "max": [8]}}}, "inputs.x: need min <= opt <= max"),
    ({"inputs": {"x": {"min": [1], "opt": [2, 2], "max": [8]}}}, "different ranks"),
    ({"inputs": {"x": [1]}, "tune": {"m_buckets": [0]}}, "tune.m_buckets"),
    ({"inputs": {"x": [1]}, "decode": {"block_sise": 16}}, "decode.block_sise"),
    ({"inputs": {"x": [1]}, "extra": 1}, "unknown key 'extra'"),
    # docsmatch sweep: a typo'd tune key was ignored, `decode: 5` read as an unknown key 'decode.decode'
    ({"inputs": {"x": [1]}, "tune": {"m_bucket": [1, 8]}}, "tune.m_bucket: unknown key"),
    ({"inputs": {"x": [1]}, "decode": 5}, "'decode' must be a mapping"),
    ({"inputs": {"x": [1]}, "decode": {"num_kv_blocks": "autox"}}, "decode.num_kv_blocks must be a positive integer or auto, got 'autox'"),
])
def test_malformed_profiles_name_the_field(data, fragment):
    with pytest.raises(BadInput, match=None) as info:
        parse_profile(data, "p.yaml")
    assert fragment in str(info.value) and str(info.value).startswith("p.yaml")


def test_profile_must_match_model_inputs():
    good = parse_profile({"inputs": {"pixel_values": [2, 3, 224, 224]}}, "p.yaml")
    check_profile_matches_model(good, MODEL_INPUTS)
    for inputs, fragment in [({"pixel": [1, 3, 224, 224]}, "no input named 'pixel'"),
                             ({"pixel_values": [1, 3, 224]}, "rank 3"),
                             ({"pixel_values": [1, 1, 224, 224]}, "dim 1 must be 3")]:
        with pytest.raises(BadInput, match=fragment):
            check_profile_matches_model(parse_profile({"inputs": inputs}, "p.yaml"), MODEL_INPUTS)


def test_yaml_errors(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("inputs: [unclosed\n")
    with pytest.raises(BadInput, match="not valid YAML"):
        load_profile(bad)
    with pytest.raises(BadInput, match="no such profile"):
        load_profile(tmp_path / "missing.yaml")


def test_building_without_a_profile_says_which_dims_it_fixed():
    note = defaulted_dims_note(MODEL_INPUTS + [{"name": "mask", "dtype": "int64", "shape": [None, 7]}])
    assert "pixel_values[batch, 3, 224, 224]" in note and "mask[None, 7]" in note and "--profile" in note
    assert defaulted_dims_note([{"name": "x", "dtype": "float32", "shape": [1, 3]}]) is None


def test_input_and_dim_names_are_read_as_written(tmp_path):
    # YAML 1.1 reads bare `off`, `yes`, `null` and `010` as False, True, None and 8: as mapping keys
    # they are names (an EmbeddingBag's `off`sets input), so they stay the text the user wrote
    path = tmp_path / "p.yaml"
    path.write_text("dims:\n  on: {min: 1, opt: 2, max: 3}\n"
                    "inputs:\n  off: [on]\n  yes: [1, 2]\n  null: [3]\n  010: [4]\n  1.50: [5]\n")
    profile = load_profile(path)
    assert set(profile.inputs) == {"off", "yes", "null", "010", "1.50"}
    assert profile.inputs["off"].max == (3,)
