"""infc: an ONNX graph optimizer and autotuning compiler with its own runtime."""

__version__ = "0.1.0"
