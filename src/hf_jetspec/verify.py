"""Tree verification: one target forward over the tree nodes (what is accepted is `hf_jetspec.acceptance`)."""

from __future__ import annotations

import torch

from .attention import TreeAttentionPlan, attention_implementation
from .cache import mask_key_length
from .tree import DraftTree


def verify_tree(
    model, tree: DraftTree, cache, prefix_len: int, plan: TreeAttentionPlan, cache_key: str,
    position_offset: torch.Tensor | None = None, row_inputs=None,
) -> torch.Tensor:
    """Run the target over the ``N`` tree nodes on top of ``prefix_len`` cached positions; return logits ``[N, V]``.

    The cache grows by N slots (``prefix_len .. prefix_len + N - 1``, node order); compact it afterwards. A node's
    position id is its index (prefix + depth) plus ``position_offset`` (`hf_jetspec.rope.position_offset`: the
    ``[..., 1, 1]`` shift of multimodal RoPE after an image, which also sets the ids' leading dimension).
    ``row_inputs``: inputs with one row per token (`hf_jetspec.decoding.common.TokenRows`: Mllama's
    ``cross_attention_mask``), or None.
    """
    positions = tree.position_ids(prefix_len)
    if position_offset is not None:
        positions = positions + position_offset.to(positions.device)
    kwargs = {cache_key: cache, "use_cache": True, "position_ids": positions}
    if row_inputs is not None:
        kwargs.update(row_inputs.for_forward(prefix_len, len(tree)))
    if plan.kernel:
        from .kernels import TreeMeta

        kwargs["tree_meta"] = TreeMeta.from_ancestor_matrix(tree.ancestors(), prefix_len)
        mask = None
    else:
        key_len = mask_key_length(cache, prefix_len, len(tree))
        ancestors = tree.ancestors()
        mask = tree.attention_mask(prefix_len, model.dtype, key_len, window=plan.window, ancestors=ancestors)
        if plan.mixed:  # one mask per layer kind, the form hybrid models take (`causal_mask_mapping`)
            full = tree.attention_mask(prefix_len, model.dtype, key_len, ancestors=ancestors)
            mask = {"full_attention": full, "indexed_attention": full, "sliding_attention": mask}
    with attention_implementation(model, plan.implementation):
        out = model(input_ids=tree.tokens[None], attention_mask=mask, **kwargs)
    return out.logits[0]
