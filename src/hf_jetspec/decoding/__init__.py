"""Decoding loops, each usable as ``model.generate(..., custom_generate=fn)``."""

from .jetspec import jetspec_generate

__all__ = ["jetspec_generate"]
