"""JetSpec decoding: draft a block with the head, build a token tree, verify it in one target forward, accept the
longest matching path, compact the KV cache, repeat.

Usable as ``model.generate(**inputs, custom_generate=jetspec_generate, draft_head=head)``: ``generate()`` prepares
the cache, logits processors and stopping criteria and calls this function with them.
"""

from __future__ import annotations

import torch

from ..acceptance import DEFAULT_SAMPLING_RULE, accept, check_sampling_rule, draft_distributions
from ..drafters import Drafter, HeadDrafter
from ..head import JetSpecHead
from ..tree import TREE_BUILDERS, DraftTree, sampled_tree
from .session import DecodingSession

DEFAULT_TREE_BUDGET = 32
DEFAULT_TREE_WIDTH = 8


def tree_settings(draft_head: JetSpecHead | None, budget: int | None, width: int | None) -> tuple[int, int]:
    """Per-call values win, then the head's config (``tree_budget`` / ``tree_width``), then the defaults."""
    config = draft_head.config if draft_head is not None else None
    budget = budget if budget is not None else getattr(config, "tree_budget", DEFAULT_TREE_BUDGET)
    width = width if width is not None else getattr(config, "tree_width", DEFAULT_TREE_WIDTH)
    if budget < 1 or width < 1:
        raise ValueError(f"tree_budget and tree_width must be >= 1, got {budget} and {width}")
    return budget, width


def resolve_drafter(model, draft_head: JetSpecHead | None, drafter: Drafter | None) -> Drafter:
    if drafter is not None:
        return drafter
    if draft_head is None:
        raise ValueError("JetSpec decoding needs a draft head: pass draft_head=JetSpecHead.from_pretrained(...).")
    return HeadDrafter(draft_head, model)


def jetspec_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    draft_head: JetSpecHead | None = None,
    drafter: Drafter | None = None,
    tree_budget: int | None = None,
    tree_width: int | None = None,
    tree_builder: str = "best_first",
    tree_kernel: bool | None = None,
    sampling_rule: str = DEFAULT_SAMPLING_RULE,
    token_streamer=None,
    generator: torch.Generator | None = None,
    **model_kwargs,
):
    """Generate with JetSpec tree speculative decoding (greedy: identical tokens to plain ``generate()``;
    sampling: the same distribution).

    Args (beyond ``generate()``'s own):
        draft_head: the `JetSpecHead` made for this target (or ``drafter``: any `Drafter`, e.g. `OracleDrafter`).
        tree_budget: tree nodes verified per step, root included (1 = plain decoding); default: the head's
            ``config.tree_budget`` (32).
        tree_width: candidate tokens per depth; default: the head's ``config.tree_width`` (8).
        tree_builder: ``"best_first"`` (tree) or ``"chain"`` (linear draft).
        tree_kernel: use the Triton tree-attention kernel (None: automatically on CUDA).
        sampling_rule: how a tree is drafted and verified when sampling (``do_sample=True``; greedy decoding
            ignores it): ``"match"`` (default) drafts the top tokens and follows the child carrying the target's own
            sample (draw for draw what plain sampling draws); ``"rrs"`` draws each node's children from the
            processed draft distribution without replacement and verifies them by recursive rejection
            (`hf_jetspec.sampling`). Both are exact.
        token_streamer: a streamer receiving tokens as they are accepted (``generate()`` does not forward its own
            ``streamer=`` to ``custom_generate`` callables; the ``assistant_model`` route forwards it).
        generator: ``torch.Generator`` for reproducible sampling.

    Returns the sequences ``[1, T]``, or a `JetSpecGenerateOutput` with ``accept_lengths`` and ``stats`` when
    ``return_dict_in_generate=True``.
    """
    if tree_builder not in TREE_BUILDERS:
        raise ValueError(f"Unknown tree_builder {tree_builder!r}; choose from {sorted(TREE_BUILDERS)}")
    tree_budget, tree_width = tree_settings(draft_head, tree_budget, tree_width)
    drafter = resolve_drafter(model, draft_head, drafter)
    build_tree = TREE_BUILDERS[tree_builder]
    rejection = check_sampling_rule(sampling_rule) == "rrs" and bool(generation_config.do_sample)

    def draft_tree(session: DecodingSession) -> tuple[DraftTree, torch.Tensor | None]:
        """This step's tree (and, for the "rrs" rule, the processed draft distributions it was drawn from)."""
        budget = session.node_room(tree_budget)
        depth = min(drafter.block_size - 1, budget - 1, session.max_depth())
        with session.drafting():
            draft = drafter.propose(session.ids, depth)
        if not rejection:
            return build_tree(session.anchor, draft, budget, width=tree_width, max_depth=depth), None
        q = draft_distributions(session.selector, session.ids, draft[:depth])
        shape = build_tree(session.anchor, q.log(), budget, width=tree_width, max_depth=depth)
        return sampled_tree(shape, q, session.selector.generator), q

    with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, model_kwargs, token_streamer=token_streamer, generator=generator,
                         tree_kernel=tree_kernel, layer_ids=drafter.layer_ids) as session:
        drafter.start()
        session.prefill()
        drafter.observe(session.features, None)
        while not session.finished:
            tree, q = draft_tree(session)
            logits = session.verify(tree)
            visited = accept(tree, logits, session.selector, session.writer, q)
            session.commit(visited)
            drafter.observe(session.features, visited)
        return session.finish()
