"""The target's KV cache: supported classes, free room and compaction to an accepted path."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, StaticCache

from hf_jetspec.cache import check_cache, keep_positions, mask_key_length, room_left

CONFIG = LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, hidden_size=8)


def _filled(cache, prefix: int, nodes: int, layers: int):
    """Write a prefix then a tree of ``nodes`` slots whose values encode the slot index."""
    for start, length in ((0, prefix), (prefix, nodes)):
        slots = torch.arange(start, start + length, dtype=torch.float32)
        keys = slots.view(1, 1, -1, 1).expand(1, 2, length, 4).contiguous()
        for layer in range(layers):
            cache.update(keys + layer, -keys, layer)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("keep", [[0], [0, 1, 2], [0, 2, 5], [0, 3, 4, 7]])
def test_keep_positions_compacts_to_the_path(kind, keep):
    cache = DynamicCache(config=CONFIG) if kind == "dynamic" else StaticCache(config=CONFIG, max_cache_len=32)
    prefix = 5
    _filled(cache, prefix, 8, 2)
    keep_positions(cache, prefix, keep)
    expected = list(range(prefix)) + [prefix + i for i in keep]
    assert cache.get_seq_length() == len(expected)
    for layer_index, layer in enumerate(cache.layers):
        got = layer.keys[0, 0, : len(expected), 0] - layer_index
        assert got.tolist() == expected
        assert (-layer.values[0, 1, : len(expected), 3]).tolist() == expected


def test_room_and_mask_length():
    dynamic, static = DynamicCache(config=CONFIG), StaticCache(config=CONFIG, max_cache_len=32)
    assert room_left(dynamic, 5) is None and room_left(static, 5) == 27
    assert mask_key_length(dynamic, 5, 3) == 8 and mask_key_length(static, 5, 3) == 32


def test_check_cache_takes_empty_and_filled_full_caches_only():
    cache = DynamicCache(config=CONFIG)
    check_cache(cache)
    _filled(cache, 3, 0, 2)
    check_cache(cache)  # continuing a conversation (tests/test_continuation.py)
    with pytest.raises(ValueError, match="DynamicCache or StaticCache"):
        check_cache(object())
