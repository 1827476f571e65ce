"""onnxruntime contrib composites written by other tools (its transformers optimizer) expanded into
the standard ops and contrib ops that infc has kernels and fusions for."""
