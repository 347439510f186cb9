"""DraftTree construction (builders, tries, sampled trees) and its masks."""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_jetspec import DraftTree, best_first_tree, chain_tree
from hf_jetspec.tree import ancestor_matrix


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


def brute_force_ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    out = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            out[i, j] = True
            j = parents[j]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_ancestor_matrix_is_the_brute_force_walk(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 70, (1,), generator=gen))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    assert torch.equal(ancestor_matrix(torch.tensor(parents)), brute_force_ancestors(parents))
    chain = list(range(-1, n - 1))  # the deepest tree: pointer doubling needs every round
    assert torch.equal(ancestor_matrix(torch.tensor(chain)), brute_force_ancestors(chain))


def test_from_branches_merges_shared_prefixes():
    tree, first = DraftTree.from_branches(9, [[1, 2, 3], [1, 2, 4], [5], [1, 6]])
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5, 6]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 0, 1]
    assert tree.depths.tolist() == [0, 1, 2, 3, 3, 1, 2]
    assert first == [0, 1, 2, 3]
    assert tree.child(2, 4) == 4 and tree.child(0, 5) == 5 and tree.child(0, 7) is None
    empty, first = DraftTree.from_branches(9, [[]])
    assert len(empty) == 1 and first == [0]


def test_from_lists_defaults_scores_and_builds_children():
    tree = DraftTree.from_lists([4, 5, 6], [-1, 0, 0], [0, 1, 1])
    assert tree.scores.tolist() == [0.0, 0.0, 0.0]
    assert tree.children == [{5: 1, 6: 2}, {}, {}]


# ------------------------------------------------------------------------------------------------ merged trees


def trie(anchor: int, rows: list[list[int]], source: str = "context", match_len: int = 4):
    from hf_jetspec.candidates import trie_from_rows

    width = max(len(r) for r in rows)
    padded = [r + [-1] * (width - len(r)) for r in rows]
    import numpy as np

    return trie_from_rows(anchor, np.array(padded, dtype=np.int64), source, match_len, len(rows))


@pytest.mark.parametrize("seed", range(8))
def test_merged_tree_without_retrieval_is_the_best_first_tree(seed):
    """Default calibration (the head's own probabilities), no candidates, no node cost: the same node set as
    `best_first_tree` (probabilities kept well above the 1e-4 clip)."""
    from hf_jetspec.calibration import Calibration
    from hf_jetspec.tree import merged_tree

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 12, generator=gen) * 0.5
    expected = best_first_tree(3, logits, budget=20, width=4)
    got, records = merged_tree(3, torch.softmax(logits, -1), None, Calibration(), budget=20, width=4)
    assert sorted(node_paths(got)) == sorted(node_paths(expected))
    torch.testing.assert_close(got.scores.sort().values, expected.scores.sort().values, atol=1e-5, rtol=0)
    assert records[0] is None and all(kind == "head" for kind, _ in records[1:])


def test_merged_tree_takes_retrieval_chains_and_merges_agreement():
    from hf_jetspec.calibration import Calibration
    from hf_jetspec.tree import merged_tree

    probs = torch.full((3, 10), 0.01)
    probs[0, 4], probs[1, 5], probs[2, 6] = 0.9, 0.6, 0.5  # the head's chain 4 5 6
    candidates = trie(3, [[4, 7, 8, 9], [4, 7, 8, 9], [1, 2]])  # retrieval agrees on 4, then goes 7 8 9
    tree, records = merged_tree(3, probs, candidates, Calibration(), budget=8, width=2)
    paths = node_paths(tree)
    assert paths.count((4,)) == 1  # proposed by both: one node
    assert (4, 7, 8, 9) in paths and (4, 5) in paths
    kinds = {path: record[0] for path, record in zip(paths, records) if record}
    assert kinds[(4,)] == "retrieval" and kinds[(4, 5)] == "head"
    assert len(tree) <= 8
    scores = tree.scores.tolist()
    assert all(a >= b - 1e-9 for a, b in zip(scores[1:], scores[2:]))  # added best-first: non-increasing estimates


def test_merged_tree_stops_when_a_node_does_not_pay():
    from hf_jetspec.calibration import Calibration
    from hf_jetspec.tree import merged_tree

    probs = torch.softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(0)), -1)
    full, _ = merged_tree(3, probs, None, Calibration(), budget=16, width=4, node_cost=0.0)
    none, _ = merged_tree(3, probs, None, Calibration(), budget=16, width=4, node_cost=100.0)
    some, _ = merged_tree(3, probs, None, Calibration(), budget=16, width=4, node_cost=0.2)
    assert len(full) == 16 and len(none) == 1 and 1 < len(some) < 16
    only_retrieval, _ = merged_tree(3, None, trie(3, [[1, 2, 3]]), Calibration(), budget=16)
    assert node_paths(only_retrieval) == [(), (1,), (1, 2), (1, 2, 3)]
