"""`JetSpecConfig`: the draft head's configuration, and the target facts recorded for compatibility checks."""

from __future__ import annotations

import math
import numbers
from typing import Any

from transformers import PretrainedConfig


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """The reference JetSpec/DFlash tap rule: one tap in the middle, or ``num_taps`` evenly spaced from layer 1 to
    layer ``num_target_layers - 3``. Targets with fewer than 4 layers tap their last ``num_taps`` layers."""
    if num_taps == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        return list(range(num_target_layers))[-num_taps:]
    start, end = 1, num_target_layers - 3
    return sorted({int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps)})


def cross_attention_layers(model) -> frozenset[int]:
    """Indices of the target's cross-attention layers (Mllama: to the image), whose cache layers hold the image's
    keys and values rather than the sequence's."""
    return frozenset(getattr(model.config.get_text_config(), "cross_attention_layers", None) or ())


def target_value(config, *names: str, default=None):
    """The first of ``names`` that ``config`` (a target's text config) sets to something other than None, else
    ``default``. Families name a field differently (``intermediate_size`` / ``n_inner`` / ``ffn_dim``,
    ``rms_norm_eps`` / ``layer_norm_epsilon``); configs whose field varies by layer (transformers' heterogeneous
    configs, Gemma 4's ``head_dim``) refuse the global read, and give the largest layer's value here."""
    for name in names:
        try:
            value = getattr(config, name, None)
        except Exception:  # AmbiguousGlobalPerLayerAttributeError (a RuntimeError): a per-layer attribute
            layers = config.per_layer_config
            values = [getattr(layers[i], name, None) for i in range(config.num_hidden_layers)]
            value = max((v for v in values if v is not None), default=None)
        if value is not None:
            return value
    return default


def target_size(config, *names: str, default: int) -> int:
    """`target_value` for a size: the largest entry where a config gives one per layer as a list (Gemma 3n's
    ``intermediate_size``)."""
    value = target_value(config, *names, default=default)
    if isinstance(value, (list, tuple)):
        value = max((v for v in value if isinstance(v, int)), default=default)
    return int(value)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# integer fields and their smallest valid value; positive real fields
INT_FIELDS = {"block_size": 1, "mask_token_id": 0, "num_hidden_layers": 1, "hidden_size": 1, "intermediate_size": 1,
              "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 1, "max_position_embeddings": 1,
              "tree_budget": 1, "tree_width": 1, "vocab_size": 1, "target_num_layers": 1}
POSITIVE_FIELDS = ("rms_norm_eps", "rope_theta", "initializer_range")

# the target's special token ids a head records (transformers' pipelines compare them with the target's)
SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def token_ids(value) -> list[int]:
    """A token-id field that holds one id, several or None (``eos_token_id``) as a list of ids."""
    return [] if value is None else [int(value)] if isinstance(value, int) else [int(i) for i in value]


MIN_DRAFT_VOCAB = 64  # tree widths draw distinct children from the draft vocabulary


class JetSpecConfig(PretrainedConfig):
    """Configuration of a JetSpec causal parallel draft head.

    The head reads the frozen target's hidden states after the decoder layers ``target_layer_ids`` (concatenated,
    fused by a linear layer), and drafts ``block_size - 1`` future positions in one forward pass from the block
    ``[anchor, mask, ..., mask]``. Its own decoder layers are Qwen3-style (q/k RMSNorm, SwiGLU MLP).

    The ``target_*`` fields record the target the head was made for; using the head with another target raises.
    """

    model_type = "jetspec"

    # Draft block.
    block_size: int = 16
    mask_token_id: int = 0
    causal: bool = True
    target_layer_ids: list[int] | None = None
    # Head decoder layers (defaults come from the target in `JetSpecHead.for_target`).
    num_hidden_layers: int = 1
    hidden_size: int = 256
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    initializer_range: float = 0.02
    # Residual dropout in the head's layers while training (a regulariser; decoding runs in eval mode, unaffected).
    dropout: float = 0.0
    # Decoding defaults (overridable per call): tree nodes verified per step (root included) and width per depth.
    tree_budget: int = 32
    tree_width: int = 8
    # Optional draft vocabulary (sorted token ids): the head's logits are computed for these tokens only and the
    # draft distribution is renormalised over them (FR-Spec / EAGLE-3 style; the target still verifies against its
    # whole vocabulary, so outputs are unchanged). On small targets the LM-head projection dominates a drafting
    # round; the most frequent 16k of SmolLM2's 49k tokens cover 99.7% of its ShareGPT responses.
    draft_vocab: list[int] | None = None
    # The target the head was made for (the head's hidden_size always equals the target's).
    vocab_size: int = 32000
    target_num_layers: int = 4
    target_model_type: str | None = None
    # The target's special token ids (copied by `JetSpecHead.for_target`): transformers' pipelines compare them with
    # the target's before they take an assistant_model without an assistant tokenizer.
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # Provenance for the model card: base model name, training data, steps, measured tau (filled in by training).
    base_model: str | None = None
    training_summary: dict | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.target_layer_ids is None and _is_int(self.target_num_layers):
            self.target_layer_ids = default_target_layer_ids(self.target_num_layers, 1)
        self.validate_head()  # types first: the normalisation below would turn "01" into [0, 1]
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.draft_vocab is not None:
            self.draft_vocab = sorted(int(i) for i in self.draft_vocab)
        super().__post_init__(**kwargs)

    def type_problems(self) -> list[str]:
        """The fields whose JSON type is wrong (a string, float or bool where a count is expected, ...)."""
        problems = [f"{name} must be an integer >= {low}, got {getattr(self, name)!r}"
                    for name, low in INT_FIELDS.items()
                    if not _is_int(getattr(self, name)) or getattr(self, name) < low]
        problems += [f"{name} must be a number > 0, got {getattr(self, name)!r}" for name in POSITIVE_FIELDS
                     if not _is_number(getattr(self, name)) or not getattr(self, name) > 0]
        problems += [f"{name} must be a number, got {getattr(self, name)!r}" for name in ("dropout",)
                     if not _is_number(getattr(self, name))]
        problems += [f"{name} must be true or false, got {getattr(self, name)!r}" for name in ("causal",
                     "attention_bias") if not isinstance(getattr(self, name), bool)]
        for name in ("target_layer_ids", "draft_vocab"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (list, tuple)) or not all(map(_is_int, value))):
                problems.append(f"{name} must be a list of integers, got {value!r:.80}")
        return problems

    def validate_head(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        problems = self.type_problems()
        if problems:  # the checks below compare values of the right types
            raise ValueError("Invalid JetSpecConfig: " + "; ".join(problems))
        if self.block_size < 2:
            problems.append(f"block_size must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            problems.append("target_layer_ids must name at least one target layer")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.target_num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} outside the target's {self.target_num_layers} layers")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            problems.append(f"target_layer_ids has duplicates: {self.target_layer_ids}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} outside the target vocabulary ({self.vocab_size})")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.draft_vocab is not None:
            ids = self.draft_vocab
            outside = any(not 0 <= i < self.vocab_size for i in ids)
            if len(ids) < MIN_DRAFT_VOCAB or outside or len(set(ids)) != len(ids):
                problems.append(f"draft_vocab must hold >= {MIN_DRAFT_VOCAB} distinct token ids in [0, "
                                f"{self.vocab_size}), got {len(ids)} ids")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if problems:
            raise ValueError("Invalid JetSpecConfig: " + "; ".join(problems))

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any):
        if "dflash_config" in config_dict:
            config_dict = reference_to_jetspec_dict(config_dict)
        return super().from_dict(config_dict, **kwargs)


