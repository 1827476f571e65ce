"""Runs that fail because the model's own shapes disagree at the sizes fed.

A model exported with dynamic height and width often works only at some of them: an odd feature map
added to (or concatenated with) an upsampled copy of its pooled half (HRNet, DLA, UNets), a Reshape whose target was fixed at
export (TorchScript traces of MobileViT). Such a run fails in onnxruntime as well; it is the
caller's input that does not fit the model, not an infc fault, so it is reported as bad input
(exit 2) naming the input shapes, never as an internal error.

These are the messages that mean "these operands' shapes contradict each other". They are matched
by text because they come from three places that raise plain exceptions: infc's kernels, NumPy and
the onnxruntime sessions of vendor steps and islands."""

from __future__ import annotations

SHAPE_CONTRADICTIONS = (
    "do not broadcast",                            # kernels/common.broadcast_shape
    "could not be broadcast together",             # NumPy ufuncs and np.broadcast_shapes
    "cannot reshape array of size",                # NumPy reshape: a target size fixed at export
    "Attempting to broadcast an axis",             # onnxruntime element-wise kernels
    "cannot be reshaped to the requested shape",   # onnxruntime Reshape
    # a skip connection concatenated with an upsampled half-size map (UNets at odd sizes)
    "except for the concatenation axis must match",  # NumPy concatenate
    "Non concat axis dimensions must match",       # onnxruntime Concat
    "has a mismatch in its core dimension",        # NumPy matmul
    "MatMul dimension mismatch",                   # onnxruntime MatMul
    "operand cannot broadcast on dim",             # onnxruntime MatMul batch dims
    # a reflect pad wider than the axis it mirrors (EnCodec's decoder at a couple of frames); torch
    # refuses the same, so the model was never meant to run there
    "Pad reflect: ",                               # onnxruntime Pad
)


def contradicts_shapes(exc: BaseException) -> bool:
    message = str(exc)
    return any(fragment in message for fragment in SHAPE_CONTRADICTIONS)


def input_shapes_text(feeds: dict) -> str:
    return ", ".join(f"{name} {list(getattr(value, 'shape', ()))}" for name, value in feeds.items())
