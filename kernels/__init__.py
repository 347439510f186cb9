"""Triton kernels for JetSpec tree verification, and their registration as a transformers attention implementation.

This folder sits at the top of the repository and installs as ``hf_jetspec.kernels``; ``hf_jetspec.verify`` and
``hf_jetspec.attention`` import it lazily, only when a tree step uses the kernel.

From the repository root (``python -m ...``, ``python -c``, a notebook started there) this folder is also importable
as a top-level ``kernels`` package, and that name belongs to the Hugging Face Hub ``kernels`` package, which
transformers >= 5.25 depends on and imports while importing itself. Imported under that name, this file hands the
name over to the installed package (or raises the ImportError a missing one gives), so transformers gets what it
asks for. ``register`` imports transformers only when called, for the same reason.
"""


def _hand_over_top_level_name() -> None:
    """Load the first ``kernels`` on ``sys.path`` outside this repository in place of this folder."""
    import os
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != root]
    spec = PathFinder.find_spec("kernels", path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError("No module named 'kernels'", name="kernels")
    module = module_from_spec(spec)
    sys.modules["kernels"] = module  # the import system returns what sys.modules holds once this file has run
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise


if __name__ == "kernels":
    _hand_over_top_level_name()
else:
    from .tree_attention import TreeMeta, kernel_available, sdpa_tree_reference, tree_attention

    def register(name: str = "jetspec_tree") -> str:
        """Register the ``jetspec_tree`` attention implementation with transformers (see :mod:`.registration`)."""
        from .registration import register as register_with_transformers

        return register_with_transformers(name)

    __all__ = ["TreeMeta", "kernel_available", "register", "sdpa_tree_reference", "tree_attention"]
