"""Suffix decoding: training-free tree speculation for any causal LM, no head needed.

Drafts are what followed the longest suffixes of the current text earlier in this call's prompt and output, and
in an optional datastore of token ids (`hf_jetspec.retrieval`); the candidates become one tree, best-first by
calibrated acceptance estimates, that the target verifies in one forward. It is `jetspec_generate` without a head.

Usable as ``model.generate(**inputs, custom_generate=hf_jetspec.suffix_generate)`` (what prompt-lookup users
switch to: several branches and long continuations instead of one 10-token chain).
"""

from __future__ import annotations

import torch

from ..calibration import Calibration
from ..retrieval import DEFAULT_RETRIEVAL_DEPTH
from .jetspec import DEFAULT_TREE_BUDGET, jetspec_generate

# jetspec_generate's arguments that belong to a head (or choose one); suffix decoding has none.
HEAD_ARGUMENTS = ("draft_head", "drafter", "retrieval", "tree_width", "tree_builder", "sampling_rule")


def suffix_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    datastore=None,
    tree_budget: int = DEFAULT_TREE_BUDGET,
    retrieval_depth: int = DEFAULT_RETRIEVAL_DEPTH,
    calibration: Calibration | None = None,
    node_cost: float | str | None = "auto",
    calibration_log: list | None = None,
    online_calibration: bool | None = None,
    tree_kernel: bool | None = None,
    token_streamer=None,
    generator: torch.Generator | None = None,
    **model_kwargs,
):
    """Generate with suffix decoding (greedy: identical tokens to plain ``generate()``; sampling: the same
    distribution, "sample, then match").

    Args (beyond ``generate()``'s own): ``datastore``: a `CorpusIndex` of token ids made with this model's tokenizer
    (None: only this call's own text); ``tree_budget``: most nodes per step (fewer when a smaller size gives more
    expected tokens per verification cost: ``node_cost``); ``retrieval_depth``, ``calibration``, ``node_cost``,
    ``calibration_log``, ``online_calibration`` (by default on: suffix decoding's retrieval model is the default
    one unless ``calibration`` brings a fitted one), ``tree_kernel``, ``token_streamer``, ``generator``: as in
    `jetspec_generate`. A head's arguments (`HEAD_ARGUMENTS`) are refused by name unless None.
    """
    misplaced = sorted(k for k in HEAD_ARGUMENTS if model_kwargs.pop(k, None) is not None)
    if misplaced:
        raise ValueError(f"suffix_generate drafts from text already written, without a head, and takes no "
                         f"{', '.join(misplaced)}: use hf_jetspec.jetspec_generate for a head's tree (with "
                         f"retrieval=True / a datastore to merge both), or pass the datastore as datastore=")
    return jetspec_generate(
        model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
        draft_head=None, tree_budget=tree_budget, tree_kernel=tree_kernel,
        retrieval=datastore if datastore is not None else True, retrieval_depth=retrieval_depth,
        calibration=calibration, node_cost=node_cost, calibration_log=calibration_log,
        online_calibration=online_calibration,
        token_streamer=token_streamer, generator=generator, **model_kwargs,
    )
