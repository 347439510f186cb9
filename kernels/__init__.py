"""Triton kernels for JetSpec tree verification, and their registration as a transformers attention implementation.

``register`` imports transformers only when called: from the repository root this folder is also importable as a
top-level ``kernels`` package, which transformers imports while probing for the Hub ``kernels`` package during its
own import, so an eager transformers import here would be circular.

This folder sits at the top of the repository and installs as ``hf_jetspec.kernels``; ``hf_jetspec.verify`` and
``hf_jetspec.attention`` import it lazily, only when a tree step uses the kernel.
"""

from .tree_attention import TreeMeta, kernel_available, sdpa_tree_reference, tree_attention


def register(name: str = "jetspec_tree") -> str:
    """Register the ``jetspec_tree`` attention implementation with transformers (see :mod:`.registration`)."""
    from .registration import register as register_with_transformers

    return register_with_transformers(name)


__all__ = ["TreeMeta", "kernel_available", "register", "sdpa_tree_reference", "tree_attention"]
