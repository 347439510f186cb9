"""Triton kernels for JetSpec tree verification, and their registration as a transformers attention implementation.

This folder sits at the top of the repository and installs as ``hf_jetspec.kernels``; ``hf_jetspec.verify`` and
``hf_jetspec.attention`` import it lazily, only when a tree step uses the kernel.

From the repository root (``python -m ...``, ``python -c``, a notebook started there) this folder is also importable
as a top-level ``kernels`` package, and that name belongs to the Hugging Face Hub ``kernels`` package, which
transformers >= 5.25 depends on and imports while importing itself. Imported under that name, this file hands the
name over to the installed package, so transformers gets what it asks for; without it (transformers < 5.25) the
folder imports as itself, which transformers' probe finds has no version and ignores. ``register`` imports
transformers only when called, for the same reason.
"""


def _hub_kernels_spec():
    """The module spec of the first ``kernels`` on ``sys.path`` outside this repository, or None."""
    import os
    import sys
    from importlib.machinery import PathFinder

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = PathFinder.find_spec("kernels", [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != root])
    return spec if spec is not None and spec.loader is not None else None


def _hand_over(spec) -> None:
    """Load ``spec`` (the Hub package) in place of this folder: the import system returns what ``sys.modules``
    holds for the name once this file has run."""
    import sys
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise


if __name__ == "kernels" and (_spec := _hub_kernels_spec()) is not None:
    _hand_over(_spec)
else:  # as hf_jetspec.kernels (or top-level without the Hub package, where transformers < 5.25 finds no version)
    from .tree_attention import TreeMeta, kernel_available, sdpa_tree_reference, tree_attention

    def register(name: str = "jetspec_tree") -> str:
        """Register the ``jetspec_tree`` attention implementation with transformers (see :mod:`.registration`)."""
        from .registration import register as register_with_transformers

        return register_with_transformers(name)

    __all__ = ["TreeMeta", "kernel_available", "register", "sdpa_tree_reference", "tree_attention"]
