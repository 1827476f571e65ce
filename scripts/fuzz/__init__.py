"""Differential fuzzing of infc: see scripts/fuzz_graphs.py."""
