"""hf_jetspec: lossless JetSpec tree speculative decoding (and Jacobi decoding) for Hugging Face transformers."""

from transformers import AutoConfig, AutoModel

from .config import JetSpecConfig
from .decoding import jetspec_generate
from .drafters import HeadDrafter, OracleDrafter
from .head import JetSpecHead
from .integration import enable
from .outputs import DecodingStats, JetSpecGenerateOutput
from .tree import DraftTree, best_first_tree, chain_tree

__version__ = "0.1.0"

# Make heads loadable through the Auto classes too: AutoConfig / AutoModel.from_pretrained(head_dir).
AutoConfig.register(JetSpecConfig.model_type, JetSpecConfig, exist_ok=True)
AutoModel.register(JetSpecConfig, JetSpecHead, exist_ok=True)

__all__ = [
    "DecodingStats",
    "DraftTree",
    "HeadDrafter",
    "JetSpecConfig",
    "JetSpecGenerateOutput",
    "JetSpecHead",
    "OracleDrafter",
    "best_first_tree",
    "chain_tree",
    "enable",
    "jetspec_generate",
]
