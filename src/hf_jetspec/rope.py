"""RoPE variants whose frequencies depend on how far a forward reaches.

Most RoPE types (default, linear, yarn, llama3, ...) give a position the same rotation in any forward, so a
verification forward over several positions rotates each exactly as one-token decoding does. Two do not; in
transformers they pick the frequencies from the largest position in the *current* forward:

* ``longrope`` (Phi-3, Phi-3.5, Phi-4-mini, PhiMoE): short factors while that position is below
  ``original_max_position_embeddings``, long factors from there on. A forward that straddles the switch would
  rotate its earlier positions with the long factors where one-token decoding used the short ones. The Phi models'
  ``prepare_inputs_for_generation`` also drops the cache at the switch and recomputes the whole sequence with the
  long factors.
* ``dynamic`` (dynamic NTK scaling): from ``max_position_embeddings`` on, the frequencies are recomputed for every
  new longest position (and kept in the rotary module between forwards), so past it only one-token forwards
  rotate as plain decoding does.

`rope_switch` finds such a switch; the decoding session keeps every verification forward on one side of it
(`positions_left`) and, at a longrope switch, recomputes the sequence as ``generate()`` does. `position_offset`
says where multimodal RoPE continues the positions after an image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeSwitch:
    """``position``: the first position whose forward uses other frequencies; ``per_position``: from there on the
    frequencies change with every position (dynamic NTK), so only one-token forwards reproduce plain decoding."""

    position: int
    per_position: bool


def _rope_types(module) -> list[tuple[str, dict]]:
    """``(rope_type, rope parameters)`` of a rotary-embedding module (one per layer type where they differ)."""
    kind = getattr(module, "rope_type", None)
    params = getattr(getattr(module, "config", None), "rope_parameters", None) or {}
    if isinstance(kind, str):
        return [(kind, params if "rope_type" in params else {})]
    if isinstance(kind, dict):
        return [(k, params.get(layer, {}) if isinstance(params.get(layer), dict) else {}) for layer, k in kind.items()]
    return []


def rope_switch(model) -> RopeSwitch | None:
    """The earliest `RopeSwitch` of ``model``'s rotary embeddings, or None when every position always rotates the
    same way (read from the rotary modules transformers builds: ``rope_type``, ``original_max_seq_len``)."""
    switches = []
    for module in model.modules():
        for kind, params in _rope_types(module):
            config = getattr(module, "config", None)
            if "dynamic" in kind:
                limit = getattr(module, "original_max_seq_len", None) or \
                    getattr(config, "max_position_embeddings", None)
                per_position = True
            elif kind == "longrope":
                limit = params.get("original_max_position_embeddings") or \
                    getattr(config, "original_max_position_embeddings", None)
                per_position = False
            else:
                continue
            if limit is None:
                raise ValueError(f"{type(model).__name__} uses {kind} RoPE but its rotary embedding names no original "
                                 "length (original_max_position_embeddings / max_position_embeddings): hf_jetspec "
                                 "cannot tell where its frequencies change.")
            switches.append(RopeSwitch(int(limit), per_position))
    if not switches:
        return None
    per_position = any(s.per_position for s in switches)
    return RopeSwitch(min(s.position for s in switches), per_position)


def positions_left(switch: RopeSwitch | None, prefix: int) -> int | None:
    """How many positions after the anchor (at position ``prefix``) a verification forward may add and still rotate
    every position as one-token decoding would; None = no limit."""
    if switch is None:
        return None
    if prefix < switch.position:
        return switch.position - 1 - prefix
    return 0 if switch.per_position else None


def position_offset(model, prompt_len: int, positions: torch.Tensor | None) -> torch.Tensor | None:
    """What ``generate()`` adds to a generated token's index in the sequence to get its position ids: ``[..., 1, 1]``
    (broadcasts against ``[1, N]`` indices), or None where the two are equal (most models, text-only prompts).
    ``positions``: the position ids the prefill of a ``prompt_len``-token prompt ran with (what the model's
    ``prepare_inputs_for_generation`` made of ``generate()``'s; None when the model computes its own).

    ``generate()`` continues a prompt's position ids one per new token from the last, so the offset is the prompt's
    last position minus its index. It is not zero for:

    * multimodal RoPE (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, ...), which gives image and video tokens grid
      positions (time, height, width): the text after an image continues from the grid's largest position, not from
      its index; position ids are then ``[3 or 4, batch, length]``. transformers >= 5.25 computes them in
      ``generate()``; earlier versions leave them to the model, which adds the ``rope_deltas`` its prefill recorded;
    * models whose positions start at 1 (PaliGemma: its ``prepare_inputs_for_generation`` adds 1 to every forward's).
    """
    if isinstance(positions, torch.Tensor) and positions.dim() >= 2 and positions.shape[-1] == prompt_len:
        offset = positions[..., -1:] - (prompt_len - 1)
    else:
        deltas = next((m.rope_deltas for m in model.modules()
                       if isinstance(getattr(m, "rope_deltas", None), torch.Tensor)), None)
        offset = None if deltas is None else deltas.reshape(-1)[:1].reshape(1, 1)
    return offset if offset is not None and bool(offset.any()) else None
