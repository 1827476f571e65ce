"""Runs that fail because an index read from the inputs lies outside the table it indexes.

Token ids past a vocabulary, a class id past a table: the model (onnxruntime too) cannot run on
such values, so `infc run --inputs` reports them as the bad input they are (exit 2, naming the
file), not as an internal error. Matched by text, as shape_contract.py matches shapes: the failure
comes from NumPy's indexing, infc's kernels or an onnxruntime session."""

from __future__ import annotations

INDEX_OUT_OF_RANGE = (
    "is out of bounds for axis",            # NumPy take / fancy indexing
    "an index is outside",                  # kernels/gather_scatter.py
    "indices element out of data bounds",   # onnxruntime Gather
    "Out of range value in index tensor",   # onnxruntime GatherElements
)


def indexes_out_of_range(exc: BaseException) -> bool:
    while exc is not None:  # the executor wraps a kernel's error; its cause holds the words
        if any(fragment in str(exc) for fragment in INDEX_OUT_OF_RANGE):
            return True
        exc = exc.__cause__
    return False
