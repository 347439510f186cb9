"""Multi-draft speculative sampling by recursive rejection ("rrs"), the alternative to "sample, then match".

With ``do_sample=True`` JetSpec can verify a tree in two exact ways (``jetspec_generate(sampling_rule=...)``):

- ``"match"`` (`verify.accept_walk`): the tree holds the draft's top tokens; at each node the target samples its
  token and the walk moves to the child carrying it. A node accepts with probability ``sum(p(children))``.
- ``"rrs"`` (this module): the children of a node are DRAWN from the draft distribution q of their depth, without
  replacement (SpecInfer, Miao et al. 2024; EAGLE-2 / Recursive Speculative Decoding, Jeon et al. 2024), and
  verified by recursive rejection: child ``c_i`` is accepted with probability ``min(1, p'(c_i) / q'(c_i))``; on
  rejection ``p' <- norm(max(0, p' - q'))`` and ``q' <- q'`` without ``c_i``, renormalised (the distribution the
  next child was drawn from); when every child is rejected the token is drawn from the final ``p'``. By induction
  over the children each step outputs a sample of its ``p'``, so the emitted token is an exact sample of p. A
  node whose draft matches the target (q = p) accepts with probability 1, however few children it has.

The tree's SHAPE (how many children each node has, and how big each child's subtree is) is the deterministic
builder's shape for q (best-first or chain), a function of q only; the tokens are then drawn, the i-th drawn
child of a node taking the i-th ranked child's place. The shape never depends on the draws, which keeps the
rejection scheme exact.

q is the draft logits processed like the target's (the prepared logits processors: temperature, top-k, top-p,
...), with the committed sequence as context for every depth: exact for the warpers, an approximation for
sequence-dependent processors (repetition penalty), which only costs acceptance, never exactness.
"""

from __future__ import annotations

import torch

from .tokens import TokenSelector, TokenWriter
from .tree import DraftTree

SAMPLING_RULES = ("match", "rrs")
# "match" is the default: on SmolLM2 with the shipped head it accepted more and ran faster than "rrs" at T = 0.7
# and T = 1 (docs/results.md, section 4); "rrs" gains where the draft is well calibrated.
DEFAULT_SAMPLING_RULE = "match"


def check_sampling_rule(rule: str) -> str:
    if rule not in SAMPLING_RULES:
        raise ValueError(f"Unknown sampling_rule {rule!r}; choose from {SAMPLING_RULES}")
    return rule


def draft_distributions(selector: TokenSelector, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Processed draft distributions ``q [D, V]`` (fp32) from raw draft ``logits [D, V]``: the selector's logits
    processors applied to every depth with the committed ``ids [1, L]`` as context, then softmax."""
    if logits.shape[0] == 0:
        return logits.float()
    scores = selector.scores(ids.expand(logits.shape[0], -1), logits)
    return torch.softmax(scores, dim=-1)


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
    support = (q > 0).sum(dim=-1).tolist()
    drawn: dict[int, list[int]] = {}  # parent -> its drawn child tokens, in draw order
    tokens, new_parents, new_depths = [int(shape.tokens[0])], [-1], [0]
    index = {0: 0}  # shape node -> new node
    rank = [0] * len(parents)
    for node in range(1, len(parents)):
        parent, row = parents[node], depths[node] - 1
        if parent not in index:
            continue
        if parent not in drawn:
            count = min(len(shape.children[parent]), support[row])
            drawn[parent] = torch.multinomial(q[row], count, replacement=False, generator=generator).tolist()
        r = rank[parent]
        rank[parent] += 1
        if r >= len(drawn[parent]):
            continue
        index[node] = len(tokens)
        tokens.append(drawn[parent][r])
        new_parents.append(index[parent])
        new_depths.append(depths[node])
    device = shape.tokens.device
    tokens_t = torch.tensor(tokens, dtype=torch.long, device=device)
    depths_t = torch.tensor(new_depths, dtype=torch.long, device=device)
    step = q[(depths_t[1:] - 1), tokens_t[1:]].log().tolist()
    scores = [0.0]
    for parent, value in zip(new_parents[1:], step):
        scores.append(scores[parent] + value)
    return DraftTree(
        tokens=tokens_t,
        parents=torch.tensor(new_parents, dtype=torch.long, device=device),
        depths=depths_t,
        scores=torch.tensor(scores, dtype=torch.float32, device=device),
    )


def recursive_rejection(p: torch.Tensor, q: torch.Tensor, children: list[int],
                        generator: torch.Generator | None = None) -> tuple[int | None, int]:
    """Recursive rejection sampling over ``children`` drawn without replacement from ``q [V]``, in draw order.

    ``p [V]``: the target's processed distribution at the node. Returns (index of the accepted child or None, the
    emitted token): an exact sample of p.
    """
    if children:
        p, q = p.double(), q.double()
    for i, child in enumerate(children):
        u = float(torch.rand((), generator=generator, device=p.device, dtype=torch.float64))
        if u * float(q[child]) < float(p[child]):  # P(accept) = min(1, p'(c) / q'(c))
            return i, child
        residual = (p - q).clamp_min(0)
        total = residual.sum()
        p = residual / total if total > 0 else p  # total == 0 only when p' == q' up to rounding
        q = q.clone()
        q[child] = 0
        q = q / q.sum() if q.sum() > 0 else q
    return None, int(torch.multinomial(p, 1, generator=generator))


def rejection_walk(tree: DraftTree, logits: torch.Tensor, q: torch.Tensor, selector: TokenSelector,
                   writer: TokenWriter) -> list[int]:
    """`verify.accept_walk` with recursive rejection: from the root, emit at each visited node the token that
    `recursive_rejection` picks among the node's children (``q[depth]`` is what they were drawn from); move to the
    accepted child, stop after a residual draw. Returns the visited nodes (root first).

    ``tree``: from `sampled_tree` (children in draw order); ``logits [N, V]``: target logits at every node.
    """
    node, visited = 0, [0]
    depths = tree.depths.tolist()
    while True:
        scores = selector.scores(writer.ids, logits[node : node + 1])
        children = list(tree.children[node].items())  # (token, node), in draw order
        p = torch.softmax(scores[0], dim=-1)
        dq = q[depths[node]] if children else p
        accepted, token = recursive_rejection(p, dq, [t for t, _ in children], selector.generator)
        if writer.emit(token, scores, logits[node : node + 1]) or accepted is None:
            return visited
        node = children[accepted][1]
        visited.append(node)
