"""Shape buckets: a GEMM with M rows is tuned (and cached) at the smallest bucket that holds it.

Bucketing keeps the number of tuning keys small (a decoder sees every M from 1 to the batch size)
while tuning at the bucket's own M, the largest M the bucket serves. Past the last bucket GEMMs are
large enough to behave alike, so they all share the last bucket.
"""

from __future__ import annotations

import bisect
from typing import Any, Sequence

DEFAULT_M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def parse_m_buckets(value: Any, field: str = "tune.m_buckets") -> tuple[int, ...]:
    """A profile's bucket list, or the defaults for None; ValueError naming the field otherwise."""
    if value is None:
        return DEFAULT_M_BUCKETS
    if (not isinstance(value, Sequence) or isinstance(value, str) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"{field}: expected a non-empty list of positive integers, got {value!r}")
    if any(b <= a for a, b in zip(value, value[1:])):
        raise ValueError(f"{field}: buckets must be strictly increasing, got {list(value)}")
    return tuple(value)


def bucket_of(m: int, buckets: Sequence[int] = DEFAULT_M_BUCKETS) -> int:
    if m < 1:
        raise ValueError(f"M must be at least 1, got {m}")
    index = bisect.bisect_left(buckets, m)
    return buckets[min(index, len(buckets) - 1)]
