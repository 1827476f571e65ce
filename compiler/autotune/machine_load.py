"""Whether the machine is busy with other work, from its load average.

Timings taken while other processes compete for the cores can crown a slower kernel (a candidate
timed during a burst loses; one at a single thread wins because the other core was taken), and a
timing cache would replay that choice in every later build. A measurement is therefore stamped with
the load it was taken under when that load was high, and a later build on a quiet machine re-times
it instead of trusting it (timing_cache.py); the build says so (tune_plan.py).

The 1-minute load average counts runnable threads over the whole machine (the build's own tuning
threads included, at most one per core), so "busy" is a load above BUSY_PER_CORE per core: at least
as many threads again as cores wanting to run beside the build's own. INFC_BUSY_CHECK=0 turns the
check off (the test suite does, so that its cache hits do not depend on what else the machine runs).
"""

from __future__ import annotations

import os

BUSY_PER_CORE = 2.0


def cores() -> int:
    return os.cpu_count() or 1


def busy_load() -> float | None:
    """The 1-minute load average when the machine is busy, else None (also where it is unknown)."""
    if os.environ.get("INFC_BUSY_CHECK", "1") == "0":
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not POSIX, or /proc/loadavg unreadable
        return None
    return round(load, 2) if load > BUSY_PER_CORE * cores() else None
