"""The benchmarks' one change to the environment: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, set on these
machines, slow NumPy's BLAS, so a benchmark re-runs itself once with both unset (and says so);
`--keep-openblas-env` keeps them. Tests and CI never change them."""

import os
import sys

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def rerun_without_openblas_env(keep: bool) -> None:
    """Replaces this process by the same command with both variables unset, unless `keep` or neither
    is set (the re-run passes --keep-openblas-env, so it happens once)."""
    if keep or not any(v in os.environ for v in OPENBLAS_VARS):
        return
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARS}
    print(f"note: re-running with {' and '.join(OPENBLAS_VARS)} unset for this benchmark only", flush=True)
    os.execve(sys.executable, [sys.executable, *sys.argv, "--keep-openblas-env"], env)


def openblas_note() -> str:
    return "unset for this run" if not any(v in os.environ for v in OPENBLAS_VARS) else "as set by the machine"
