"""onnxruntime detection: present, and not mixed with onnxruntime-gpu (they overwrite each other)."""

from __future__ import annotations

from importlib import metadata

from .errors import InfcError

ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")


def installed_ort_distributions() -> list[str]:
    found = []
    for name in ORT_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return found


def require_onnxruntime():
    """Import onnxruntime, or fail with a message that says how to fix the environment."""
    found = installed_ort_distributions()
    if len(found) > 1:
        raise InfcError(
            f"both {' and '.join(found)} are installed; they write the same files and the last one installed "
            "wins silently. Fix: pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'infc[cpu]' (or 'infc[gpu]')")
    try:
        import onnxruntime
    except ImportError:
        raise InfcError("onnxruntime is not installed; install it with: pip install 'infc[cpu]'") from None
    return onnxruntime
