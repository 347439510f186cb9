"""Batches without padding: one single-sequence decoding call per row.

Speculative decoding follows one sequence (each row accepts a different number of tokens per step), so a batch of
B rows runs as B calls of the same loop, one after another, and the results are put together as ``generate()``
puts a batch together: rows that stop early are filled with the pad token where an eos token is set, and
otherwise keep decoding to the batch's length (a row stopped by a custom criterion is decoded again that far). That covers ``num_return_sequences > 1``
(several samples of one prompt) and prompts of equal length. A padded batch (prompts of different lengths) is
refused by the single-row check: a padded row's length-dependent processors (``min_length``, forced eos, length
penalties) count its padding, which the row-by-row loop would not reproduce exactly.
"""

from __future__ import annotations

import copy
import functools

import torch
from transformers import DynamicCache, MaxLengthCriteria, StaticCache, StoppingCriteriaList



def per_row(loop):
    """Wrap a decoding loop (a ``custom_generate`` callable for batch size 1) so that it also takes batches
    without padding: ``input_ids [B, T]`` -> the loop once per row -> ``[B, T + n]``, finished rows completed as
    ``generate()`` completes them (pad tokens, or more decoding where no eos token is set)."""

    @functools.wraps(loop)
    def generate_rows(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                      streamer=None, *args, **kwargs):
        rows = input_ids.shape[0]
        if rows == 1 or (generation_config.num_beams or 1) > 1:  # beams: the loop names them
            return loop(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                        streamer, *args, **kwargs)
        check_rows(generation_config, streamer, logits_processor, kwargs)
        def run(i, criteria, config):
            return loop(model, input_ids[i : i + 1], logits_processor, criteria, config, synced_gpus, None, *args,
                        **row_kwargs(model, kwargs, i, rows))

        outputs = [run(i, stopping_criteria, generation_config) for i in range(rows)]
        length = max(out.shape[1] for out in outputs)
        if not any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria or ()):
            # Without an eos token generate() pads no row: a row its criteria stopped keeps decoding until every
            # row has stopped. Decode such rows again to the batch's length (greedy: the same prefix).
            config = copy.deepcopy(generation_config)
            config.max_length, config.max_new_tokens = length, None
            until = StoppingCriteriaList([MaxLengthCriteria(length)])
            outputs = [out if out.shape[1] == length else run(i, until, config) for i, out in enumerate(outputs)]
        return stack_rows(outputs, generation_config)

    return generate_rows


def check_rows(generation_config, streamer, logits_processor, kwargs: dict) -> None:
    """Refuse, by name, what a row-by-row batch cannot reproduce (before any row is decoded)."""
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("Padded inputs are not supported (prompts of different lengths in one batch): pass each "
                         "prompt on its own, without padding.")
    if streamer is not None or kwargs.get("token_streamer") is not None:
        raise ValueError("A streamer takes one sequence: pass one prompt (batch size 1) with a streamer.")
    if any(type(p).__name__ == "PrefixConstrainedLogitsProcessor" for p in logits_processor or ()):
        raise ValueError("prefix_allowed_tokens_fn with a batch: it is called with each row's batch index, which a "
                         "row-by-row batch does not keep; pass one prompt per call.")
    if getattr(generation_config, "return_dict_in_generate", False):
        raise ValueError("return_dict_in_generate=True with a batch: the stats and scores of a speculative call are "
                         "per sequence; pass one prompt per call.")
    scale = getattr(generation_config, "guidance_scale", None)
    if scale is not None and scale != 1:
        raise ValueError(f"guidance_scale={scale} with a batch: classifier-free guidance keeps one unconditional cache "
                         "for the whole batch; pass one prompt per call.")


def row_kwargs(model, kwargs: dict, row: int, rows: int) -> dict:
    """``kwargs`` for row ``row``: batch tensors sliced to that row, and a fresh empty cache of the kind
    ``generate()`` prepared (its own one belongs to the whole batch)."""
    out = {}
    for key, value in kwargs.items():
        if key in ("cache", "past_key_values") and value is not None:
            out[key] = fresh_cache(model, value)
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
            out[key] = value[row : row + 1]
        else:
            out[key] = value
    return out


def fresh_cache(model, cache):
    """An empty cache like ``cache`` (a StaticCache keeps its length); anything else is handed on unchanged for
    the loop's own cache check to name."""
    if cache.get_seq_length() != 0:
        return cache  # the loop refuses a filled cache
    if isinstance(cache, StaticCache):  # the longest layer: sliding ones hold min(window, length)
        length = max(getattr(layer, "max_cache_len", 0) or 0 for layer in cache.layers)
        return StaticCache(config=model.config, max_cache_len=length)
    if type(cache) is DynamicCache:
        return DynamicCache(config=model.config)
    return cache


def stack_rows(outputs: list[torch.Tensor], generation_config) -> torch.Tensor:
    """``[B, max T_i]`` from B sequences ``[1, T_i]``, shorter ones filled with the pad token."""
    length = max(out.shape[1] for out in outputs)
    if any(out.shape[1] < length for out in outputs):
        pad = getattr(generation_config, "_pad_token_tensor", None)
        pad = generation_config.pad_token_id if pad is None else int(pad.reshape(-1)[0])
        if pad is None:
            raise ValueError("Rows stopped at different lengths and no pad_token_id fills the shorter ones.")
    else:
        pad = 0
    batch = outputs[0].new_full((len(outputs), length), pad)
    for i, out in enumerate(outputs):
        batch[i, : out.shape[1]] = out[0]
    return batch
