"""Which attention implementation runs the tree verification forward.

A tree step needs a non-causal 4D mask (each node sees the prefix, its ancestors and itself). sdpa, eager and
flex_attention take a 4D additive float mask. flash_attention_* cannot, so tree steps switch those models to sdpa
(prefill and ordinary decoding keep flash). On CUDA, when the Triton kernel of ``hf_jetspec.kernels`` is available,
tree steps use it (registered as the ``jetspec_tree`` attention implementation) with the tree passed compactly.
Anything else raises before generation starts.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

MASK_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
KERNEL_IMPLEMENTATION = "jetspec_tree"


@dataclass(frozen=True)
class TreeAttentionPlan:
    """``implementation``: the attention implementation during tree steps; ``kernel``: pass the tree compactly
    (``tree_meta``) to the Triton kernel instead of a dense mask."""

    implementation: str
    kernel: bool


def current_implementation(model) -> str:
    return model.config.get_text_config()._attn_implementation or "eager"


def _kernel_usable(device: torch.device) -> bool:
    try:
        from .kernels import kernel_available, register
    except ImportError:
        return False
    if not kernel_available(device):
        return False
    register(KERNEL_IMPLEMENTATION)
    return True


def plan_tree_attention(model, use_kernel: bool | None = None) -> TreeAttentionPlan:
    """Decide how tree steps attend; raise ``ValueError`` for implementations that cannot verify a tree.

    ``use_kernel``: None = automatic (CUDA with Triton available, or already ``jetspec_tree``), True = require the
    kernel, False = dense mask.
    """
    impl = current_implementation(model)
    device = next(model.parameters()).device
    automatic = use_kernel is None and (impl == KERNEL_IMPLEMENTATION or device.type == "cuda")
    if (use_kernel or automatic) and _kernel_usable(device):
        return TreeAttentionPlan(KERNEL_IMPLEMENTATION, kernel=True)
    if use_kernel:
        raise ValueError(f"The jetspec_tree Triton kernel is not available on {device} (needs CUDA + triton, or TRITON_INTERPRET=1).")
    if impl in MASK_IMPLEMENTATIONS:
        return TreeAttentionPlan(impl, kernel=False)
    if impl.startswith("flash_attention") or impl == KERNEL_IMPLEMENTATION:
        return TreeAttentionPlan("sdpa", kernel=False)
    raise ValueError(
        f"Attention implementation {impl!r} cannot take a tree attention mask. Load the target with "
        f"attn_implementation in {MASK_IMPLEMENTATIONS} or flash_attention_2/3 (tree steps then run on sdpa)."
    )


@contextmanager
def attention_implementation(model, name: str):
    """Temporarily run ``model``'s attention with ``name`` (no-op when it already does)."""
    config = model.config.get_text_config()
    previous = config._attn_implementation
    if previous == name:
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous
