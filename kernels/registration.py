"""Register the tree kernel as a transformers attention implementation (``attn_implementation="jetspec_tree"``).

Outside tree steps (prefill, plain decoding, or any forward without ``tree_meta=``) the implementation is exactly
transformers' ``sdpa``: same attention function, same mask builder. A tree step passes ``tree_meta=TreeMeta(...)``
as an extra forward kwarg; transformers forwards it through the decoder layers to the attention function
(checked with Qwen3 on transformers 5.17 and 5.24), which then runs :func:`tree_attention` (CUDA, or CPU under
``TRITON_INTERPRET=1``) or else :func:`sdpa_tree_reference`.

The mask during a tree step: the model still builds its mask once per forward with the registered builder (the
``sdpa`` one). With ``attention_mask=None`` and a cache holding P tokens that is the ordinary *causal* bool mask
``[B, 1, N, P + N]`` (``[B, 1, N, max_cache_len]`` for a StaticCache), shared by all layers; no float mask is built
and nothing per layer. The kernel path ignores it (the tree comes from ``tree_meta``), so callers should pass
``attention_mask=None`` on kernel steps. A 4D mask passed by the caller reaches the attention function unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .tree_attention import TreeMeta, kernel_available, sdpa_tree_reference, tree_attention


def register(name: str = "jetspec_tree") -> str:
    """Register the attention function and its mask builder under ``name`` (idempotent); return ``name``.

    Afterwards ``from_pretrained(..., attn_implementation=name)`` works, as does switching
    ``config._attn_implementation`` to ``name`` for tree steps only.
    """
    if "flash" in name or "/" in name:  # transformers treats such names as flash-attention / Hub kernels
        raise ValueError(f"attention implementation name {name!r} must not contain 'flash' or '/'")
    AttentionInterface.register(name, jetspec_tree_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def jetspec_tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function.

    Args:
        query: ``[B, Hq, T, D]``; key, value: ``[B, Hkv, S, D]`` (after the cache update).
        attention_mask: the model's mask; ignored on tree steps.
        kwargs: forward kwargs; ``tree_meta: TreeMeta`` marks a tree step (``T == tree_meta.num_nodes``).

    Returns:
        ``(out [B, T, Hq, D], None)``.
    """
    meta = kwargs.get("tree_meta")
    if not isinstance(meta, TreeMeta):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    _check_tree_step(meta, dropout, kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    attend = tree_attention if kernel_available(query.device) else sdpa_tree_reference
    return attend(query, key, value, meta, scale), None


def _check_tree_step(meta: TreeMeta, dropout: float, kwargs: dict) -> None:
    """Refuse what the tree path would silently get wrong: dropout, logit soft-capping, a clipping sliding window."""
    if dropout:
        raise ValueError("tree attention does not support dropout (run the target in eval mode)")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("tree attention does not support attention logit soft-capping")
    window = kwargs.get("sliding_window")
    if window is not None and meta.prefix_len + meta.num_nodes > window:
        keys = meta.prefix_len + meta.num_nodes
        raise NotImplementedError(f"tree attention over {keys} keys in a sliding-window layer (window {window})")
