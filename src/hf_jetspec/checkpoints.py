"""Checks of model and head folders before transformers loads them, so each problem is one line naming the file.

transformers reports a missing local folder as a malformed Hub repo id, a truncated ``model.safetensors`` as a
``SafetensorError``, a head whose config disagrees with its weights as a load report table followed by a
``RuntimeError``, and a folder without ``config.json`` by loading default-sized weights. `local_folder` and
`check_head_folder` turn each into an ``OSError`` / ``ValueError`` whose message names the file and the problem; a
head never loads with re-initialised weights.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
HEAD_PREFIX = "jetspec."  # JetSpecHead.base_model_prefix: transformers strips it from checkpoint keys


def one_line(error: BaseException | str) -> str:
    """An error message on one line (whitespace runs, newlines included, become one space)."""
    return " ".join(str(error).split())


def _looks_local(name: str) -> bool:
    """True for names only a local path can have: absolute, ``./`` / ``../`` / ``~``, a Windows drive, more than
    one ``/``, or a first component that exists here. (``org/name`` is a Hub id unless ``org`` is a folder here.)"""
    if os.path.isabs(name) or name.startswith((".", "~")) or (len(name) > 1 and name[1] == ":"):
        return True
    parts = name.replace(os.sep, "/").split("/")
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


def _valid_repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def local_folder(name: str | os.PathLike, what: str = "model") -> Path | None:
    """The local folder ``name`` names, or None when it is a Hub repo id (to be downloaded).

    Raises ``FileNotFoundError`` when ``name`` can only be a local path (or is no valid repo id) and no folder is
    there, and ``NotADirectoryError`` when it is a file."""
    path = Path(os.path.expanduser(os.fspath(name)))
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{what} {os.fspath(name)!r}: is a file, expected a folder (config.json + weights)")
    if _looks_local(os.fspath(name)):
        raise FileNotFoundError(f"{what} {os.fspath(name)!r}: no such folder")
    if not _valid_repo_id(os.fspath(name)):
        raise FileNotFoundError(f"{what} {os.fspath(name)!r}: no such folder, and not a valid Hub repo id")
    return None


def read_config(folder: Path, what: str = "model") -> dict:
    """``folder/config.json`` as a dict; ``OSError`` when missing, ``ValueError`` when not a JSON object."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{what} folder {folder}: no config.json (not a saved {what})")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({one_line(err)})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def weight_shapes(folder: Path, dtypes: dict | None = None) -> tuple[Path, dict[str, tuple[int, ...]]] | None:
    """(the weights file, shape of every tensor) from the safetensors header(s) of ``folder``, without reading the
    tensors (and each tensor's dtype name, ``"F32"``, ``"I64"``, ..., into ``dtypes`` when given); None when the
    folder holds no safetensors weights (other formats are left to transformers). ``OSError`` when a file is
    truncated or not safetensors."""
    from safetensors import safe_open

    single, index = folder / WEIGHTS, folder / WEIGHTS_INDEX
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            content = json.loads(index.read_text())
            if "metadata" not in content:  # transformers reads it (KeyError 'metadata' otherwise)
                raise KeyError("no 'metadata'")
            shards = sorted(set(content["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index}: not a valid safetensors index ({one_line(err)})") from None
        files = [folder / shard for shard in shards]
    else:
        return None
    shapes = {}
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing (listed in {index.name})")
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    shapes[key] = tuple(f.get_slice(key).get_shape())
                    if dtypes is not None:
                        dtypes[key] = f.get_slice(key).get_dtype()
        except Exception as err:  # safetensors raises its own SafetensorError for a damaged file
            raise OSError(f"{path}: not a complete safetensors file ({one_line(err)}); re-download or re-save it") \
                from None
    return (single if single.is_file() else index), shapes


def _describe(keys, limit: int = 3) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def check_head_folder(folder: Path, head_class) -> None:
    """Refuse a head folder whose ``config.json`` is missing, invalid, not a head's, or whose weights are missing,
    damaged, or do not have exactly the tensors and shapes that config implies."""
    import torch

    raw = read_config(folder, "JetSpec head")
    path = folder / "config.json"
    if raw.get("model_type") != head_class.config_class.model_type and "dflash_config" not in raw:
        raise ValueError(f"{path}: not a JetSpec head config (model_type {raw.get('model_type')!r}; a head's is "
                         f"{head_class.config_class.model_type!r}, or a reference config with 'dflash_config')")
    try:
        config = head_class.config_class.from_dict(raw)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{path}: {one_line(err)}") from None
    dtypes: dict[str, str] = {}
    found = weight_shapes(folder, dtypes)
    if found is None:
        if not any((folder / name).is_file() for name in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
            raise FileNotFoundError(f"JetSpec head folder {folder}: no {WEIGHTS} (the weights)")
        return
    weights, shapes = found
    # a head's weights are floating point; `d2t` (vLLM's draft-to-target id offsets) is the one integer tensor
    if integer := sorted(k for k, kind in dtypes.items() if not kind.startswith(("F", "BF")) and k != "d2t"):
        raise ValueError(f"{weights}: {_describe(integer)} {'is' if len(integer) == 1 else 'are'} "
                         f"{dtypes[integer[0]]}, not floating point: not a head's weights (damaged or converted?)")
    shapes = {key.removeprefix(HEAD_PREFIX): shape for key, shape in shapes.items()}
    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in head_class(config).state_dict().items()}
    problems = []
    if missing := expected.keys() - shapes.keys():
        problems.append(f"missing {_describe(missing)}")
    ignored = [re.compile(pattern) for pattern in getattr(head_class, "_keys_to_ignore_on_load_unexpected", None) or ()]
    if unexpected := {k for k in shapes.keys() - expected.keys() if not any(p.search(k) for p in ignored)}:
        problems.append(f"unexpected {_describe(unexpected)}")
    if wrong := [k for k in sorted(expected.keys() & shapes.keys()) if expected[k] != shapes[k]]:
        first = wrong[0]
        more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
        problems.append(f"{first} is {list(shapes[first])} in the weights but {list(expected[first])} by the "
                        f"config{more}")
    if problems:
        raise ValueError(f"{weights} does not match {path}: " + "; ".join(problems))
