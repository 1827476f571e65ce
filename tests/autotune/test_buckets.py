import pytest

from infc.compiler.autotune.buckets import DEFAULT_M_BUCKETS, bucket_of, parse_m_buckets


def test_m_goes_to_the_smallest_bucket_that_holds_it():
    assert [bucket_of(m) for m in (1, 2, 3, 5, 64, 65, 4096)] == [1, 2, 4, 8, 64, 128, 4096]
    assert bucket_of(10_000) == DEFAULT_M_BUCKETS[-1]
    assert bucket_of(3, (1, 16, 256)) == 16
    with pytest.raises(ValueError):
        bucket_of(0)


def test_profile_buckets():
    assert parse_m_buckets(None) == DEFAULT_M_BUCKETS
    assert parse_m_buckets([1, 8, 64]) == (1, 8, 64)
    for bad in ([], [0, 1], [4, 2], "1,2", [1, 2.5], [True]):
        with pytest.raises(ValueError, match="tune.m_buckets"):
            parse_m_buckets(bad)