def _first(*values):
    return next(v for v in values if v is not None)


def reference_to_jetspec_dict(ref: dict[str, Any]) -> dict[str, Any]:
    """Translate the reference JetSpec/DFlash checkpoint config (a Qwen3Config plus ``block_size`` and
    ``dflash_config: {mask_token_id, target_layer_ids, causal_head}``; vLLM's DFlash layout names the in-block
    attention flag ``causal`` and may set a top-level ``is_causal``, which wins as in vLLM) into `JetSpecConfig`
    fields.

    In that layout the head's hidden size equals the target's, ``vocab_size`` is the target vocabulary and
    ``num_target_layers`` the target depth.
    """
    dflash = ref["dflash_config"] or {}
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_target_layers", "vocab_size") if k not in ref]
    if missing:
        raise ValueError(f"Reference JetSpec/DFlash config lacks {missing}")
    num_heads = ref.get("num_attention_heads", 32)
    rope = ref.get("rope_parameters") or ref.get("rope_scaling") or {}
    out = {
        "block_size": ref.get("block_size", 16),
        "mask_token_id": dflash.get("mask_token_id", ref.get("pad_token_id") or 0),
        "causal": bool(_first(ref.get("is_causal"), dflash.get("causal"), dflash.get("causal_head"), False)),
        "target_layer_ids": dflash.get("target_layer_ids")
        or default_target_layer_ids(ref["num_target_layers"], ref["num_hidden_layers"]),
        "num_hidden_layers": ref["num_hidden_layers"],
        "hidden_size": ref["hidden_size"],
        "intermediate_size": ref.get("intermediate_size", 4 * ref["hidden_size"]),
        "num_attention_heads": num_heads,
        "num_key_value_heads": ref.get("num_key_value_heads") or num_heads,
        "head_dim": ref.get("head_dim") or ref["hidden_size"] // num_heads,
        "rms_norm_eps": ref.get("rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", ref.get("rope_theta", 10000.0)),
        "max_position_embeddings": ref.get("max_position_embeddings", 32768),
        "attention_bias": ref.get("attention_bias", False),
        "vocab_size": ref["vocab_size"],
        "target_num_layers": ref["num_target_layers"],
        "target_model_type": ref.get("target_model_type"),
        # a Qwen3-style config: the target's special token ids, when the checkpoint records them
        **{name: ref[name] for name in SPECIAL_TOKEN_FIELDS if ref.get(name) is not None},
    }
    jetspec = ref.get("jetspec") or {}  # this library's own fields, kept by `hf_jetspec.export_vllm`
    out.update({k: jetspec[k] for k in ("tree_budget", "tree_width", "base_model", "training_summary",
                                        "target_model_type") if jetspec.get(k) is not None})
    if "_name_or_path" in ref:
        out["_name_or_path"] = ref["_name_or_path"]
    return out


def _register() -> None:
    """Make head configs loadable with ``AutoConfig.from_pretrained(head_dir)``."""
    from transformers import AutoConfig

    AutoConfig.register(JetSpecConfig.model_type, JetSpecConfig, exist_ok=True)


_register()
