"""Which attention implementation runs the tree verification forward.

A tree step needs a non-causal 4D mask (each node sees the prefix, its ancestors and itself). sdpa, eager and
flex_attention take a 4D additive float mask. flash_attention_* cannot, so tree steps switch those models to sdpa
(prefill and ordinary decoding keep flash). On CUDA, when the Triton kernel of ``hf_jetspec.kernels`` is available,
tree steps use it (registered as the ``jetspec_tree`` attention implementation) with the tree passed compactly.
Anything else raises before generation starts.

Sliding-window targets (Mistral, Gemma 2/3, Qwen2/3 with ``use_sliding_window``, ...) are verified with the window
applied in the tree mask (a mask per layer kind when full and sliding layers mix); their cache keeps every position
(`hf_jetspec.cache.full_layers`). Chunked, linear and other attention kinds raise.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .cache import forward_parameters
from .config import cross_attention_layers
from .devices import execution_device

MASK_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
KERNEL_IMPLEMENTATION = "jetspec_tree"


# layer kinds a tree mask expresses: indexed attention (DeepSeek sparse attention: DeepSeek-V3.2, GLM-MoE-DSA) is full
# attention over the keys its indexer picks, and the indexer scores the keys the mask lets through
WINDOWED_KINDS = ("full_attention", "sliding_attention", "indexed_attention")
# an indexer that also keeps sink and local tokens by cache slot (Kolibri) picks other keys in a tree's layout
SLOT_INDEXER_FIELDS = ("index_num_sink_tokens", "index_num_local_tokens")


@dataclass(frozen=True)
class TreeAttentionPlan:
    """``implementation``: the attention implementation during tree steps; ``kernel``: pass the tree compactly
    (``tree_meta``) to the Triton kernel instead of a dense mask; ``window``: the sliding window of the target's
    sliding layers (None: every layer attends to the whole prefix); ``mixed``: full and sliding layers both occur,
    so the model takes one mask per layer kind."""

    implementation: str
    kernel: bool
    window: int | None = None
    mixed: bool = False


def sliding_window(model) -> tuple[int | None, bool]:
    """``(window, mixed)`` of ``model``'s decoder layers from its config: the sliding window (None when no layer
    slides) and whether full-attention layers occur next to sliding ones. Raises ``ValueError`` for attention kinds
    a tree mask cannot express (chunked, linear, ...)."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds is None:  # Mistral-style: one kind for every layer
        chunked = getattr(config, "attention_chunk_size", None) is not None
        kinds = ["sliding_attention" if window is not None else "chunked_attention" if chunked else "full_attention"]
    unsupported = sorted(set(kinds) - set(WINDOWED_KINDS))
    if unsupported:
        raise ValueError(
            f"{type(model).__name__} has {', '.join(unsupported)} layers: hf_jetspec verifies trees on full, "
            "sliding-window and indexed (DeepSeek sparse) attention only."
        )
    if "indexed_attention" in kinds and any(getattr(config, f, None) for f in SLOT_INDEXER_FIELDS):
        raise ValueError(f"{type(model).__name__} has indexed-attention layers whose indexer keeps sink and local "
                         "tokens by cache slot: a verification tree's nodes sit at other slots than their positions.")
    if "sliding_attention" not in kinds:
        return None, False
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"{type(model).__name__} has sliding-window layers but no usable config.sliding_window "
                         f"({window!r}).")
    return window, bool({"full_attention", "indexed_attention"} & set(kinds))


# Families whose forward takes the arguments a verification forward passes but cannot honour them.
OWN_MASKS = {
    "xlm": "builds its attention masks from sequence lengths (a 2D mask only)",
    "dory": "loops its recurrent layers over extra cache layers it appends during each forward",
    "blt": "groups its bytes into patches by their entropy within each forward and builds its own byte and patch "
           "masks",
}


def check_target(model) -> None:
    """Refuse, by name, a target no loop can verify drafts on (before anything runs on it: drafting, timing
    forwards, limits, a head sized for it): encoder-decoders, attention kinds a tree mask cannot express, positions
    from cache slots."""
    if not hasattr(model, "config") or not hasattr(model, "get_output_embeddings"):
        raise ValueError(f"expected a transformers causal LM (a loaded model, or a PEFT model around one), got "
                         f"{type(model).__name__}")
    if model.config.is_encoder_decoder:
        raise ValueError("hf_jetspec supports decoder-only models.")
    if execution_device(model).type == "meta":
        raise ValueError(f"{type(model).__name__}'s weights are on the meta device (built under "
                         "`torch.device('meta')` or `init_empty_weights`, never loaded) and no accelerate hook moves "
                         "them for a forward: load its weights first (`from_pretrained`, or accelerate's "
                         "`load_checkpoint_and_dispatch`)")
    sliding_window(model)
    check_position_encoding(model)


