"""Acceptance rules: which drafted tokens a verified tree commits. Every rule emits, one position at a time, a token
distributed exactly as plain ``generate()`` would choose it, so greedy decoding is token-identical and sampling
draws from exactly the target's processed distribution.

- ``"match"`` (`accept_walk`, greedy and sampling): at the current node the target's token is chosen exactly as
  ``generate()`` would choose it after that node's prefix (argmax, or a fresh draw from the processed
  distribution); if a drafted child carries that token the walk moves there, otherwise that token is the step's
  correction ("bonus") token. A node accepts with probability ``sum(p(children))``.
- ``"rrs"`` (`rejection_walk`, sampling): the children of a node were DRAWN from the draft distribution q of their
  depth, without replacement (`hf_jetspec.tree.sampled_tree`; SpecInfer, Miao et al. 2024; Recursive Speculative
  Decoding, Jeon et al. 2024), and are verified by recursive rejection: child ``c_i`` is accepted with probability
  ``min(1, p'(c_i) / q'(c_i))``; on rejection ``p' <- norm(max(0, p' - q'))`` and ``q' <- q'`` without ``c_i``,
  renormalised; when every child is rejected the token is drawn from the final ``p'``. By induction over the
  children each step outputs a sample of its ``p'``, so the emitted token is an exact sample of p. On a chain (one
  child per node) this is standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept ``d``
  with probability ``min(1, p(d) / q(d))``, else draw from ``norm(max(0, p - q))``.

q is the draft logits processed like the target's (the prepared logits processors: temperature, top-k, top-p,
...), with the committed sequence as context for every depth (`draft_distributions`): exact for the warpers, an
approximation for sequence-dependent processors (repetition penalty), which only costs acceptance, never exactness.
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


def accept_walk(tree: DraftTree, logits: torch.Tensor, selector: TokenSelector, writer: TokenWriter) -> list[int]:
    """Walk the tree from the root, emitting the target's token at each visited node; return the visited nodes
    (root first: the nodes whose KV stays in the cache). Stops early when the writer reports a stop.

    ``logits [N, V]``: target logits at every node. The root token is already in ``writer.ids``.
    """
    want_scores = writer.scores is not None or writer.raw_logits is not None
    fast = selector.plain_greedy and not want_scores
    argmax = logits.argmax(dim=-1).tolist() if fast else None
    node, visited = 0, [0]
    while True:
        if fast:
            token, scores = argmax[node], None
        else:
            scores = selector.scores(writer.ids, logits[node : node + 1])
            token = selector.choose(scores)
        if writer.emit(token, scores, logits[node : node + 1]):
            return visited
        child = tree.child(node, token)
        if child is None:
            return visited
        visited.append(child)
        node = child


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
    """`accept_walk` with recursive rejection: from the root, emit at each visited node the token that
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


def accept(tree: DraftTree, logits: torch.Tensor, selector: TokenSelector, writer: TokenWriter,
           q: torch.Tensor | None = None) -> list[int]:
    """The step's rule: `rejection_walk` when ``q [D, V]`` (the distributions the tree's tokens were drawn from)
    is given, else `accept_walk`. Returns the visited nodes (root first)."""
    if q is not None:
        return rejection_walk(tree, logits, q, selector, writer)
    return accept_walk(tree, logits, selector, writer)
