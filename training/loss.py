"""The JetSpec training objective: forward KL(target || head) on the block positions of random anchors.

Shapes: b sequences of (padded) length T, m anchors per sequence, block size B, F = taps * H features, V vocab.

For an anchor at position a, the block ``[x_a, mask x (B-1)]`` sits at positions a .. a+B-1 and attends to the
fused target context at positions < a (what the head has at inference) and causally within the block. Block slot
k (depth k >= 1) predicts token x_{a+k}; its teacher is the target's distribution at position a+k-1 (teacher
forced). The anchor slot (k = 0) gets no loss, nor do slots past the sequence end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sample_anchors(lengths: torch.Tensor, starts: torch.Tensor, num_anchors: int, generator=None) -> torch.Tensor:
    """Random anchor positions ``[b, m]`` (without replacement; -1 = padding when a sequence has fewer).

    A sequence of length L supervised from position ``start`` (e.g. prompt length - 1) takes anchors in
    ``[start, L - 2]``, so at least depth 1 of each block is inside the sequence.
    """
    rows = []
    for length, start in zip(lengths.tolist(), starts.tolist()):
        candidates = torch.arange(max(0, start), max(0, length - 1))
        pick = candidates[torch.randperm(len(candidates), generator=generator)[:num_anchors]].sort().values
        rows.append(F.pad(pick, (0, num_anchors - len(pick)), value=-1))
    return torch.stack(rows)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[b, m] -> [b, m, B]`` absolute positions a + k (padding anchors give negative positions)."""
    return anchors[..., None] + torch.arange(block_size, device=anchors.device)


def training_mask(anchors: torch.Tensor, seq_len: int, block_size: int, causal: bool = True) -> torch.Tensor:
    """Bool ``[b, 1, m*B, T + m*B]``: block (j, s) sees context positions < a_j, and block keys (j, s') with s' <= s
    (or every s' when not causal). Padding anchors see only their own slot (keeps softmax finite)."""
    b, m = anchors.shape
    q = m * block_size
    slot = torch.arange(block_size, device=anchors.device)
    ctx = torch.arange(seq_len, device=anchors.device)[None, None, None, :] < anchors[..., None, None]
    ctx = ctx.expand(b, m, block_size, seq_len).reshape(b, q, seq_len)
    same_block = torch.eye(m, dtype=torch.bool, device=anchors.device)
    within = slot[None, :] <= slot[:, None] if causal else torch.ones(block_size, block_size, dtype=torch.bool,
                                                                      device=anchors.device)
    blk = (same_block[:, None, :, None] & within[None, :, None, :]).reshape(q, q)
    blk = blk[None].expand(b, q, q)
    mask = torch.cat((ctx, blk), dim=-1)
    return mask[:, None]


def depth_weights(block_size: int, decay: float | None, device=None) -> torch.Tensor:
    """Loss weight per block slot ``[B]``: 0 for the anchor, 1 (uniform) or exp(-(k-1)/decay) for depth k."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.ones(block_size, device=device) if decay is None else torch.exp(-(k - 1) / decay)
    w[0] = 0.0
    return w


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _untempered(logprobs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Probabilities at temperature 1 from log-probabilities taken at ``temperature`` (a log-softmax of x/T)."""
    return logprobs.exp() if temperature == 1.0 else torch.softmax(logprobs * temperature, dim=-1)