def check_position_encoding(model) -> None:
    """Raise ``ValueError`` for targets a verification forward cannot place tree nodes in: ALiBi targets (Bloom,
    MPT, Falcon with ``alibi=True``: position biases from cache slots or a 2D padding mask), targets whose forward
    takes no ``position_ids`` (positions from cache slots: the BART-family decoders, Marian, Pegasus, TrOCR,
    RoFormer, CPM-Ant, ...) or no KV cache (GPT-1, RWKV, XLNet), and the `OWN_MASKS` families. A tree's nodes occupy
    other cache slots than their positions (siblings share a position), so such targets would verify drafts at
    the wrong positions."""
    name = type(model).__name__
    config = model.config.get_text_config(decoder=True)
    alibi = bool(getattr(config, "alibi", False)) or bool(getattr(getattr(config, "attn_config", None), "alibi", False))
    if alibi or getattr(config, "model_type", None) == "bloom":
        raise ValueError(f"{name} uses ALiBi position biases, which transformers computes from cache "
                         "slots: a verification tree's nodes sit at other slots than their positions, so hf_jetspec "
                         "cannot verify drafts on this model (RoPE and learned absolute positions are supported).")
    params = forward_parameters(model)
    if "cache" not in params and "past_key_values" not in params:
        raise ValueError(f"{name} takes no KV cache (its forward has no past_key_values / cache argument): "
                         "speculative decoding verifies drafts on top of a cached prefix.")
    if "position_ids" not in params:
        raise ValueError(f"{name} takes no position_ids: it places new tokens by their cache slots (or folds them "
                         "into a recurrent state), and a verification tree's nodes branch and sit at other slots than "
                         "their positions, so hf_jetspec cannot verify drafts on this model (models that take "
                         "position_ids, RoPE or learned, are supported).")
    reason = OWN_MASKS.get(getattr(config, "model_type", None)) or OWN_MASKS.get(model.config.model_type)
    if reason is not None:
        raise ValueError(f"{name} {reason}: hf_jetspec cannot pass it a verification tree.")


def current_implementation(model) -> str:
    """The model's own attention implementation (also while another thread's tree step has switched it)."""
    config = model.config.get_text_config()
    switched = _SWITCHES.get(id(config))
    return (switched is not None and switched.original) or config._attn_implementation or "eager"


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
    device = execution_device(model)
    window, mixed = sliding_window(model)
    if use_kernel and window is not None:
        raise ValueError(f"The jetspec_tree Triton kernel has no sliding window; {type(model).__name__} slides "
                         f"({window} tokens): pass tree_kernel=None or False.")
    if use_kernel and cross_attention_layers(model):
        raise ValueError(f"The jetspec_tree Triton kernel attends to the sequence only; {type(model).__name__} has "
                         "cross-attention layers (to an image): pass tree_kernel=None or False.")
    automatic = use_kernel is None and window is None and not cross_attention_layers(model) and \
        (impl == KERNEL_IMPLEMENTATION or device.type == "cuda")
    if (use_kernel or automatic) and _kernel_usable(device):
        return TreeAttentionPlan(KERNEL_IMPLEMENTATION, kernel=True)
    if use_kernel:
        raise ValueError(f"The jetspec_tree Triton kernel is not available on {device} (needs CUDA + triton, or TRITON_INTERPRET=1).")
    if impl == "flex_attention" and device.type != "cuda":
        # torch's compiled CPU flex kernel reads out of bounds, or corrupts the heap, on a dense float mask of
        # several new tokens over a cached prefix (torch 2.13; transformers' own decoding passes block masks)
        return TreeAttentionPlan("sdpa", kernel=False, window=window, mixed=mixed)
    if impl in MASK_IMPLEMENTATIONS:
        return TreeAttentionPlan(impl, kernel=False, window=window, mixed=mixed)
    if impl.startswith("flash_attention") or impl == KERNEL_IMPLEMENTATION:
        return TreeAttentionPlan("sdpa", kernel=False, window=window, mixed=mixed)
    raise ValueError(
        f"Attention implementation {impl!r} cannot take a tree attention mask. Load the target with "
        f"attn_implementation in {MASK_IMPLEMENTATIONS} or flash_attention_2/3 (tree steps then run on sdpa)."
    )


class _Switch:
    """A model's attention switch: tree steps of concurrent calls (threads generating with the same model) take
    ``lock`` in turn, so that one call's restore cannot land in another's tree forward."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.original: str | None = None  # the model's own implementation while switched


_SWITCHES: dict[int, _Switch] = {}  # id(text config) -> its switch (a reused id only shares a lock)
_SWITCHES_GUARD = threading.Lock()


@contextmanager
def attention_implementation(model, name: str):
    """Run ``model``'s attention with ``name`` inside (no-op when it already does), one tree step at a time per
    model across threads. The setting lives on the shared config: forwards of other threads that are not tree steps
    see it too (a flash_attention model's prefill then runs sdpa, the same attention)."""
    config = model.config.get_text_config()
    with _SWITCHES_GUARD:
        switch = _SWITCHES.setdefault(id(config), _Switch())
    with switch.lock:
        previous = config._attn_implementation
        if previous == name:
            yield
            return
        config._attn_implementation, switch.original = name, previous
        try:
            yield
        finally:
            config._attn_implementation, switch.original = previous, None
