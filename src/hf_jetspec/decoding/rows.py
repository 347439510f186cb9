"""Batches: one single-sequence decoding call per row.

Speculative decoding follows one sequence (each row accepts a different number of tokens per step), so a batch of
B rows runs as B calls of the same loop, one after another, and the results are put together as ``generate()``
puts a batch together: ``num_return_sequences > 1`` (several samples of one prompt) and prompts of any lengths,
left-padded as decoder-only batches are. A padded row is decoded without its padding (its tokens keep the positions
``generate()`` gives them, counted from the first real token), while its logits processors and stopping criteria
see the padding put back (`LeftPadded`), so ``min_length``, ``min_new_tokens``, forced eos, length penalties and
``max_length`` count exactly as in the padded batch. Rows that stop early are filled with the pad token where an eos
token is set, and otherwise keep decoding to the batch's length (a row stopped by a custom criterion is decoded
again that far), as ``generate()`` does.
"""

from __future__ import annotations

import copy
import functools
import os
import traceback

import torch
from transformers import DynamicCache, MaxLengthCriteria, StaticCache, StoppingCriteriaList

from ..rope import rope_switch
from .common import check_target, warn_unused_assistant_settings


class LeftPadded:
    """A logits-processor or stopping-criteria list called with ``pad [1, p]`` (the row's left padding) put back in
    front of ``input_ids``: length-dependent members count as in the padded batch."""

    def __init__(self, inner, pad: torch.Tensor) -> None:
        self.inner, self.pad = inner, pad

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs):
        pad = self.pad.to(input_ids.device).expand(input_ids.shape[0], -1)
        return self.inner(torch.cat((pad, input_ids), dim=1), scores, **kwargs)


def per_row(sized_by: str):
    """Wrap a decoding loop (a ``custom_generate`` callable for batch size 1) so that it also takes batches:
    ``input_ids [B, T]`` (left-padded where ``attention_mask`` has zeros) -> the loop once per row -> ``[B, T + n]``,
    finished rows completed as ``generate()`` completes them. ``sized_by``: what sizes the loop's drafts, named
    when a call sets transformers' own assistant settings (`warn_unused_assistant_settings`)."""
    return functools.partial(_per_row, sized_by=sized_by)


def _per_row(loop, sized_by: str):
    @functools.wraps(loop)
    def generate_rows(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                      streamer=None, *args, **kwargs):
        check_target(model)
        warn_unused_assistant_settings(generation_config, sized_by)
        rows, mask = input_ids.shape[0], kwargs.get("attention_mask")
        padded = mask is not None and not bool((mask == 1).all())
        if (rows == 1 and not padded) or (generation_config.num_beams or 1) > 1:  # beams: the loop names them
            return loop(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                        streamer, *args, **kwargs)
        check_rows(generation_config, streamer, logits_processor, kwargs, rows)
        pads = left_padding(mask, rows)
        switch = rope_switch(model)
        if any(pads) and switch is not None and generation_config.max_length > switch.position:
            raise ValueError(f"A padded batch on {type(model).__name__}, whose RoPE frequencies change at position "
                             f"{switch.position}: generate() switches them for the whole batch at once (by its longest "
                             "row), which rows decoded one by one cannot reproduce; pass one prompt per call.")

        def run(i: int, criteria, max_length: int):
            p = pads[i]
            config = copy.deepcopy(generation_config)
            config.max_length, config.max_new_tokens = max_length - p, None
            view = input_ids[i : i + 1, :p]
            processors = row_processors(logits_processor, i, rows)
            processors = LeftPadded(processors, view) if p else processors
            criteria = LeftPadded(criteria, view) if p else criteria
            try:
                out = loop(model, input_ids[i : i + 1, p:], processors, criteria, config, synced_gpus, None, *args,
                           **row_kwargs(model, kwargs, i, rows, input_ids.shape[1], p))
            except (ValueError, RuntimeError, IndexError) as err:
                media = split_media(kwargs, rows, input_ids.shape[1])
                if media and raised_in_transformers(err):
                    raise ValueError(
                        f"Row {i} of the batch failed inside {type(model).__name__} ({err}). Its {', '.join(media)} "
                        "were split one entry per row, which is right only when every prompt holds exactly one "
                        "image or audio clip; pass one prompt per call.") from err
                raise
            return torch.cat((view, out), dim=1)

        outputs = [run(i, stopping_criteria, generation_config.max_length) for i in range(rows)]
        length = max(out.shape[1] for out in outputs)
        if not any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria or ()):
            # Without an eos token generate() pads no row: a row its criteria stopped keeps decoding until every
            # row has stopped. Decode such rows again to the batch's length (greedy: the same prefix).
            until = StoppingCriteriaList([MaxLengthCriteria(length)])
            outputs = [out if out.shape[1] == length else run(i, until, length) for i, out in enumerate(outputs)]
        return stack_rows(outputs, generation_config)

    return generate_rows


