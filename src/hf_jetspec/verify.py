"""Tree verification: one target forward over the tree nodes, then the acceptance walk.

The walk is the same for greedy and sampling decoding ("sample, then match"): at the current node the target's
token is chosen exactly as plain ``generate()`` would choose it after that node's prefix (argmax, or a fresh draw
from the processed distribution); if a drafted child carries that token the walk moves there, otherwise the token
is the step's correction ("bonus") token. Every emitted token is therefore the target's own choice given the
emitted prefix, which makes greedy decoding token-identical and sampling distribution-exact.
"""

from __future__ import annotations

import torch

from .attention import TreeAttentionPlan, attention_implementation
from .cache import mask_key_length
from .tokens import TokenSelector, TokenWriter
from .tree import DraftTree


def verify_tree(
    model, tree: DraftTree, cache, prefix_len: int, plan: TreeAttentionPlan, cache_key: str
) -> torch.Tensor:
    """Run the target over the ``N`` tree nodes on top of ``prefix_len`` cached positions; return logits ``[N, V]``.

    The cache grows by N slots (``prefix_len .. prefix_len + N - 1``, node order); compact it afterwards.
    """
    kwargs = {cache_key: cache, "use_cache": True, "position_ids": tree.position_ids(prefix_len)}
    if plan.kernel:
        from .kernels import TreeMeta

        kwargs["tree_meta"] = TreeMeta.from_parents(tree.parents, prefix_len).to(tree.tokens.device)
        mask = None
    else:
        key_len = mask_key_length(cache, prefix_len, len(tree))
        mask = tree.attention_mask(prefix_len, model.dtype, key_len)
    with attention_implementation(model, plan.implementation):
        out = model(input_ids=tree.tokens[None], attention_mask=mask, **kwargs)
    return out.logits[0]


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
