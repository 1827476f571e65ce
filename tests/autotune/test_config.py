import json

import pytest

from infc.compiler.autotune.config import Config
from infc.compiler.autotune.key import TuningKey, source_hash


def test_config_params_are_sorted_hashable_and_round_trip():
    a = Config.of("matmul_blocked", threads=1, block=512)
    b = Config("matmul_blocked", (("block", 512), ("threads", 1)))
    assert a == b and hash(a) == hash(b)
    assert str(a) == "matmul_blocked(block=512,threads=1)"
    assert str(Config("matmul")) == "matmul"
    assert Config.from_json(json.loads(json.dumps(a.to_json()))) == a
    assert a.param("block") == 512 and a.param("missing", 7) == 7


def test_config_rejects_what_json_cannot_hold():
    with pytest.raises(ValueError, match="JSON scalar"):
        Config.of("x", block=[1, 2])
    with pytest.raises(ValueError, match="'impl' must be a string"):
        Config.from_json({"params": {}})


def _key(**changes):
    fields = dict(op="MatMul", shape=(("M", 64), ("N", 768), ("K", 768)), dtypes=("float32",) * 3, layouts=("row", "row"),
                  epilogue="none", target="cpu:x86_64:avx512:2", source_hash="abc")
    fields.update(changes)
    return TuningKey(**fields)


def test_key_string_is_stable_and_round_trips():
    key = _key()
    assert str(key) == "MatMul|M=64,N=768,K=768|float32,float32,float32|row,row|epilogue=none|target=cpu:x86_64:avx512:2|src=abc"
    assert TuningKey.from_json(json.loads(json.dumps(key.to_json()))) == key
    assert key.dim("N") == 768


def test_every_key_field_changes_the_string():
    changes = [dict(op="Gemm"), dict(shape=(("M", 32), ("N", 768), ("K", 768))), dict(dtypes=("float16",) * 3),
               dict(layouts=("row", "col")), dict(epilogue="gelu"), dict(target="other"), dict(source_hash="def")]
    strings = {str(_key(**change)) for change in changes} | {str(_key())}
    assert len(strings) == len(changes) + 1


def test_key_rejects_separators():
    with pytest.raises(ValueError, match="may not contain"):
        _key(target="a|b")
    with pytest.raises(ValueError, match="may not contain"):
        _key(dtypes=("float32,float16",))


def test_source_hash_follows_the_source(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text("x = 1\n")
    first = source_hash(path)
    assert first == source_hash(path) and len(first) == 12
    path.write_text("x = 2\n")
    assert source_hash(path) != first
