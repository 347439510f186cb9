"""`DraftTree`: the token tree drafted from per-depth distributions, and the builders that make it.

A tree of N nodes is stored in topological order (parents before children). Node 0 is the root: the anchor token,
already committed but not yet in the target's KV cache. Node i sits at depth ``depths[i]`` (root 0) and stands for
the token sequence on the path root -> i.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from .calibration import Calibration, head_features, may_still_pay, retrieval_features, verify_cost
from .limits import MAX_FORWARD_TOKENS


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix ``bool [N, N]`` (``[i, j]`` iff node j is node i or one of its ancestors) from
    ``parents [N]`` (-1 for the root, ``parents[i] < i``), by pointer doubling: O(N^2 log N) tensor work, no Python
    loop over nodes. The one ancestor routine: the dense attention mask and the kernel's `TreeMeta` both use it."""
    n = parents.numel()
    reach = torch.eye(n, dtype=torch.bool, device=parents.device)  # ancestors at distance < 2^k
    jump = parents.long().clone()  # 2^k-th ancestor, -1 past the root
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        has_jump = jump >= 0
        target = jump.clamp(min=0)
        reach = reach | (reach[target] & has_jump[:, None])  # ancestors of my 2^k-th ancestor, within 2^k more
        jump = torch.where(has_jump, jump[target], jump)
    return reach


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

    @classmethod
    def from_lists(cls, tokens: list[int], parents: list[int], depths: list[int], scores: list[float] | None = None,
                   device=None) -> "DraftTree":
        """A tree from Python lists (node order = list order; ``scores`` default 0)."""
        scores = [0.0] * len(tokens) if scores is None else scores
        return cls(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            parents=torch.tensor(parents, dtype=torch.long, device=device),
            depths=torch.tensor(depths, dtype=torch.long, device=device),
            scores=torch.tensor(scores, dtype=torch.float32, device=device),
        )

    @classmethod
    def from_branches(cls, anchor: int, branches: list[list[int]], device=None) -> tuple["DraftTree", list[int]]:
        """The trie rooted at ``anchor`` holding every branch (token lists; shared prefixes merged). Also returns
        the node of each depth of the first branch (root first)."""
        tokens, parents, depths, children = [anchor], [-1], [0], [{}]
        first = [0]
        for b, branch in enumerate(branches):
            node = 0
            for token in branch:
                child = children[node].get(token)
                if child is None:
                    child = children[node][token] = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                    depths.append(depths[node] + 1)
                    children.append({})
                node = child
                if b == 0:
                    first.append(node)
        tree = cls.from_lists(tokens, parents, depths, device=device)
        tree.children = children
        return tree, first

    def ancestors(self) -> torch.Tensor:
        """Bool ``[N, N]``: ``[i, j]`` iff node j is node i or one of its ancestors (`ancestor_matrix`)."""
        return ancestor_matrix(self.parents)

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """``[1, N]`` positions: prefix length + depth."""
        return (self.depths + prefix_len)[None]

    def attention_mask(self, prefix_len: int, dtype: torch.dtype, key_len: int | None = None,
                       window: int | None = None, ancestors: torch.Tensor | None = None) -> torch.Tensor:
        """Additive mask ``[1, 1, N, key_len]`` over [KV prefix ; tree ; unused slots]: the prefix is visible,
        a tree node sees its ancestors and itself. ``key_len`` defaults to prefix + N (a StaticCache passes its
        full length; slots past the tree stay masked). ``window``: a sliding-window layer's, where a node at
        position p sees only keys at positions > p - window (transformers' sliding-window mask). ``ancestors``:
        `ancestors()` when the caller already has it (several masks of one tree)."""
        n = len(self)
        key_len = prefix_len + n if key_len is None else key_len
        visible = torch.zeros(n, key_len, dtype=torch.bool, device=self.tokens.device)
        visible[:, :prefix_len] = True
        visible[:, prefix_len : prefix_len + n] = self.ancestors() if ancestors is None else ancestors
        if window is not None:
            query = self.position_ids(prefix_len)[0]  # [N]
            key = torch.arange(key_len, device=self.tokens.device)
            key[prefix_len : prefix_len + n] = query
            visible &= query[:, None] - key[None, :] < window
        mask = torch.zeros(n, key_len, dtype=dtype, device=self.tokens.device)
        return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


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
    return DraftTree.from_lists(tokens, parents, depths, scores, logits.device)


