"""Settings for the whole test suite."""

import os

# Timing-cache entries measured on a busy machine are re-timed on a quiet one (autotune/machine_load.py):
# the suite's cache-hit tests would then depend on what else the machine runs. Set before any test (and
# inherited by the CLI subprocesses); tests/autotune/test_machine_load.py turns it back on.
os.environ["INFC_BUSY_CHECK"] = "0"

# A build races the whole model in one onnxruntime session against infc's kernels (compiler/tune_whole.py)
# and keeps it when it is faster, which on the suite's small fixtures it often is: the tests that check
# infc's own kernels against onnxruntime would then check onnxruntime against itself. Off for the suite;
# tests/test_tune_whole.py turns it back on.
os.environ["INFC_WHOLE_MODEL"] = "0"
