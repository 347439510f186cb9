"""The target's KV cache: which classes are supported, and compaction to an accepted tree path.

Works on the cache layer tensors ``layer.keys / layer.values [b, Hkv, S, D]``, the stable part of the transformers
5.x cache API (``crop`` changed meaning between 5.17 and 5.23, and there is no gather API).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, StaticCache, cache_utils
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

_FULL_LAYERS = (DynamicLayer, StaticLayer)
_WINDOW_LAYERS = (DynamicSlidingWindowLayer, StaticSlidingWindowLayer)
# A layer that stores nothing: it reads the keys and values of an earlier layer (KV sharing: Gemma 3n, Gemma 4), or
# has no attention. transformers >= 5.2x; absent before.
_EMPTY_LAYERS = tuple(t for t in (getattr(cache_utils, "DummyLayer", None),) if t is not None)


def storing_layers(cache) -> list:
    """The layers of ``cache`` that hold keys and values (KV-sharing layers hold none)."""
    return [layer for layer in cache.layers if not isinstance(layer, _EMPTY_LAYERS)]


def forward_parameters(model):
    """The parameters of the target's own ``forward`` (a PEFT wrapper's base model; the class's method, so hooks
    and wrappers added to the instance do not hide them)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return inspect.signature(type(base).forward).parameters


def cache_kwarg(model) -> str:
    """Name of the cache argument of ``model.forward``: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def pop_cache(model_kwargs: dict):
    """Remove and return the cache that ``generate()`` prepared, whatever its key."""
    cache = model_kwargs.pop("cache", None)
    legacy = model_kwargs.pop("past_key_values", None)
    return cache if cache is not None else legacy


def full_layers(cache, window: int | None, max_length: int | None = None):
    """Turn the empty sliding-window layers of a DynamicCache or StaticCache (what ``generate()`` builds for
    Mistral, Gemma 2/3, ...) into full layers, in place, and return the cache.

    A sliding layer drops keys older than its window, in a ring buffer a tree step cannot rewind; a full layer
    keeps every position, and the window is applied by the attention mask instead (the model's own masks on
    ordinary forwards, `hf_jetspec.tree.DraftTree.attention_mask` on tree steps). The cache then grows with the
    sequence like a full-attention model's. ``window``: the model's sliding window (None: nothing to do). The
    full static layers take the length of the StaticCache's full layers; a StaticCache of sliding layers only
    (whose window is shorter than the generation) has lost that length, so it takes ``max_length`` (the call's
    prompt + new tokens), and without one raises ``ValueError``.
    """
    if window is None or not isinstance(cache, (DynamicCache, StaticCache)) or cache.get_seq_length() != 0:
        return cache  # check_cache names any problem
    full_len = max((layer.max_cache_len for layer in cache.layers
                    if isinstance(layer, StaticLayer) and not isinstance(layer, _WINDOW_LAYERS)), default=None)
    if full_len is None:  # sliding layers only: their length is min(window, the cache's length)
        full_len = next((layer.max_cache_len for layer in cache.layers if type(layer) is StaticSlidingWindowLayer
                         and layer.max_cache_len < window), max_length)
    for i, layer in enumerate(cache.layers):  # exact types: hybrid linear + window layers stay (and are refused)
        if type(layer) is DynamicSlidingWindowLayer:
            cache.layers[i] = DynamicLayer()
        elif type(layer) is StaticSlidingWindowLayer:
            if full_len is None:
                raise ValueError(
                    "A StaticCache of sliding-window layers only keeps only its window, and no max_length says how "
                    "long the full layers tree steps need must be: pass cache_implementation='dynamic' (or no "
                    "cache argument)."
                )
            cache.layers[i] = StaticLayer(max_cache_len=full_len)
    return cache


def check_cache(cache) -> None:
    """Raise ``ValueError`` unless ``cache`` is a DynamicCache or StaticCache of full-attention layers (sliding-window
    layers: `full_layers` first, which converts empty ones)."""
    if not isinstance(cache, (DynamicCache, StaticCache)):
        raise ValueError(
            f"Tree and Jacobi decoding need a DynamicCache or StaticCache, got {type(cache).__name__}; "
            "pass cache_implementation='dynamic' or 'static' (or no cache argument)."
        )
    for layer in cache.layers:
        if isinstance(layer, _EMPTY_LAYERS):
            continue
        static_indexed = isinstance(layer, StaticLayer) and hasattr(layer, "indexer_keys")
        if isinstance(layer, _WINDOW_LAYERS) and cache.get_seq_length() != 0:
            raise ValueError(
                "This filled cache has sliding-window layers (plain generate() made it), which drop the keys older "
                "than their window that tree steps still read. Continue from the cache an hf_jetspec call returned "
                "(return_dict_in_generate=True: its past_key_values keep every position), or pass no cache."
            )
        if isinstance(layer, _WINDOW_LAYERS) or not isinstance(layer, _FULL_LAYERS) or static_indexed:
            raise ValueError(
                f"Cache layer {type(layer).__name__} is not supported: tree verification rewinds and compacts the "
                "cache, which quantized, indexed, linear-attention and other special layers cannot do exactly."
            )


def mask_key_length(cache, prefix_len: int, num_new: int) -> int:
    """Key length the attention mask must span after appending ``num_new`` tokens to ``prefix_len`` cached ones."""
    return storing_layers(cache)[0].max_cache_len if isinstance(cache, StaticCache) else prefix_len + num_new


def room_left(cache, prefix_len: int) -> int | None:
    """Free slots of a StaticCache after ``prefix_len`` tokens (None: unbounded)."""
    return storing_layers(cache)[0].max_cache_len - prefix_len if isinstance(cache, StaticCache) else None


def keep_positions(cache, prefix_len: int, keep: list[int], fixed: frozenset[int] = frozenset()) -> None:
    """Compact ``cache`` after a forward that appended nodes at slots ``prefix_len + i``: keep the nodes ``keep``
    (ascending, a root-to-node path) at slots ``prefix_len .. prefix_len + len(keep) - 1`` and drop the rest.

    Accepted path nodes sit at consecutive depths, so the compacted cache is an ordinary causal prefix. Layers with
    an index in ``fixed`` (`cross_attention_layers`) and layers that hold nothing yet (a cross-attention layer
    without an image) are left as they are.
    """
    new_len = prefix_len + len(keep)
    layers = [layer for i, layer in enumerate(cache.layers) if i not in fixed
              and not isinstance(layer, _EMPTY_LAYERS) and getattr(layer, "keys", None) is not None]
    if not layers:
        return
    index = None
    if keep != list(range(len(keep))):
        index = torch.tensor([prefix_len + i for i in keep], device=layers[0].keys.device)
    for layer in layers:
        if index is not None:
            layer.keys[:, :, prefix_len:new_len] = layer.keys.index_select(2, index)
            layer.values[:, :, prefix_len:new_len] = layer.values.index_select(2, index)
        indexer = getattr(layer, "indexer_keys", None)  # DeepSeek sparse attention: the indexer's keys [b, S, d]
        if isinstance(indexer, torch.Tensor) and indexer.dim() == 3:
            if index is not None:
                indexer[:, prefix_len:new_len] = indexer.index_select(1, index.to(indexer.device))
            layer.indexer_keys = indexer[:, :new_len]
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(new_len)
        else:
            layer.keys = layer.keys[:, :, :new_len]
            layer.values = layer.values[:, :, :new_len]
