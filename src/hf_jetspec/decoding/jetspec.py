"""JetSpec decoding: draft a block with the head, build a token tree, verify it in one target forward, accept the
longest matching path, compact the KV cache, repeat.

Usable as ``model.generate(**inputs, custom_generate=jetspec_generate, draft_head=head)``: ``generate()`` prepares
the cache, logits processors and stopping criteria and calls this function with them.
"""

from __future__ import annotations

import torch

from ..acceptance import DEFAULT_SAMPLING_RULE, accept, check_sampling_rule, draft_distributions
from ..calibration import Calibration, resolve_node_cost
from ..drafters import Drafter, HeadDrafter
from ..head import JetSpecHead
from ..limits import check_range, check_tree_limits
from ..models import as_draft_head
from ..retrieval import DEFAULT_RETRIEVAL_DEPTH, resolve_retrieval
from ..tree import TREE_BUILDERS, DraftTree, merged_tree, sampled_tree
from .adaptive import DraftDepth, deepest_head_node, online_estimates, reached_nodes
from .rows import per_row
from .session import DecodingSession

DEFAULT_TREE_BUDGET = 32
DEFAULT_TREE_WIDTH = 8


def tree_settings(draft_head: JetSpecHead | None, budget: int | None, width: int | None, merged: bool = False
                  ) -> tuple[int, int]:
    """Per-call values win, then the head's config (``tree_budget`` / ``tree_width``), then the defaults. A merged
    tree (retrieval on) stops growing by itself, so its default budget is at least `DEFAULT_TREE_BUDGET`."""
    config = draft_head.config if draft_head is not None else None
    default = getattr(config, "tree_budget", DEFAULT_TREE_BUDGET)
    budget = budget if budget is not None else max(default, DEFAULT_TREE_BUDGET) if merged else default
    width = width if width is not None else getattr(config, "tree_width", DEFAULT_TREE_WIDTH)
    return check_range("tree_budget", budget), check_range("tree_width", width)


def resolve_drafter(model, draft_head: JetSpecHead | None, drafter: Drafter | None, required: bool = True
                    ) -> Drafter | None:
    if drafter is not None:
        missing = [name for name in ("block_size", "layer_ids", "start", "observe", "propose")
                   if not hasattr(drafter, name)]
        block = getattr(drafter, "block_size", None)
        if missing or not isinstance(block, int) or isinstance(block, bool) or block < 1:
            what = f"lacks {', '.join(missing)}" if missing else f"has block_size {block!r}"
            hint = " (a JetSpecHead goes to draft_head=)" if isinstance(drafter, JetSpecHead) else ""
            raise ValueError(f"drafter= must implement hf_jetspec.drafters.Drafter (an integer block_size >= 1, "
                             f"layer_ids, start, observe, propose): {type(drafter).__name__} {what}{hint}")
        return drafter
    if draft_head is None:
        if not required:
            return None
        raise ValueError("JetSpec decoding needs a draft head: pass draft_head=JetSpecHead.from_pretrained(...) "
                         "(or use hf_jetspec.suffix_generate: retrieval drafting without a head).")
    return HeadDrafter(draft_head, model)


def check_draft(draft, drafter: Drafter, depth: int, vocab: int) -> torch.Tensor:
    """``draft`` (``drafter.propose``'s logits ``[rows, V]`` over the target's vocabulary), or a ``ValueError``
    saying what a custom drafter returned instead."""
    if not isinstance(draft, torch.Tensor) or draft.dim() != 2 or draft.shape[1] != vocab:
        got = f"a tensor of shape {list(draft.shape)}" if isinstance(draft, torch.Tensor) else type(draft).__name__
        raise ValueError(f"{type(drafter).__name__}.propose(ids, depth={depth}) must return logits [depth, {vocab}] "
                         f"(a row per depth over the target's vocabulary), got {got}")
    return draft


def log_records(log: list, outcomes: list) -> None:
    """Calibration records of one verified merged tree's outcomes (`reached_nodes`), as
    `hf_jetspec.calibration.fit` reads them."""
    log.extend({"kind": kind, "x": x, "accepted": accepted} for kind, x, accepted in outcomes)


