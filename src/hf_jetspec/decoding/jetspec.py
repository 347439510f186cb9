"""JetSpec decoding: draft a block with the head, build a token tree, verify it in one target forward, accept the
longest matching path, compact the KV cache, repeat.

Usable as ``model.generate(**inputs, custom_generate=jetspec_generate, draft_head=head)``: ``generate()`` prepares
the cache, logits processors and stopping criteria and calls this function with them.
"""

from __future__ import annotations

import torch

from ..attention import plan_tree_attention
from ..cache import cache_kwarg, keep_positions, room_left
from ..drafters import Drafter, HeadDrafter
from ..features import FeatureTap
from ..head import JetSpecHead
from ..limits import check_tree_limits
from ..models import as_draft_head
from ..outputs import DecodingStats, Timer
from ..sampling import DEFAULT_SAMPLING_RULE, check_sampling_rule, draft_distributions, rejection_walk, sampled_tree
from ..tokens import TokenSelector, TokenWriter, remaining_tokens
from ..tree import TREE_BUILDERS
from ..verify import accept_walk, verify_tree
from .common import prefill, validate_call

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
        draft_head: the `JetSpecHead` made for this target, or its folder / Hub id (loaded on each call); or
            ``drafter``: any `Drafter`, e.g. `OracleDrafter`.
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
    draft_head = as_draft_head(draft_head, model)
    tree_budget, tree_width = tree_settings(draft_head, tree_budget, tree_width)
    cache = validate_call(model, input_ids, generation_config, synced_gpus, model_kwargs)
    check_tree_limits(model, generation_config, tree_budget, tree_width)
    drafter = resolve_drafter(model, draft_head, drafter)
    build_tree = TREE_BUILDERS[tree_builder]
    rejection = check_sampling_rule(sampling_rule) == "rrs" and bool(generation_config.do_sample)
    plan = plan_tree_attention(model, tree_kernel)
    cache_key = cache_kwarg(model)
    selector = TokenSelector(logits_processor, generation_config, generator)
    writer = TokenWriter(input_ids, stopping_criteria, generation_config, streamer, token_streamer)
    timer, stats = Timer(input_ids.device), DecodingStats()

    start = timer.now()
    drafter.start()
    with FeatureTap(model, drafter.layer_ids) as tap:
        logits = prefill(model, input_ids, model_kwargs)
        features = tap.features()
        stats.prefill_time = timer.now() - start
        scores = selector.scores(writer.ids, logits)
        writer.emit(selector.choose(scores), scores, logits)
        prefix = input_ids.shape[1]
        while not writer.finished:
            writer.flush()
            budget = min(tree_budget, room_left(cache, prefix) or tree_budget)
            depth = min(drafter.block_size - 1, remaining_tokens(writer, generation_config) - 1, budget - 1)
            t0 = timer.now()
            draft = drafter.propose(writer.ids, None if features is None else features[0], depth)
            t1 = timer.now()
            if rejection:
                q = draft_distributions(selector, writer.ids, draft[:depth])
                shape = build_tree(int(writer.ids[0, -1]), q.log(), budget, width=tree_width, max_depth=depth)
                tree = sampled_tree(shape, q, selector.generator)
            else:
                tree = build_tree(int(writer.ids[0, -1]), draft, budget, width=tree_width, max_depth=depth)
            t2 = timer.now()
            logits = verify_tree(model, tree, cache, prefix, plan, cache_key)
            features = tap.features()
            t3 = timer.now()
            before = writer.length
            if rejection:
                visited = rejection_walk(tree, logits, q, selector, writer)
            else:
                visited = accept_walk(tree, logits, selector, writer)
            keep_positions(cache, prefix, visited)
            if features is not None:
                features = features[:, visited]
            prefix += len(visited)
            stats.accept_lengths.append(writer.length - before)
            stats.draft_time += t1 - t0
            stats.target_time += t3 - t2
    stats.total_time = timer.now() - start
    return writer.result(generation_config, cache, stats)
