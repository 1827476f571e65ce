"""Decoder plans: decoder-only transformer exports rewritten for the paged KV cache (see plan.py).

The package imports nothing at load: quantize/weight_only.py reads decoder/batch_invariant.py, and
plan.py imports weight_only, so an eager import here would make that a cycle.
"""

__all__ = ["build_decoder_plan"]


def __getattr__(name: str):
    if name == "build_decoder_plan":
        from .plan import build_decoder_plan  # noqa: PLC0415

        return build_decoder_plan
    raise AttributeError(name)