@per_row("A JetSpec tree holds tree_budget= nodes, tree_width= tokens per depth (custom_generate=); "
         "with assistant_model=head, the head's config.tree_budget / tree_width")
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
    retrieval=None,
    retrieval_depth: int = DEFAULT_RETRIEVAL_DEPTH,
    calibration: Calibration | None = None,
    node_cost: float | str | None = "auto",
    calibration_log: list | None = None,
    online_calibration: bool | None = None,
    token_streamer=None,
    generator: torch.Generator | None = None,
    **model_kwargs,
):
    """Generate with JetSpec tree speculative decoding (greedy: identical tokens to plain ``generate()``;
    sampling: the same distribution).

    Args (beyond ``generate()``'s own):
        draft_head: the `JetSpecHead` made for this target, or its folder / Hub id (loaded on each call); or
            ``drafter``: any `Drafter`, e.g. `OracleDrafter`; optional only when ``retrieval`` is given explicitly
            (retrieval drafting alone: `suffix_generate`).
        tree_budget: tree nodes verified per step, root included (1 = plain decoding); default: the head's
            ``config.tree_budget`` (32).
        tree_width: candidate tokens per depth; default: the head's ``config.tree_width`` (8).
        tree_builder: ``"best_first"`` (tree) or ``"chain"`` (linear draft).
        tree_kernel: use the Triton tree-attention kernel (None: automatically on CUDA).
        sampling_rule: how a tree is drafted and verified when sampling (``do_sample=True``; greedy decoding
            ignores it): ``"match"`` (default) drafts the top tokens and follows the child carrying the target's own
            sample (draw for draw what plain sampling draws); ``"rrs"`` draws each node's children from the
            processed draft distribution without replacement and verifies them by recursive rejection
            (`hf_jetspec.acceptance`). Both are exact.
        retrieval: also draft continuations of text already written (`hf_jetspec.retrieval`): this call's prompt and
            output, and a datastore; merged with the head's drafts into one tree, best-first by calibrated
            acceptance estimates (`hf_jetspec.tree.merged_tree`). None (default): on, with the head's own datastore
            (``head.datastore``) when it has one, except for the "rrs" sampling rule and the chain builder (head
            only); False: head only; True: on; a `CorpusIndex`: on, with that datastore; a `RetrievalDrafter`.
            With retrieval the head drafts only as deep as the recent trees went (`DraftDepth`), not its whole block.
        retrieval_depth: the deepest retrieved continuation.
        calibration: the acceptance estimates of merged trees (default: ``head.calibration``, else defaults).
        node_cost: with retrieval, the tree takes the size with the most expected tokens per verification cost
            (among its best-first prefixes): ``"auto"`` (default) = the calibration's stored cost, else the cost
            of forwards of 1 to 16, 32, 64, ... tokens measured once per model on this device
            (`hf_jetspec.calibration.measure_cost_curve`); a number (kappa: N nodes cost 1 + kappa N forwards) or a
            `CostCurve`; None = always fill ``tree_budget``.
        calibration_log: a list receiving a calibration record per verified node (`hf_jetspec.calibration.fit`).
        online_calibration: with retrieval, correct edge models' intercepts from this call's own verification
            outcomes as it goes (`hf_jetspec.calibration.OnlineCalibration`: trees shrink on text where drafts are
            rejected more often than the calibration expects, grow where they are accepted more often). None
            (default): the models the calibration did not fit (``fitted_on`` 0: the defaults, e.g. suffix decoding
            or a head without ``calibration.json``); True: both; False: neither (the calibration as given).
        token_streamer: a streamer receiving tokens as they are accepted (``generate()`` does not forward its own
            ``streamer=`` to ``custom_generate`` callables; the ``assistant_model`` route forwards it).
        generator: ``torch.Generator`` for reproducible sampling.

    Returns the sequences ``[1, T]``, or a `JetSpecGenerateOutput` with ``accept_lengths`` and ``stats`` when
    ``return_dict_in_generate=True``.
    """
    if tree_builder not in TREE_BUILDERS:
        raise ValueError(f"Unknown tree_builder {tree_builder!r}; choose from {sorted(TREE_BUILDERS)}")
    draft_head = as_draft_head(draft_head, model)
    rejection = check_sampling_rule(sampling_rule) == "rrs" and bool(generation_config.do_sample)
    retriever = resolve_retrieval(retrieval, draft_head, model, head_only=rejection or tree_builder == "chain",
                                  depth=retrieval_depth)
    tree_budget, tree_width = tree_settings(draft_head, tree_budget, tree_width, merged=retriever is not None)
    check_tree_limits(model, generation_config, tree_budget, tree_width)
    drafter = resolve_drafter(model, draft_head, drafter, required=retriever is None or retrieval is None)
    build_tree = TREE_BUILDERS[tree_builder]
    vocab = model.get_output_embeddings().weight.shape[0]
    if calibration is not None and not isinstance(calibration, Calibration):
        raise ValueError(f"calibration= takes a hf_jetspec.calibration.Calibration (Calibration.load(path)), got "
                         f"{type(calibration).__name__}")
    if calibration_log is not None and not isinstance(calibration_log, list):
        raise ValueError(f"calibration_log= takes a list that receives the records, got "
                         f"{type(calibration_log).__name__}")
    calibration = calibration or getattr(draft_head, "calibration", None) or Calibration()
    kappa = resolve_node_cost(node_cost, calibration, model, tree_budget) if retriever is not None else None
    estimates = online_estimates(calibration, online_calibration) if retriever is not None else calibration
    head_depth = DraftDepth(drafter.block_size - 1) if drafter is not None and retriever is not None else None

    def draft_tree(session: DecodingSession) -> tuple[DraftTree, torch.Tensor | None, list | None]:
        """This step's tree; for the "rrs" rule also the processed draft distributions it was drawn from; for a
        merged tree the nodes' calibration records."""
        budget = session.node_room(tree_budget)
        depth = min(drafter.block_size - 1, budget - 1, session.max_depth()) if drafter is not None else 0
        if head_depth is not None:
            depth = min(depth, head_depth.limit)
        with session.drafting():
            draft = check_draft(drafter.propose(session.ids, depth), drafter, depth, vocab) \
                if drafter is not None else None
            found = retriever.candidates(session.ids, min(budget - 1, session.max_depth())) if retriever else None
        if retriever is not None:
            probs = torch.softmax(draft[:depth].float(), dim=-1) if depth > 0 else None
            tree, records = merged_tree(session.anchor, probs, found, estimates, budget, tree_width,
                                        node_cost=kappa, device=session.ids.device)
            return tree, None, records
        if not rejection:
            return build_tree(session.anchor, draft, budget, width=tree_width, max_depth=depth), None, None
        q = draft_distributions(session.selector.for_drafts(), session.ids, draft[:depth])
        shape = build_tree(session.anchor, q.log(), budget, width=tree_width, max_depth=depth)
        return sampled_tree(shape, q, session.selector.generator), q, None

    with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, model_kwargs, token_streamer=token_streamer, generator=generator,
                         tree_kernel=tree_kernel, layer_ids=drafter.layer_ids if drafter else ()) as session:
        for part in (drafter, retriever):
            if part is not None:
                part.start()
        session.prefill()
        if drafter is not None:
            drafter.observe(session.features, None)
        while not session.finished:
            tree, q, records = draft_tree(session)
            logits = session.verify(tree)
            visited = accept(tree, logits, session.selector, session.writer, q)
            session.commit(visited)
            if drafter is not None:
                drafter.observe(session.features, visited)
            if records is not None:
                if calibration_log is not None or estimates is not calibration:
                    outcomes = reached_nodes(tree, records, visited)  # once for the log and the estimates
                    if calibration_log is not None:
                        log_records(calibration_log, outcomes)
                    if estimates is not calibration:
                        estimates.observe(outcomes)
                if head_depth is not None:
                    head_depth.update(deepest_head_node(tree, records))
        return session.finish()
