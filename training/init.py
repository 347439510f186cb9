"""Start a fresh head from the target's own top decoder layers instead of random weights.

A head layer has the shapes of a target decoder layer (`JetSpecHead.for_target` sizes it so) and the same
parameter names (``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``post_attention_layernorm``; ``self_attn.{q,k}_norm`` for Qwen3-style targets). `init_from_target` copies the
target's last ``num_hidden_layers`` layers into the head's layers in order, its final norm into the head's
``norm`` (the head's output goes through the target's LM head, which expects that norm), and sets the fusion
``fc`` to pass the deepest tapped layer through unchanged (``I`` on its slice, zeros elsewhere), so that from the first step the
context keys and values come from a deep target state. What the target lacks (``q_norm`` / ``k_norm`` of a Llama
target) keeps its fresh value (ones).
"""

from __future__ import annotations

import torch

from hf_jetspec.head import JetSpecHead

from .features import decoder_of


@torch.no_grad()
def init_from_target(head: JetSpecHead, target) -> dict:
    """Copy the target's top decoder layers, final norm and an identity fusion into ``head`` (in place).

    Returns ``{"layers": [target layer ids copied], "kept": [head parameter names the target has no match for]}``.
    Raises ``ValueError`` naming every parameter whose shape differs (a head not sized for this target)."""
    decoder = decoder_of(target)
    layers = list(decoder.layers)
    n = len(head.layers)
    if n > len(layers):
        raise ValueError(f"the head has {n} layers; the target only {len(layers)} to copy from")
    ids = list(range(len(layers) - n, len(layers)))
    pairs = [(f"layers.{i}.", head.layers[i], layers[t]) for i, t in enumerate(ids)]
    pairs.append(("norm.", head.norm, decoder.norm))
    copies, kept, problems = [], [], []
    for prefix, mine, theirs in pairs:
        source = theirs.state_dict()
        for name, param in mine.named_parameters():
            if name not in source:
                kept.append(prefix + name)
            elif source[name].shape != param.shape:
                problems.append(f"{prefix}{name}: head {tuple(param.shape)} != target {tuple(source[name].shape)}")
            else:
                copies.append((param, source[name]))
    if problems:
        raise ValueError("cannot initialise this head from the target's layers (the head is not sized for it): "
                         + "; ".join(problems))
    for param, value in copies:
        param.copy_(value.to(param.dtype))
    hidden, taps = head.config.hidden_size, list(head.config.target_layer_ids)
    deepest = taps.index(max(taps)) * hidden
    head.fc.weight.zero_()
    head.fc.weight[:, deepest : deepest + hidden] = torch.eye(hidden, dtype=head.fc.weight.dtype)
    return {"layers": ids, "kept": kept}
