"""Decoding loops, each usable as ``model.generate(..., custom_generate=fn)``."""

from .jacobi import jacobi_generate
from .jetspec import jetspec_generate
from .spec_jacobi import speculative_jacobi_generate
from .suffix import suffix_generate

__all__ = ["jacobi_generate", "jetspec_generate", "speculative_jacobi_generate", "suffix_generate"]
