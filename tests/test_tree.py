"""DraftTree construction, masks and KV-cache compaction."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import DynamicCache, StaticCache

from hf_jetspec import DraftTree, best_first_tree, chain_tree
from hf_jetspec.cache import keep_positions


def brute_force_top_nodes(logits: torch.Tensor, width: int, max_depth: int, count: int) -> list[tuple[float, tuple[int, ...]]]:
    """All token paths of length 1..max_depth over each depth's top-``width`` tokens, best ``count`` by score."""
    lp, ids = torch.log_softmax(logits.double(), -1).topk(width, -1)
    paths = []
    for depth in range(1, max_depth + 1):
        for ranks in itertools.product(range(width), repeat=depth):
            score = sum(lp[d, r].item() for d, r in enumerate(ranks))
            paths.append((score, tuple(ids[d, r].item() for d, r in enumerate(ranks))))
    return sorted(paths, reverse=True)[:count]


def node_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    tokens = tree.tokens.tolist()
    return [tuple(tokens[i] for i in tree.path(node)[1:]) for node in range(len(tree))]


@pytest.mark.parametrize("seed", range(12))
def test_best_first_is_the_most_probable_prefix_closed_tree(seed):
    gen = torch.Generator().manual_seed(seed)
    depth, vocab = 1 + seed % 4, 12
    width, budget = 1 + seed % 3, 2 + seed * 3
    logits = torch.randn(depth + 1, vocab, generator=gen) * 3
    tree = best_first_tree(5, logits, budget, width=width, max_depth=depth)
    expected = brute_force_top_nodes(logits, width, depth, budget - 1)
    paths = node_paths(tree)[1:]
    assert sorted(paths) == sorted(p for _, p in expected)
    assert torch.allclose(tree.scores[1:].double().sort(descending=True).values,
                          torch.tensor([s for s, _ in expected], dtype=torch.double), atol=1e-5)
    parents = tree.parents.tolist()
    assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i)
    assert tree.depths.tolist() == [len(p) for p in node_paths(tree)]
    assert tree.tokens[0] == 5 and tree.max_depth <= depth


def test_best_first_respects_budget_width_and_depth():
    logits = torch.randn(15, 50, generator=torch.Generator().manual_seed(0))
    for budget, width, depth in [(1, 8, 15), (8, 1, 15), (32, 8, 3), (64, 8, 15), (64, 4, 0)]:
        tree = best_first_tree(7, logits, budget, width=width, max_depth=depth)
        assert len(tree) == min(budget, 1 + sum(width**d for d in range(1, depth + 1)))
        assert tree.max_depth <= depth
        assert max((len(c) for c in tree.children), default=0) <= width
        for node, children in enumerate(tree.children):
            for token, child in children.items():
                assert tree.parents[child] == node and tree.tokens[child] == token


def test_chain_takes_top1_of_each_depth():
    logits = torch.randn(10, 30, generator=torch.Generator().manual_seed(1))
    tree = chain_tree(3, logits, budget=6)
    assert tree.tokens.tolist() == [3] + logits[:5].argmax(-1).tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    assert len(chain_tree(3, logits, budget=64)) == 11
    assert len(chain_tree(3, logits, budget=64, max_depth=2)) == 3


def test_ancestors_mask_and_positions():
    tree = DraftTree(
        tokens=torch.tensor([9, 4, 5, 6, 7]), parents=torch.tensor([-1, 0, 0, 1, 3]),
        depths=torch.tensor([0, 1, 1, 2, 3]), scores=torch.zeros(5),
    )
    anc = tree.ancestors()
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]])
    assert torch.equal(anc, expected.bool())
    mask = tree.attention_mask(prefix_len=3, dtype=torch.float32, key_len=10)
    assert mask.shape == (1, 1, 5, 10)
    visible = mask[0, 0] == 0
    assert visible[:, :3].all() and not visible[:, 8:].any()
    assert torch.equal(visible[:, 3:8], anc)
    assert tree.position_ids(3).tolist() == [[3, 4, 4, 5, 6]]
    assert tree.path(4) == [0, 1, 3, 4] and tree.child(1, 6) == 3 and tree.child(1, 5) is None


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
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, hidden_size=8)
    cache = DynamicCache(config=config) if kind == "dynamic" else StaticCache(config=config, max_cache_len=32)
    prefix = 5
    _filled(cache, prefix, 8, 2)
    keep_positions(cache, prefix, keep)
    expected = list(range(prefix)) + [prefix + i for i in keep]
    assert cache.get_seq_length() == len(expected)
    for layer_index, layer in enumerate(cache.layers):
        got = layer.keys[0, 0, : len(expected), 0] - layer_index
        assert got.tolist() == expected
        assert (-layer.values[0, 1, : len(expected), 3]).tolist() == expected
