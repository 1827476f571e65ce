"""Settings for the whole test suite."""

import os

# Timing-cache entries measured on a busy machine are re-timed on a quiet one (autotune/machine_load.py):
# the suite's cache-hit tests would then depend on what else the machine runs. Set before any test (and
# inherited by the CLI subprocesses); tests/autotune/test_machine_load.py turns it back on.
os.environ["INFC_BUSY_CHECK"] = "0"
