import struct

import numpy as np
import pytest

from infc.compiler.errors import BadInput
from infc.compiler.plan.format import FORMAT_VERSION, read_plan, release_mapped_pages, write_plan


def _write(path):
    weights = np.arange(100, dtype=np.float32).tobytes()
    write_plan(path, {"hello": "world", "n": 3}, {"weights": weights, "island0": b"abc"})
    return weights


def test_round_trip_and_alignment(tmp_path):
    path = tmp_path / "p.plan"
    weights = _write(path)
    plan = read_plan(path, check_meta=False)
    assert plan.meta == {"hello": "world", "n": 3}
    assert bytes(plan.sections["weights"]) == weights
    assert bytes(plan.sections["island0"]) == b"abc"
    array = np.frombuffer(plan.sections["weights"], dtype=np.float32)
    assert array.ctypes.data % 64 == 0 and array[99] == 99


def test_truncated_plan(tmp_path):
    path = tmp_path / "p.plan"
    _write(path)
    data = path.read_bytes()
    for cut in (4, 30, len(data) - 10):
        path.write_bytes(data[:cut])
        with pytest.raises(BadInput, match="p.plan"):
            read_plan(path, check_meta=False)


def test_every_flipped_byte_is_detected(tmp_path):
    path = tmp_path / "p.plan"
    _write(path)
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[12:20])[0]
    # Padding bytes between sections carry nothing; every other byte is covered by a check.
    covered = [i for i in range(len(data)) if i < 52 + header_len or data[i] != 0]
    for index in covered[:: max(1, len(covered) // 200)]:
        flipped = bytearray(data)
        flipped[index] ^= 0x01
        path.write_bytes(flipped)
        with pytest.raises(BadInput):
            read_plan(path, check_meta=False)


def test_newer_format_version_is_refused(tmp_path):
    path = tmp_path / "p.plan"
    _write(path)
    data = bytearray(path.read_bytes())
    data[8:12] = struct.pack("<I", FORMAT_VERSION + 1)
    path.write_bytes(data)
    with pytest.raises(BadInput, match="newer than this infc reads"):
        read_plan(path, check_meta=False)


def test_an_array_section_is_written_from_the_arrays_as_their_bytes_joined(tmp_path):
    from infc.compiler.build import weights_section

    weights = {"scalar": np.array(3.5, np.float32), "ids": np.arange(5, dtype=np.int64), "flags": np.array([True, False]),
               "half": np.ones((3, 4), np.float16), "strided": np.ones((2, 3), np.float32)[:, ::2],
               "empty": np.zeros((0, 3), np.float32), "bytes": np.array(7, np.int8)}
    section, table = weights_section(weights)
    joined = bytearray(len(section))
    for name, array in weights.items():
        data = np.ascontiguousarray(array).tobytes()
        joined[table[name]["offset"]:table[name]["offset"] + len(data)] = data
    path = tmp_path / "p.plan"
    write_plan(path, {"weights": table}, {"weights": section, "after": b"abc"})
    plan = read_plan(path, check_meta=False)  # checks each section's sha256
    assert bytes(plan.sections["weights"]) == bytes(joined) and bytes(plan.sections["after"]) == b"abc"
    assert all(offset % 64 == 0 for offset in (entry["offset"] for entry in table.values()))


def test_a_mapped_weight_gives_back_its_pages_and_reads_the_same_after(tmp_path):
    path = tmp_path / "p.plan"
    weights = np.arange(64 * 1024, dtype=np.float32)
    write_plan(path, {}, {"weights": weights.tobytes()})
    plan = read_plan(path, check_meta=False)
    array = np.frombuffer(plan.sections["weights"], dtype=np.float32).reshape(256, 256)
    assert release_mapped_pages(array)
    assert np.array_equal(array.ravel(), weights)  # read again from the file
    assert not release_mapped_pages(weights)  # not from a mapping: nothing to give back
    assert not release_mapped_pages(array[:1, :8])  # no whole page inside
