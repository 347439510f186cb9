"""hf_jetspec: lossless JetSpec tree speculative decoding (and Jacobi decoding) for Hugging Face transformers.

The names below are imported on first access (PEP 562), so ``import hf_jetspec`` and the ``hf-jetspec`` command's
argument checks do not pay for importing torch and transformers. Importing `JetSpecHead` (or `JetSpecConfig`)
registers heads with transformers' ``AutoConfig`` / ``AutoModel``.
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"

# name -> submodule that defines it
_EXPORTS = {
    "Calibration": "calibration",
    "JetSpecConfig": "config",
    "tune_mkl": "cpu",
    "jacobi_generate": "decoding",
    "jetspec_generate": "decoding",
    "speculative_jacobi_generate": "decoding",
    "suffix_generate": "decoding",
    "HeadDrafter": "drafters",
    "OracleDrafter": "drafters",
    "ScrambledOracleDrafter": "drafters",
    "JetSpecHead": "head",
    "enable": "integration",
    "default_head": "models",
    "default_model": "models",
    "DecodingStats": "outputs",
    "JetSpecGenerateOutput": "outputs",
    "RetrievalDrafter": "retrieval",
    "DECODING_FUNCTIONS": "strategies",
    "STRATEGIES": "strategies",
    "Candidates": "candidates",
    "ContextIndex": "suffix_index",
    "CorpusIndex": "suffix_index",
    "merge_candidates": "candidates",
    "tokenizer_fingerprint": "suffix_index",
    "DraftTree": "tree",
    "best_first_tree": "tree",
    "chain_tree": "tree",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None and not name.startswith("__"):  # a submodule as an attribute: hf_jetspec.models.load_target
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name != "DECODING_FUNCTIONS":  # computed afresh by its module
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


def custom_generate_path() -> str:
    """A local folder holding ``custom_generate/generate.py``: pass it as ``custom_generate=`` (with
    ``trust_remote_code=True``), or upload the folder to the Hub and pass the repo id."""
    return os.path.join(os.path.dirname(__file__), "generate_repo")


__all__ = sorted([*_EXPORTS, "custom_generate_path"])
