"""`JetSpecHead`: the causal parallel draft head.

Shapes use b = batch, C = context length (target positions already seen), q = block positions, H = hidden size,
F = num_taps * H (concatenated target features), Hq / Hkv = query / key-value heads, D = head_dim, V = vocabulary.

The fused target context is projected once per layer into keys/values that are cached between rounds
(`HeadContext`); the block's own keys/values are recomputed every round and never cached.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from .attention import check_target
from .config import (SPECIAL_TOKEN_FIELDS, JetSpecConfig, cross_attention_layers, default_target_layer_ids, target_size,
                     target_value)
from .devices import execution_device
from .features import decoder_layers
from .hub import model_card, push_head


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Default RoPE (rotate-half convention): ``positions [b, T] -> (cos, sin) [b, 1, T, D]``."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))

    def _apply(self, fn, *args, **kwargs):
        """Casts (``head.to(torch.bfloat16)``) keep the frequencies float32: rounded ones would skew the angles of
        distant positions."""
        super()._apply(fn, *args, **kwargs)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = self.frequencies().to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [b, h, T, D]`` rotated by ``cos, sin [b, 1, T, D]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class JetSpecAttention(nn.Module):
    """Queries from the block; keys/values = [projected fused context ; block]."""

    def __init__(self, config: JetSpecConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.attention_bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [b, T, H] -> (k, v) [b, Hkv, T, D]`` (k normalised and rotated)."""
        k = apply_rotary(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.num_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        context_kv: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """``x [b, q, H]``, context ``(k, v) [b, Hkv, C, D]``, mask bool ``[b|1, 1, q, C + q]`` -> ``[b, q, H]``."""
        q = apply_rotary(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = torch.cat((context_kv[0], k), dim=2)
        v = torch.cat((context_kv[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class JetSpecMLP(nn.Module):
    def __init__(self, config: JetSpecConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class JetSpecLayer(nn.Module):
    def __init__(self, config: JetSpecConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = JetSpecAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = JetSpecMLP(config)
        self.dropout = getattr(config, "dropout", 0.0)

    def forward(self, x, context_kv, cos, sin, mask) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), context_kv, cos, sin, mask)
        x = x + F.dropout(attn, self.dropout, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), self.dropout, self.training)


@dataclass
class HeadContext:
    """The head's context cache for one sequence: per layer ``(k, v) [1, Hkv, C, D]`` of the fused target context."""

    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[2] if self.kv else 0


def block_mask(context_len: int, block_len: int, causal: bool, device: torch.device) -> torch.Tensor:
    """Bool ``[1, 1, q, C + q]``: every context key visible; in-block causal (or full) attention."""
    ctx = torch.ones(block_len, context_len, dtype=torch.bool, device=device)
    blk = torch.ones(block_len, block_len, dtype=torch.bool, device=device)
    return torch.cat((ctx, blk.tril() if causal else blk), dim=1)[None, None]


class JetSpecHead(PreTrainedModel):
    """Causal parallel draft head over a frozen target.

    Owns neither embeddings nor LM head: the block ``[anchor, mask x (B-1)]`` is embedded with the target's input
    embeddings and the outputs go through the target's LM head, both passed in by the caller.
    """

    config_class = JetSpecConfig
    base_model_prefix = "jetspec"
    main_input_name = "features"
    # vLLM's DFlash layout stores a draft vocabulary as `d2t` + the target's LM-head rows (read by from_pretrained).
    _keys_to_ignore_on_load_unexpected = [r"^d2t$", r"^lm_head\.weight$"]
    _supports_sdpa = True

    def __init__(self, config: JetSpecConfig) -> None:
        super().__init__(config)
        self.fc = nn.Linear(config.num_taps * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(JetSpecLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.datastore = None  # a CorpusIndex of the target's own text (retrieval drafting), saved beside the weights
        self.calibration = None  # a Calibration of merged-tree acceptance estimates, saved beside the weights
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, RMSNorm):
            module.weight.data.fill_(1.0)
        elif isinstance(module, Rotary):  # non-persistent: from_pretrained leaves it uninitialised otherwise
            module.inv_freq.data.copy_(module.frequencies())

    # ----------------------------------------------------------------------------------------------- construction
    @classmethod
    def for_target(cls, model: PreTrainedModel, num_taps: int = 3, **overrides) -> "JetSpecHead":
        """A fresh (untrained) head sized for ``model``; ``overrides`` set any `JetSpecConfig` field. Raises
        ``ValueError`` for a target no decoding loop can verify drafts on (`hf_jetspec.attention.check_target`)."""
        check_target(model)
        decoder_layers(model)  # the layers its taps hook: refuse a target without them now, not at decoding
        text = model.config.get_text_config()
        vocab = model.get_output_embeddings().weight.shape[0]
        hidden = text.hidden_size
        check_embedding_widths(model, hidden)
        heads = target_size(text, "num_attention_heads", default=1)
        eos = target_value(text, "eos_token_id")
        eos = eos[0] if isinstance(eos, list) and eos else eos
        mask_id = next((t for t in (target_value(text, "pad_token_id"), eos)
                        if isinstance(t, int) and 0 <= t < vocab), vocab - 1)
        rope = target_value(text, "rope_parameters", default={})
        rope = rope if isinstance(rope, dict) else {}
        fields = dict(
            block_size=16,
            mask_token_id=mask_id,
            target_layer_ids=self_attention_taps(default_target_layer_ids(text.num_hidden_layers, num_taps),
                                                 cross_attention_layers(model), text.num_hidden_layers),
            num_hidden_layers=2,
            hidden_size=hidden,
            intermediate_size=target_size(text, "intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim",
                                          default=4 * hidden),
            num_attention_heads=heads,
            num_key_value_heads=target_size(text, "num_key_value_heads", default=heads),
            # the head's attention is its own: an odd per-head size (GPT-NeoX 36 / 4) rounds up for its rotary
            head_dim=(lambda d: d + d % 2)(target_size(text, "head_dim", default=hidden // heads)),
            rms_norm_eps=float(target_value(text, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                                            default=1e-6)),
            rope_theta=rope.get("rope_theta", target_value(text, "rope_theta", default=10000.0)),
            vocab_size=vocab,
            target_num_layers=text.num_hidden_layers,
            target_model_type=text.model_type,
            base_model=model.name_or_path or None,
            **{name: getattr(text, name, None) for name in SPECIAL_TOKEN_FIELDS},
        )
        fields.update(overrides)
        return cls(JetSpecConfig(**fields)).to(device=execution_device(model), dtype=next(model.parameters()).dtype)

    def check_target(self, model: PreTrainedModel) -> None:
        """Raise ``ValueError`` listing every way ``model`` differs from the target this head was made for."""
        text = model.config.get_text_config()
        cfg = self.config
        vocab = model.get_output_embeddings().weight.shape[0]
        check_embedding_widths(model, text.hidden_size)
        problems = []
        if text.hidden_size != cfg.hidden_size:
            problems.append(f"hidden size {text.hidden_size} != head's {cfg.hidden_size}")
        if vocab != cfg.vocab_size:
            problems.append(f"vocabulary {vocab} != head's {cfg.vocab_size}")
        if text.num_hidden_layers != cfg.target_num_layers:
            problems.append(f"{text.num_hidden_layers} layers != head's {cfg.target_num_layers}")
        if cfg.target_model_type and text.model_type != cfg.target_model_type:
            problems.append(f"model type {text.model_type!r} != head's {cfg.target_model_type!r}")
        if max(cfg.target_layer_ids) >= text.num_hidden_layers:
            problems.append(f"tap layers {cfg.target_layer_ids} exceed the target's {text.num_hidden_layers} layers")
        if cross := sorted(set(cfg.target_layer_ids) & cross_attention_layers(model)):
            problems.append(f"tap layers {cross} are the target's cross-attention layers (to an image; skipped "
                            "without one)")
        if problems:
            made_for = cfg.base_model or "another target"
            raise ValueError(
                f"This JetSpec head was made for {made_for}, not for this {type(model).__name__}: "
                + "; ".join(problems)
            )

    # ------------------------------------------------------------------------------------------------ save / load
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs) -> "JetSpecHead":
        """Load a head (this library's layout, the reference JetSpec/DFlash layout, or vLLM's DFlash layout as written
        by `hf_jetspec.export_vllm`, whose ``d2t`` becomes the draft vocabulary) from a folder or Hub id.

        Unlike transformers' default, a problem raises one line naming the file (`hf_jetspec.checkpoints`): a
        missing folder or ``config.json`` (``OSError``), an invalid or non-head config, damaged weights, or weights
        whose names or shapes differ from what the config implies (``ValueError``). A head never loads with
        re-initialised weights."""
        from .checkpoints import check_head_folder, local_folder, one_line

        name = pretrained_model_name_or_path
        folder = local_folder(name, "JetSpec head")
        if folder is not None:
            if kwargs.get("subfolder"):
                folder = local_folder(folder / kwargs["subfolder"], "JetSpec head")
            check_head_folder(folder, cls)
        want_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(name, *args, output_loading_info=True, **kwargs)
        except OSError as err:
            where = "" if folder is not None else " (not a local folder; tried the Hub)"
            raise OSError(f"JetSpec head {os.fspath(name)!r}{where}: {one_line(err)}") from None
        except RuntimeError as err:  # transformers' mismatched-sizes error (after a load report)
            raise ValueError(f"JetSpec head {os.fspath(name)!r}: weights do not match its config ({one_line(err)})"
                             ) from None
        except pickle.UnpicklingError as err:  # a pytorch_model.bin that torch.load (weights only) cannot read
            raise ValueError(f"JetSpec head {os.fspath(name)!r}: its pytorch_model.bin is not a loadable PyTorch "
                             f"checkpoint ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        from .export_vllm import draft_vocab_from_checkpoint

        try:
            draft_vocab = draft_vocab_from_checkpoint(name, kwargs)
        except (OSError, ValueError) as err:
            raise ValueError(f"JetSpec head {os.fspath(name)!r}: {one_line(err)}") from None
        if draft_vocab is not None:
            model.config.draft_vocab = draft_vocab
            model.config.validate_head()
        problems = {key: info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(key)}
        if problems:
            raise ValueError(f"Corrupt or incompatible JetSpec head checkpoint {name!s}: {problems}")
        if bad := [key for key, value in model.state_dict().items()
                   if value.is_floating_point() and value.device.type != "meta" and not value.isfinite().all()]:
            more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
            raise ValueError(f"JetSpec head {os.fspath(name)!r}: {bad[0]}{more} holds NaN or infinite weights (a "
                             "diverged training run or a damaged file)")
        from .retrieval import load_retrieval_assets

        model.datastore, model.calibration = load_retrieval_assets(name, **kwargs)
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """``PreTrainedModel.save_pretrained`` (config.json + model.safetensors) plus a README.md model card, and the
        retrieval datastore (``datastore.safetensors``) and calibration (``calibration.json``) when the head has
        them (``head.datastore``: a `CorpusIndex`; ``head.calibration``: a `Calibration`)."""
        if os.path.isfile(save_directory):  # transformers only logs this and returns, having saved nothing
            raise ValueError(f"save_pretrained writes a folder, but {os.fspath(save_directory)!r} is a file")
        super().save_pretrained(save_directory, *args, **kwargs)
        datastore, calibration = getattr(self, "datastore", None), getattr(self, "calibration", None)
        model_card(self.config, datastore, calibration).save(os.path.join(save_directory, "README.md"))
        if datastore is not None:
            datastore.save(save_directory)
        if calibration is not None:
            calibration.save(save_directory)

    def push_to_hub(self, repo_id: str, **kwargs):
        """Upload weights, config and model card to the Hub (see `hf_jetspec.hub.push_head`)."""
        return push_head(self, repo_id, **kwargs)

    # -------------------------------------------------------------------------------------------------- compute
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated target features ``[b, T, F] -> [b, T, H]``."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, fused: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer keys/values ``[b, Hkv, T, D]`` of the fused context at ``positions [b, T]``."""
        cos, sin = self.rotary(positions, fused.dtype)
        return [layer.self_attn.keys_values(fused, cos, sin) for layer in self.layers]

    def decode_block(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context_kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Block embeddings ``[b, q, H]`` at ``positions [b, q]`` -> final hidden states ``[b, q, H]``."""
        x = block_embeds.to(self.fc.weight.dtype)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv in zip(self.layers, context_kv):
            x = layer(x, kv, cos, sin, mask)
        return self.norm(x)

    @torch.no_grad()
    def draft(
        self,
        context: HeadContext,
        new_features: torch.Tensor,
        anchor: int,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        depth: int | None = None,
    ) -> torch.Tensor:
        """One drafting round for a single sequence.

        Appends ``new_features [n, F]`` (target positions ``C .. C+n-1``) to ``context``, then decodes the block
        ``[anchor, mask x (B-1)]`` at positions ``C+n ..``. Returns logits ``[D, V]``: row d-1 is depth d, with
        ``D = min(depth, B-1)`` (``depth=None``: B-1). With causal in-block attention depth d never sees later slots,
        so a causal head decodes only the first D + 1 slots (the same distributions, less compute).
        """
        start = context.length
        if new_features.shape[0]:
            positions = torch.arange(start, start + new_features.shape[0], device=new_features.device)[None]
            new_kv = self.context_kv(self.fuse(new_features[None]), positions)
            context.kv = new_kv if not context.kv else [
                (torch.cat((k, nk), dim=2), torch.cat((v, nv), dim=2)) for (k, v), (nk, nv) in zip(context.kv, new_kv)
            ]
        length, size = context.length, self.config.block_size
        depth = size - 1 if depth is None else max(0, min(depth, size - 1))
        if self.config.causal:
            size = depth + 1
        device = self.fc.weight.device
        block = torch.full((1, size), self.config.mask_token_id, dtype=torch.long, device=device)
        block[0, 0] = anchor
        positions = torch.arange(length, length + size, device=device)[None]
        mask = block_mask(length, size, self.config.causal, device)
        hidden = self.decode_block(embed_tokens(block), positions, context.kv, mask)
        return lm_head(hidden[0, 1 : depth + 1].to(lm_head.weight.dtype))

    # HF's assisted decoding reads these from an ordinary assistant model; reaching them means the target was not
    # enabled for JetSpec heads, so say how to fix it instead of failing deep inside transformers. (An
    # AttributeError, so `hasattr(head, "generation_config")` stays False for code that probes it.)
    def __getattr__(self, name: str):
        if name == "generation_config":
            raise AttributeError(NOT_A_LANGUAGE_MODEL, name=name, obj=None)  # no obj: Python suggests nothing
        return super().__getattr__(name)

    def generate(self, *args, **kwargs):
        raise TypeError(NOT_A_LANGUAGE_MODEL)

    def forward(self, *args, **kwargs):  # a head drafts with `draft` / `decode_block`; a caller of forward() is
        raise TypeError(NOT_A_LANGUAGE_MODEL)  # transformers' own drafter (e.g. speculation_type="dflash")


def self_attention_taps(taps: list[int], cross: frozenset[int], num_layers: int) -> list[int]:
    """``taps`` with each cross-attention layer (which a text-only prompt skips: Mllama) replaced by the nearest
    layer not tapped yet, earlier first (dropped when there is none)."""
    out: list[int] = []
    for tap in taps:
        options = [tap] + [i for d in range(1, num_layers) for i in (tap - d, tap + d)]
        choice = next((i for i in options if 0 <= i < num_layers and i not in cross and i not in out), None)
        out += [] if choice is None else [choice]
    return sorted(out) or taps


def check_embedding_widths(model: PreTrainedModel, hidden: int) -> None:
    """A head embeds its block with the target's token embeddings and projects its output with the target's LM head,
    both at the head's width, the target's hidden size: refuse targets whose embeddings are narrower or wider
    (ELECTRA, RemBERT, ALBERT factorise them)."""
    widths = {"token embeddings": model.get_input_embeddings().weight.shape[1],
              "LM head": model.get_output_embeddings().weight.shape[1]}
    if any(width != hidden for width in widths.values()):
        raise ValueError(f"{type(model).__name__}: " + ", ".join(f"{n} {w}-dim" for n, w in widths.items())
                         + f", hidden size {hidden}: a JetSpec head shares the target's token embeddings and LM head "
                         "at its hidden size, so it cannot draft for this target (the training-free strategies can).")


NOT_A_LANGUAGE_MODEL = (
    "JetSpecHead is a draft head, not a language model. Generate with the target: call `hf_jetspec.enable(model)` "
    "once, then `model.generate(**inputs, assistant_model=head)`; or "
    "`model.generate(**inputs, custom_generate=hf_jetspec.jetspec_generate, draft_head=head)`."
)


def _register() -> None:
    """Make heads loadable with ``AutoModel.from_pretrained(head_dir)`` (the config registers itself)."""
    from transformers import AutoModel

    AutoModel.register(JetSpecConfig, JetSpecHead, exist_ok=True)


_register()