def chain_tree(anchor: int, logits: torch.Tensor, budget: int, width: int = 1, max_depth: int | None = None) -> DraftTree:
    """The linear draft: the top-1 token of each depth, ``min(budget - 1, depth limit)`` nodes below the root.
    (``width`` is accepted for a uniform builder signature; a chain has width 1.)"""
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1 (the root), got {budget}")
    depth_limit = logits.shape[0] if max_depth is None else min(max_depth, logits.shape[0])
    length = min(budget - 1, depth_limit)
    lp, ids = torch.log_softmax(logits[:length].float(), dim=-1).max(dim=-1)
    cum = torch.cumsum(lp, 0).tolist() if length else []
    return DraftTree.from_lists(
        [anchor] + ids.tolist(), list(range(-1, length)), list(range(length + 1)), [0.0] + cum, logits.device
    )


def sample_without_replacement(q: torch.Tensor, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` successive draws without replacement from ``q [V]`` (each from q renormalised over the tokens not
    yet drawn: Plackett-Luce order); at most as many as q has tokens of nonzero probability. Returns ``[<= count]``."""
    count = min(count, int((q > 0).sum()))
    if count == 0:
        return torch.empty(0, dtype=torch.long, device=q.device)
    return torch.multinomial(q, count, replacement=False, generator=generator)


def sampled_tree(shape: DraftTree, q: torch.Tensor, generator: torch.Generator | None = None) -> DraftTree:
    """Redraw the tokens of ``shape`` (a tree built from ``log q``, children listed in rank order): the children
    of every node become draws without replacement from ``q[depth]`` (``q [D, V]``: row d-1 for depth d), in
    draw order. Children beyond q's support are dropped with their subtrees. ``scores``: accumulated log q."""
    parents, depths = shape.parents.tolist(), shape.depths.tolist()
    drawn: dict[int, list[int]] = {}  # parent -> its drawn child tokens, in draw order
    tokens, new_parents, new_depths = [int(shape.tokens[0])], [-1], [0]
    index = {0: 0}  # shape node -> new node
    rank = [0] * len(parents)
    for node in range(1, len(parents)):
        parent, row = parents[node], depths[node] - 1
        if parent not in index:
            continue
        if parent not in drawn:
            drawn[parent] = sample_without_replacement(q[row], len(shape.children[parent]), generator).tolist()
        r = rank[parent]
        rank[parent] += 1
        if r >= len(drawn[parent]):
            continue
        index[node] = len(tokens)
        tokens.append(drawn[parent][r])
        new_parents.append(index[parent])
        new_depths.append(depths[node])
    depths_t = torch.tensor(new_depths, dtype=torch.long, device=q.device)
    step = q[(depths_t[1:] - 1), torch.tensor(tokens[1:], dtype=torch.long, device=q.device)].log().tolist()
    scores = [0.0]
    for parent, value in zip(new_parents[1:], step):
        scores.append(scores[parent] + value)
    return DraftTree.from_lists(tokens, new_parents, new_depths, scores, shape.tokens.device)


def merged_tree(anchor: int, head_probs: torch.Tensor | None, candidates, calibration: Calibration, budget: int,
                width: int = 8, max_depth: int | None = None, node_cost=None, device=None
                ) -> tuple[DraftTree, list[tuple[str, list[float]] | None]]:
    """One tree from the head's per-depth distributions and retrieval candidates, best-first by each node's
    estimated probability of being accepted (the product of calibrated edge probabilities along its path).

    ``head_probs [D, V]``: the head's distributions of depths 1..D (None: no head); a node at depth d may take any
    of the top-``width`` tokens of depth d (as in `best_first_tree`). ``candidates``: a
    `hf_jetspec.candidates.Candidates` trie rooted at the anchor (None: no retrieval); a node on the trie also
    takes the trie's children. A token proposed by both is one node whose estimate sees both (the head's
    probability is a feature of the retrieval model). Stops at ``budget`` nodes (root included), at ``max_depth``,
    or, with ``node_cost`` (kappa or a `CostCurve`), at the size whose expected tokens per verification cost
    ``E(N) / C(N)`` is largest among the best-first prefixes (`hf_jetspec.calibration.may_still_pay` ends the search
    once no larger size can win). Returns the tree (``scores``: log estimated path probability) and each node's
    calibration record ``(kind, features)`` (None for the root).
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1 (the root), got {budget}")
    head_depth = 0 if head_probs is None else head_probs.shape[0]
    trie_depth = 0 if candidates is None else candidates.max_depth
    depth_limit = max(head_depth, trie_depth) if max_depth is None else min(max_depth, max(head_depth, trie_depth))
    vocab = 0 if head_probs is None else head_probs.shape[-1]
    if head_depth:
        probs = head_probs[: min(head_depth, depth_limit)].float().cpu()
        top_p, top_ids = probs.topk(max(1, min(width, probs.shape[-1])), dim=-1)
        top_p, top_ids = top_p.tolist(), top_ids.tolist()
    if candidates is not None:
        trie_children: list[list[int]] = [[] for _ in range(len(candidates))]
        for child, parent in enumerate(candidates.parents.tolist()):
            if parent >= 0:
                trie_children[parent].append(child)
        trie_tokens, fractions = candidates.tokens.tolist(), candidates.fractions().tolist()
        counts = candidates.counts.tolist()

    tokens, parents, depths, logp = [anchor], [-1], [0], [0.0]
    trie_of: list[int | None] = [0 if candidates is not None else None]
    records: list[tuple[str, list[float]] | None] = [None]
    heap: list = []
    order = 0

    def push_children(node: int) -> None:
        nonlocal order
        depth = depths[node] + 1
        if depth > depth_limit:
            return
        proposed = set()
        trie_node = trie_of[node]
        for child in trie_children[trie_node] if trie_node is not None else ():
            token = trie_tokens[child]
            if head_depth and token >= vocab:  # an input-only id (Mllama's image token): never emitted
                continue
            proposed.add(token)
            p_head = float(probs[depth - 1, token]) if depth <= head_depth else None
            sources = {name: (fractions[s][child], candidates.match_lens[s], counts[s][child])
                       for s, name in enumerate(candidates.sources) if counts[s][child] > 0}
            x = retrieval_features(p_head, depth, sources)
            edge = calibration.retrieval_edge(x)
            heapq.heappush(heap, (-(logp[node] + math.log(max(edge, 1e-30))), order, node, token, child,
                                  ("retrieval", x)))
            order += 1
        if depth <= min(head_depth, depth_limit):
            for p, token in zip(top_p[depth - 1], top_ids[depth - 1]):
                if token in proposed or p <= 0:
                    continue
                edge = calibration.head_edge(p, depth)
                heapq.heappush(heap, (-(logp[node] + math.log(max(edge, 1e-30))), order, node, token, None,
                                      ("head", head_features(p, depth))))
                order += 1

    push_children(0)
    expected, size = 1.0, 1  # E(N) = 1 + the gains so far; the best size so far
    best = 1.0 / verify_cost(node_cost, 1) if node_cost is not None else 0.0
    while heap and len(tokens) < budget:
        neg, _, parent, token, trie_node, record = heapq.heappop(heap)
        gain = math.exp(-neg)  # best-first: no later node has a larger one (edges are probabilities)
        if node_cost is not None and not may_still_pay(gain, best, len(tokens), node_cost, budget):
            break
        expected += gain
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        logp.append(-neg)
        trie_of.append(trie_node)
        records.append(record)
        push_children(len(tokens) - 1)
        if node_cost is None:
            size = len(tokens)
        elif (ratio := expected / verify_cost(node_cost, len(tokens))) > best:
            best, size = ratio, len(tokens)
    tokens, parents, depths, logp, records = (x[:size] for x in (tokens, parents, depths, logp, records))
    return DraftTree.from_lists(tokens, parents, depths, logp, device), records


TREE_BUILDERS = {"best_first": best_first_tree, "chain": chain_tree}
