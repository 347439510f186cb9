"""hf_jetspec: lossless JetSpec tree speculative decoding (and Jacobi decoding) for Hugging Face transformers."""

from transformers import AutoConfig, AutoModel

from .config import JetSpecConfig
from .cpu import tune_mkl
from .calibration import Calibration
from .decoding import jacobi_generate, jetspec_generate, speculative_jacobi_generate, suffix_generate
from .drafters import HeadDrafter, OracleDrafter
from .retrieval import RetrievalDrafter
from .head import JetSpecHead
from .integration import enable
from .models import default_head, default_model
from .outputs import DecodingStats, JetSpecGenerateOutput
from .strategies import DECODING_FUNCTIONS, STRATEGIES
from .suffix_index import Candidates, ContextIndex, CorpusIndex, merge_candidates, tokenizer_fingerprint
from .tree import DraftTree, best_first_tree, chain_tree

__version__ = "0.1.0"


def custom_generate_path() -> str:
    """A local folder holding ``custom_generate/generate.py``: pass it as ``custom_generate=`` (with
    ``trust_remote_code=True``), or upload the folder to the Hub and pass the repo id."""
    import os

    return os.path.join(os.path.dirname(__file__), "generate_repo")

# Make heads loadable through the Auto classes too: AutoConfig / AutoModel.from_pretrained(head_dir).
AutoConfig.register(JetSpecConfig.model_type, JetSpecConfig, exist_ok=True)
AutoModel.register(JetSpecConfig, JetSpecHead, exist_ok=True)

__all__ = [
    "Calibration",
    "Candidates",
    "ContextIndex",
    "CorpusIndex",
    "DecodingStats",
    "DraftTree",
    "HeadDrafter",
    "JetSpecConfig",
    "JetSpecGenerateOutput",
    "JetSpecHead",
    "OracleDrafter",
    "RetrievalDrafter",
    "best_first_tree",
    "DECODING_FUNCTIONS",
    "STRATEGIES",
    "chain_tree",
    "custom_generate_path",
    "default_head",
    "default_model",
    "enable",
    "jacobi_generate",
    "jetspec_generate",
    "merge_candidates",
    "speculative_jacobi_generate",
    "suffix_generate",
    "tokenizer_fingerprint",
    "tune_mkl",
]