def check_rows(generation_config, streamer, logits_processor, kwargs: dict, rows: int) -> None:
    """Refuse, by name, what a row-by-row batch cannot reproduce (before any row is decoded)."""
    if streamer is not None or kwargs.get("token_streamer") is not None:
        raise ValueError("A streamer takes one unpadded sequence: pass one prompt (batch size 1, no padding) with a "
                         "streamer.")
    if any(type(p).__name__ == "SynthIDTextWatermarkLogitsProcessor" for p in logits_processor or ()):
        raise ValueError("SynthID watermarking with a batch or padding: its state covers the whole batch; pass one "
                         "prompt per call.")
    if any(type(p).__name__ == "PrefixConstrainedLogitsProcessor" for p in logits_processor or ()):
        raise ValueError("prefix_allowed_tokens_fn with a batch or padding: it is called with each row's batch index, "
                         "which a row-by-row batch does not keep; pass one prompt per call.")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if callable(getattr(cache, "get_seq_length", None)) and cache.get_seq_length():
        raise ValueError("Continuing from a filled cache with a batch or padding: the cache holds the whole batch's "
                         "earlier tokens, which rows decoded one by one cannot share; pass one prompt per call.")
    if getattr(generation_config, "return_dict_in_generate", False):
        raise ValueError("return_dict_in_generate=True with a batch or padding: the stats and scores of a speculative "
                         "call are per unpadded sequence; pass one prompt per call, without padding.")
    scale = getattr(generation_config, "guidance_scale", None)
    if scale is not None and scale != 1:
        raise ValueError(f"guidance_scale={scale} with a batch or padding: classifier-free guidance keeps one "
                         "unconditional cache for the whole batch; pass one prompt per call.")
    for key, value in kwargs.items():
        if key in ("cache", "past_key_values") or not holds_tensors(value):
            continue
        if not isinstance(value, torch.Tensor):  # e.g. transformers >= 5.25's mm_encoder_outputs (encoded images)
            raise ValueError(f"{key} with a batch or padding: it holds the whole batch's images or other inputs in one "
                             "structure that cannot be split by row; pass one prompt per call.")
        if value.dim() == 0:
            continue
        batch_dim = 1 if key == "position_ids" and value.dim() == 3 else 0  # multimodal RoPE: [3 or 4, B, T]
        if key.endswith("_grid_thw") or value.shape[batch_dim] != rows:
            raise ValueError(f"{key} with a batch or padding: its entries are not one per row (images or videos "
                             "flattened across the batch, as Qwen2-VL's processor gives them), so they cannot be "
                             "split by row; pass one prompt per call.")


def split_media(kwargs: dict, rows: int, length: int) -> list[str]:
    """The batch inputs `row_kwargs` splits one entry per row that are not per-position (images, audio features):
    their first dimension may count media items rather than rows."""
    return [key for key, value in kwargs.items()
            if isinstance(value, torch.Tensor) and value.dim() > 1 and value.shape[0] == rows
            and key not in ("attention_mask", "position_ids") and value.shape[1] != length]


def raised_in_transformers(err: BaseException) -> bool:
    """Whether ``err`` was raised inside transformers' code (a model's forward, maybe through a torch check), not
    by hf_jetspec."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if f"{os.sep}transformers{os.sep}" in frame.filename:
            return True
        if f"{os.sep}hf_jetspec{os.sep}" in frame.filename:
            return False
    return False


def holds_tensors(value) -> bool:
    """Whether ``value`` is a tensor or a dict / list / tuple with one somewhere inside."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(holds_tensors(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(holds_tensors(v) for v in value)


def row_processors(processors, row: int, rows: int):
    """``processors`` for row ``row``: members holding per-row tensors (the repetition penalty's
    ``prompt_ignore_length [B]``, which generate() fills with each row's padding length) get a copy holding that
    row's entry."""
    out = type(processors)() if isinstance(processors, list) else []
    for processor in processors or ():
        ignore = getattr(processor, "prompt_ignore_length", None)
        if isinstance(ignore, torch.Tensor) and ignore.dim() == 1 and ignore.shape[0] == rows:
            processor = copy.copy(processor)
            processor.prompt_ignore_length = ignore[row : row + 1]
        out.append(processor)
    return out


def left_padding(mask: torch.Tensor | None, rows: int) -> list[int]:
    """Each row's number of leading padding positions; ``ValueError`` for padding anywhere else (right padding, holes)
    or a row of padding only."""
    if mask is None or bool((mask == 1).all()):
        return [0] * rows
    pads = []
    for row in mask.long().tolist():
        p = row.index(1) if 1 in row else len(row)
        if p == len(row) or any(v != 1 for v in row[p:]) or any(v != 0 for v in row[:p]):
            raise ValueError("Padded inputs must be left-padded (zeros, then ones, in each attention_mask row, as "
                             "decoder-only generation expects), with at least one token per row.")
        pads.append(p)
    return pads


def row_kwargs(model, kwargs: dict, row: int, rows: int, length: int, pad: int) -> dict:
    """``kwargs`` for row ``row``: batch tensors sliced to that row (per-position ones without its ``pad`` leading
    positions), and a fresh empty cache of the kind ``generate()`` prepared (its own one belongs to the batch)."""
    out = {}
    for key, value in kwargs.items():
        if key in ("cache", "past_key_values") and value is not None:
            out[key] = fresh_cache(model, value)
        elif key == "position_ids" and isinstance(value, torch.Tensor) and value.dim() == 3:
            out[key] = value[:, row : row + 1, pad:]  # multimodal RoPE: [3 or 4, batch, length]
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
            value = value[row : row + 1]
            out[key] = value[:, pad:] if pad and value.dim() > 1 and value.shape[1] == length else value
        else:
            out[key] = value
    return out


def fresh_cache(model, cache):
    """An empty cache like ``cache`` (a StaticCache keeps its length); anything else is handed on unchanged for
    the loop's own cache check to name."""
    if cache.get_seq_length() != 0:
        return cache  # `check_rows` refused a filled cache
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
