"""`DraftTree`: the token tree drafted from per-depth distributions, and the builders that make it.

A tree of N nodes is stored in topological order (parents before children). Node 0 is the root: the anchor token,
already committed but not yet in the target's KV cache. Node i sits at depth ``depths[i]`` (root 0) and stands for
the token sequence on the path root -> i.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from .limits import MAX_FORWARD_TOKENS


@dataclass
class DraftTree:
    """tokens / parents / depths: LongTensor ``[N]`` (parent -1 for the root); scores: FloatTensor ``[N]``, the
    accumulated draft log-probability of the path to each node (root 0)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    children: list[dict[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if len(self) > MAX_FORWARD_TOKENS:  # its dense ancestor matrix and mask grow with the square of the size
            raise ValueError(f"A draft tree holds at most {MAX_FORWARD_TOKENS} nodes, got {len(self)}")
        if not self.children:
            self.children = [{} for _ in range(len(self))]
            for node, (parent, token) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
                if parent >= 0:
                    self.children[parent][token] = node

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` carrying ``token``, if drafted."""
        return self.children[node].get(token)

    def path(self, node: int) -> list[int]:
        """Node indices root -> ``node``."""
        parents = self.parents.tolist()
        out = [node]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def ancestors(self) -> torch.Tensor:
        """Bool ``[N, N]``: ``[i, j]`` iff node j is node i or one of its ancestors."""
        n = len(self)
        anc = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        for node, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                anc[node] |= anc[parent]
        return anc

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """``[1, N]`` positions: prefix length + depth."""
        return (self.depths + prefix_len)[None]

    def attention_mask(self, prefix_len: int, dtype: torch.dtype, key_len: int | None = None) -> torch.Tensor:
        """Additive mask ``[1, 1, N, key_len]`` over [KV prefix ; tree ; unused slots]: the prefix is visible,
        a tree node sees its ancestors and itself. ``key_len`` defaults to prefix + N (a StaticCache passes its
        full length; slots past the tree stay masked)."""
        n = len(self)
        key_len = prefix_len + n if key_len is None else key_len
        visible = torch.zeros(n, key_len, dtype=torch.bool, device=self.tokens.device)
        visible[:, :prefix_len] = True
        visible[:, prefix_len : prefix_len + n] = self.ancestors()
        mask = torch.zeros(n, key_len, dtype=dtype, device=self.tokens.device)
        return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def _make_tree(tokens: list[int], parents: list[int], depths: list[int], scores: list[float], device) -> DraftTree:
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=torch.tensor(parents, dtype=torch.long, device=device),
        depths=torch.tensor(depths, dtype=torch.long, device=device),
        scores=torch.tensor(scores, dtype=torch.float32, device=device),
    )


def best_first_tree(anchor: int, logits: torch.Tensor, budget: int, width: int = 8, max_depth: int | None = None) -> DraftTree:
    """The ``budget``-node tree (root included) of highest accumulated draft log-probability.

    ``logits [D, V]`` hold the draft distribution of each depth 1..D; every node at depth d-1 may take any of the
    top-``width`` tokens of depth d as a child (the head's depths are conditioned on its own latent choices, not
    on the branch token). Nodes are popped best-first from a heap of (parent, rank) candidates, so the result is
    exactly the ``budget`` most probable paths under the factorised draft: the tree that maximises the expected
    number of accepted tokens if the draft is calibrated. Ties keep the lower rank / earlier parent first.
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1 (the root), got {budget}")
    depth_limit = logits.shape[0] if max_depth is None else min(max_depth, logits.shape[0])
    tokens, parents, depths, scores = [anchor], [-1], [0], [0.0]
    if depth_limit > 0 and budget > 1:
        width = max(1, min(width, budget - 1, logits.shape[-1]))
        top_lp, top_ids = torch.log_softmax(logits[:depth_limit].float(), dim=-1).topk(width, dim=-1)
        top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
        heap = [(-top_lp[0][0], 0, 0, 0)]  # (-score, parent node, rank, tiebreak)
        counter = 1
        while heap and len(tokens) < budget:
            neg, parent, rank, _ = heapq.heappop(heap)
            node, depth = len(tokens), depths[parent] + 1
            tokens.append(top_ids[depth - 1][rank])
            parents.append(parent)
            depths.append(depth)
            scores.append(-neg)
            if rank + 1 < width:
                heapq.heappush(heap, (-(scores[parent] + top_lp[depth - 1][rank + 1]), parent, rank + 1, counter))
                counter += 1
            if depth < depth_limit:
                heapq.heappush(heap, (-(scores[node] + top_lp[depth][0]), node, 0, counter))
                counter += 1
    return _make_tree(tokens, parents, depths, scores, logits.device)


def chain_tree(anchor: int, logits: torch.Tensor, budget: int, width: int = 1, max_depth: int | None = None) -> DraftTree:
    """The linear draft: the top-1 token of each depth, ``min(budget - 1, depth limit)`` nodes below the root.
    (``width`` is accepted for a uniform builder signature; a chain has width 1.)"""
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1 (the root), got {budget}")
    depth_limit = logits.shape[0] if max_depth is None else min(max_depth, logits.shape[0])
    length = min(budget - 1, depth_limit)
    lp, ids = torch.log_softmax(logits[:length].float(), dim=-1).max(dim=-1)
    cum = torch.cumsum(lp, 0).tolist() if length else []
    return _make_tree(
        [anchor] + ids.tolist(), list(range(-1, length)), list(range(length + 1)), [0.0] + cum, logits.device
    )


TREE_BUILDERS = {"best_first": best_first_tree, "chain": chain_tree}