def kl_from_logprobs(teacher: torch.Tensor, student: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-row KL(teacher || student) * T^2 from log-probabilities ``[N, V]`` -> ``[N]`` (Hinton scaling)."""
    return (teacher.exp() * (teacher - student)).sum(-1) * temperature**2


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-row KL(softmax(t/T) || softmax(s/T)) * T^2 for ``[N, V]`` logits -> ``[N]``."""
    return kl_from_logprobs(tempered_logprobs(teacher_logits, temperature),
                            tempered_logprobs(student_logits, temperature), temperature)


def logits_projection(lm_head, dtype: torch.dtype | None = None):
    """``hidden [N, H] -> float32 logits [N, V]`` through the frozen ``lm_head``, its matmul in ``dtype`` (None: the
    LM head's own dtype). bfloat16 runs ~3x faster than float32 on CPUs with AVX512-BF16/AMX; the logits feed a
    softmax, so bf16 rounding only perturbs the training signal slightly, never decoding. An LM head that is not a
    plain ``nn.Linear`` (e.g. LoRA-wrapped) always runs as itself."""
    if dtype is None or type(lm_head) is not torch.nn.Linear or lm_head.weight.dtype == dtype:
        return lambda hidden: lm_head(hidden.to(lm_head.weight.dtype)).float()
    weight = lm_head.weight.detach().to(dtype)
    bias = None if lm_head.bias is None else lm_head.bias.detach().to(dtype)
    return lambda hidden: F.linear(hidden.to(dtype), weight, bias).float()


def head_block_hidden(head, features: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor,
                      embed_tokens, anchor_chunk: int = 16) -> torch.Tensor:
    """Run the head on every anchor's block: features ``[b, T, F]``, ids ``[b, T]``, anchors ``[b, m]`` ->
    final hidden states ``[b, m, B, H]``.

    The fused context and its keys/values are computed once; the blocks run ``anchor_chunk`` anchors at a time
    (blocks never see each other, so this only bounds the dense ``[q, T + q]`` attention scores)."""
    b, seq_len = input_ids.shape
    block_size = head.config.block_size
    fused = head.fuse(features)
    ctx_kv = head.context_kv(fused, torch.arange(seq_len, device=input_ids.device)[None].expand(b, -1))
    out = []
    for part in anchors.split(anchor_chunk, dim=1):
        m = part.shape[1]
        positions = block_positions(part, block_size).clamp(min=0)
        tokens = torch.full((b, m, block_size), head.config.mask_token_id, dtype=torch.long, device=input_ids.device)
        tokens[..., 0] = input_ids.gather(1, part.clamp(min=0))
        mask = training_mask(part, seq_len, block_size, head.config.causal)
        hidden = head.decode_block(embed_tokens(tokens.view(b, -1)), positions.view(b, -1), ctx_kv, mask)
        out.append(hidden.view(b, m, block_size, -1))
    return torch.cat(out, dim=1)


def jetspec_loss(head, features, input_ids, lengths, anchors, teacher_logits_fn, embed_tokens, lm_head,
                 temperature: float = 1.0, decay: float | None = None, chunk: int = 256,
                 logits_dtype: torch.dtype | None = None, sample_slots: bool = False,
                 generator: torch.Generator | None = None, acceptance_weight: float = 0.0) -> torch.Tensor:
    """Mean weighted forward KL over supervised block slots.

    ``teacher_logits_fn(batch_index [N], position [N]) -> [N, V]`` gives the target's logits at the given
    positions (computed or looked up by the caller). Supervised slot (j, k): anchor valid, k >= 1, a_j + k < length.
    ``chunk`` bounds how many [N, V] rows are materialised at once; ``logits_dtype``: see `logits_projection`.

    ``sample_slots``: instead of weighting every slot by its depth weight w_k, keep slot (j, k) with probability
    w_k / max(w) (``generator``) and weight the kept ones equally: the same objective in expectation, but the
    LM-head projection and softmax (the bulk of the cost) run only for the kept slots, so with a depth decay many
    more anchors fit the same compute.

    ``acceptance_weight`` (lambda) adds lambda * (1 - sum_v min(p_v, q_v)) per slot: one minus the probability that
    speculative sampling accepts the slot's draft (the total-variation distance DistillSpec trains on), computed at
    temperature 1 whatever ``temperature`` is. Forward KL spreads the head's mass over the target's tail; this term
    rewards mass exactly where the target puts it, which is what verification accepts.
    """
    block_size = head.config.block_size
    hidden = head_block_hidden(head, features, input_ids, anchors, embed_tokens)
    pos = block_positions(anchors, block_size)
    weights = depth_weights(block_size, decay, device=input_ids.device)[None, None].expand_as(pos)
    valid = (anchors[..., None] >= 0) & (pos < lengths[:, None, None]) & (weights > 0)
    if sample_slots:
        keep = torch.rand(pos.shape, generator=generator, device="cpu").to(pos.device) < weights / weights.max()
        valid, weights = valid & keep, torch.ones_like(weights)
    rows = valid.nonzero(as_tuple=True)
    if rows[0].numel() == 0:
        return hidden.sum() * 0.0
    flat_hidden = hidden[rows]
    w = weights[rows]
    # A position is the teacher of up to B-1 slots (overlapping blocks): compute each teacher row once.
    seq_len = input_ids.shape[1]
    keys, slot_to_key = torch.unique(rows[0] * seq_len + pos[rows] - 1, return_inverse=True)
    with torch.no_grad():
        teacher = torch.cat([tempered_logprobs(teacher_logits_fn(k // seq_len, k % seq_len), temperature)
                             for k in keys.split(chunk)])
    project = logits_projection(lm_head, logits_dtype)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, flat_hidden.shape[0], chunk):
        sl = slice(start, start + chunk)
        student = tempered_logprobs(project(flat_hidden[sl]), temperature)
        slot_loss = kl_from_logprobs(teacher[slot_to_key[sl]], student, temperature)
        if acceptance_weight:
            p, q = _untempered(teacher[slot_to_key[sl]], temperature), _untempered(student, temperature)
            slot_loss = slot_loss + acceptance_weight * (1.0 - torch.minimum(p, q).sum(-1))
        total = total + (slot_loss * w[sl]).sum()
    return total / w.sum()
