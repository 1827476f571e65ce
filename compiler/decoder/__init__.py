"""Decoder plans: decoder-only transformer exports rewritten for the paged KV cache (see plan.py)."""

from .plan import build_decoder_plan

__all__ = ["build_decoder_plan"]
