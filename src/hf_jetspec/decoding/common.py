"""Call validation and prefill, shared by the decoding loops (batch size 1)."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version
from transformers.utils import HF_MODULES_CACHE

from ..attention import check_target, sliding_window
from ..cache import check_cache, full_layers, room_left
from ..config import cross_attention_layers
from ..rope import rope_switch


def validate_call(model, input_ids: torch.Tensor, generation_config, synced_gpus: bool, model_kwargs: dict):
    """Check what the single-sequence loops support; return the cache ``generate()`` prepared (checked)."""
    if (generation_config.num_beams or 1) > 1:  # first: generate() expands the batch to num_beams rows
        raise ValueError(f"Beam search is not supported by hf_jetspec decoding (num_beams="
                         f"{generation_config.num_beams}): speculative decoding follows one sequence; use num_beams=1.")
    other = other_decoding_method(generation_config)
    if other:
        raise ValueError(f"{other} is a different decoding method: hf_jetspec decoding reproduces greedy decoding "
                         "(do_sample=False) or sampling (do_sample=True) exactly. Remove it, or run generate() "
                         "without hf_jetspec.")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"A decoding session follows one sequence; got batch size {input_ids.shape[0]}. The decoding loops take "
            "batches row by row (hf_jetspec.decoding.rows.per_row)."
        )
    if input_ids.shape[1] == 0:
        if model_kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds without input_ids is not supported by hf_jetspec decoding (the drafters "
                             "read the prompt's tokens): pass input_ids (with inputs_embeds if the embeddings differ "
                             "from the token embeddings).")
        raise ValueError("The prompt is empty: give at least one token.")
    check_token_ids(model, input_ids, model_kwargs)
    if synced_gpus:
        raise ValueError("synced_gpus is not supported by hf_jetspec decoding.")
    if getattr(generation_config, "output_attentions", False) or getattr(generation_config, "output_hidden_states", False):
        raise ValueError("output_attentions / output_hidden_states are not supported by hf_jetspec decoding.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("Padded inputs are not supported (a padded prompt, or prompts of different lengths in one "
                         "batch): pass each prompt on its own, without padding.")
    check_target(model)
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is None or not model_kwargs.get("use_cache", True):
        raise ValueError("hf_jetspec decoding needs the KV cache, but use_cache is False (passed to generate(), or "
                         "the default of the model's generation_config / config): pass use_cache=True.")
    if getattr(cache, "offloading", False):
        raise ValueError("Offloaded caches are not supported by hf_jetspec decoding.")
    check_cache(full_layers(cache, sliding_window(model)[0], getattr(generation_config, "max_length", None)))
    cached = int(cache.get_seq_length())
    if cached:
        check_continuation(model, input_ids, cached, model_kwargs, generation_config)
    room = room_left(cache, cached)
    if room is not None and room < input_ids.shape[1] - cached:
        raise ValueError(f"The StaticCache has room for {room} more positions but the prompt runs "
                         f"{input_ids.shape[1] - cached}: pass a longer one (max_cache_len) or a DynamicCache.")
    return cache


def check_token_ids(model, input_ids: torch.Tensor, model_kwargs: dict) -> None:
    """Refuse, by name, ``input_ids`` that are not token ids of this target (plain ``generate()`` fails inside the
    embedding lookup): floating-point or bool tensors, and, when the embeddings come from ``input_ids``, ids outside
    the embedding table."""
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got a {input_ids.dtype} tensor")
    if model_kwargs.get("inputs_embeds") is not None:
        return
    rows = model.get_input_embeddings().weight.shape[0]
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= rows:
        raise ValueError(f"input_ids holds token id {low if low < 0 else high}, outside the target's embedding "
                         f"table [0, {rows}): ids from another tokenizer, or an unset pad id (-1, -100)?")


def composite(model) -> bool:
    """Whether ``model``'s config nests a text config (a multimodal model: its prefill depends on encoded media)."""
    return model.config.get_text_config() is not model.config


def check_continuation(model, input_ids: torch.Tensor, cached: int, model_kwargs: dict, generation_config) -> None:
    """A call continuing from a cache that already holds ``cached`` tokens (a conversation's earlier turns): as in
    ``generate()``, ``input_ids`` is the whole sequence, those tokens included, and the prefill runs the rest. Refuse
    what that cannot reproduce, by name."""
    length = input_ids.shape[1]
    if cached >= length:
        raise ValueError(f"The cache already holds {cached} tokens but input_ids has {length}: pass the whole "
                         "sequence (the cached tokens, then at least one new token) as input_ids.")
    mask = model_kwargs.get("attention_mask")  # transformers >= 5.2x drops an all-ones mask and keeps its length
    mask_length = mask.shape[-1] if mask is not None else getattr(generation_config, "_mask_length", None)
    if mask_length not in (None, -1, length):
        raise ValueError(f"attention_mask covers {mask_length} tokens and input_ids {length}: when continuing from "
                         "a filled cache, pass the whole sequence (cached tokens included) as input_ids, with a mask "
                         "of the same length.")
    if composite(model) or cross_attention_layers(model):
        raise ValueError(f"Continuing from a filled cache is supported for text-only models; {type(model).__name__} "
                         "is multimodal (its position ids and cross-attention depend on the earlier turns' inputs): "
                         "pass the whole conversation without a cache.")
    if rope_switch(model) is not None:
        raise ValueError(f"Continuing from a filled cache on {type(model).__name__}, whose RoPE frequencies change "
                         "with the sequence length (the cached keys may have been rotated the other way): pass the "
                         "whole conversation without a cache.")


def other_decoding_method(generation_config) -> str | None:
    """The generate() option that would select a decoding method other than greedy or sampling (contrastive
    search, DoLa, constrained beam search), or None. ``custom_generate`` replaces generate()'s own dispatch, so
    without this check such a call would silently return plain greedy tokens."""
    get = lambda name: getattr(generation_config, name, None)  # noqa: E731 (fields differ across versions)
    if get("constraints") is not None or get("force_words_ids") is not None:
        return "constraints / force_words_ids (constrained beam search)"
    if not get("do_sample") and (get("penalty_alpha") or 0) > 0 and (get("top_k") or 0) > 1:
        return f"penalty_alpha={get('penalty_alpha')} with top_k={get('top_k')} (contrastive search)"
    if get("dola_layers") is not None:
        return f"dola_layers={get('dola_layers')!r} (DoLa decoding)"
    return None


# generation-config settings of transformers' own assistants (draft model, prompt lookup, early exit); the loops
# size their drafts by their own arguments instead
ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
                      "assistant_lookbehind", "target_lookbehind", "prompt_lookup_num_tokens",
                      "max_matching_ngram_size", "assistant_early_exit")
# where a call passes on its way from the user's line to a loop: hf_jetspec, transformers, torch (generate()'s
# no_grad wrapper) and the modules transformers loads for custom_generate="<repo or folder>"
_LIBRARIES = (*(os.path.dirname(os.path.abspath(path)) + os.sep
                for path in (os.path.dirname(__file__), transformers.__file__, torch.__file__)),
              os.path.abspath(HF_MODULES_CACHE) + os.sep)


def warn_unused_assistant_settings(generation_config, sized_by: str) -> None:
    """A `UserWarning` naming transformers' assistant settings set on ``generation_config`` to anything but
    generate()'s defaults (which fill every unset field, transformers >= 5.0): no hf_jetspec loop reads them, and
    dropping e.g. ``num_assistant_tokens=5`` silently would look like it took effect. ``sized_by`` says what sizes
    the loop's drafts instead. Shown at the user's own line (Python's default filter: once per line)."""
    defaults = getattr(type(generation_config), "_get_default_generation_params", dict)()
    unused = {k: v for k in ASSISTANT_SETTINGS
              if (v := getattr(generation_config, k, None)) is not None and v != defaults.get(k)}
    if unused:
        settings = ", ".join(f"{k}={v!r}" for k, v in unused.items())
        warnings.warn(f"{settings}: {'a setting' if len(unused) == 1 else 'settings'} of transformers' own "
                      f"assistants, which hf_jetspec's decoding does not read (ignored). {sized_by}",
                      UserWarning, stacklevel=caller_stacklevel())


def caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, seen from the function calling this one, of the first frame outside
    hf_jetspec, transformers and torch: the user's call, however many library frames lie between."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return level


# Inputs with a row per token that generate() extends by repeating the last row for every new token (Mllama's
# `_update_model_kwargs_for_generation`): [B, T, ...] -> [B, T + 1, ...].
ROW_REPEATED_INPUTS = ("cross_attention_mask",)
# transformers 5.17's Mllama forward takes the whole sequence's rows and picks the forward's by cache position;
# from 5.18 on it takes the forward's own rows.
_ROWS_FROM_START = Version(transformers.__version__) < Version("5.18")


@dataclass(frozen=True)
class TokenRows:
    """The per-token inputs of a decoding step: ``rows {name: [1, 1, ...]}``, the row of the prompt's last token,
    which ``generate()`` repeats for every generated token."""

    rows: dict

    def for_forward(self, prefix_len: int, count: int) -> dict:
        """The inputs of a forward over ``count`` new tokens after ``prefix_len`` cached ones (``[1, count, ...]``;
        ``[1, prefix_len + count, ...]`` where the model slices them itself)."""
        length = count + (prefix_len if _ROWS_FROM_START else 0)
        return {name: row.expand(row.shape[0], length, *row.shape[2:]) for name, row in self.rows.items()}


def token_row_inputs(model_kwargs: dict) -> TokenRows | None:
    """The `TokenRows` of ``model_kwargs`` (what ``generate()`` handed the decoding method), None without any."""
    rows = {name: value[:, -1:] for name in ROW_REPEATED_INPUTS
            if isinstance(value := model_kwargs.get(name), torch.Tensor) and value.dim() >= 2}
    return TokenRows(rows) if rows else None


def prefill(model, input_ids: torch.Tensor, model_kwargs: dict, chunk_size: int | None = None,
            after_forward=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the prompt through the target exactly as ``generate()`` does; return the last logits ``[1, V]`` (fp32)
    and the position ids the last forward ran with (``[..., 1, n]``; None where the model made its own).

    ``model_kwargs`` is what ``generate()`` handed to the decoding method (cache included); it is not modified.
    Only the tokens after a filled cache run. ``chunk_size`` (``generation_config.prefill_chunk_size``): they run
    in forwards of at most that many tokens, as ``generate()``'s chunked prefill does (a long prompt's activations
    then never exceed one chunk's); ``after_forward()`` is called after each forward.
    """
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    cached, length = (int(cache.get_seq_length()) if cache is not None else 0), input_ids.shape[1]
    if chunk_size is not None and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"prefill_chunk_size must be a positive integer (or None), got {chunk_size!r}")
    size = chunk_size or length
    if size < length - cached:
        check_chunking(model, model_kwargs)
    for start in range(cached, length, size):
        end = min(start + size, length)
        kwargs = model_kwargs if (start, end) == (0, length) else chunk_inputs(model_kwargs, end, end - start)
        inputs = model.prepare_inputs_for_generation(input_ids[:, :end], is_first_iteration=True, **kwargs)
        if kwargs is not model_kwargs:
            check_sliced(model, inputs, end - start)
        for key in ("cache", "past_key_values"):
            if model_kwargs.get(key) is not None and inputs.get(key) is None:
                # The model dropped the (still empty) cache, as Phi-3 does for a prompt past its longrope switch:
                # generate() then takes the cache the forward creates; the loops keep theirs, so fill that one.
                inputs[key] = model_kwargs[key]
        out = model(**inputs, return_dict=True)
        if after_forward is not None:
            after_forward()
    return out.logits[:, -1].to(dtype=torch.float32, copy=True), inputs.get("position_ids")


def chunk_inputs(model_kwargs: dict, end: int, count: int) -> dict:
    """``model_kwargs`` for a prefill forward over the ``count`` tokens before ``end`` (the cache holds the rest):
    per-token inputs cut at ``end``, and ``next_sequence_length`` for ``prepare_inputs_for_generation`` to take the
    last ``count``, as ``generate()``'s prefill does."""
    kwargs = {**model_kwargs, "next_sequence_length": count}
    for key in ("attention_mask", "position_ids", "token_type_ids"):
        if isinstance(kwargs.get(key), torch.Tensor):
            kwargs[key] = kwargs[key][..., :end]
    return kwargs


def check_sliced(model, inputs: dict, count: int) -> None:
    """Raise ``ValueError`` unless the model's ``prepare_inputs_for_generation`` kept only the last ``count`` tokens
    (a model whose own version ignores ``next_sequence_length`` would run the cached tokens again)."""
    fed = next((inputs[k] for k in ("input_ids", "inputs_embeds") if isinstance(inputs.get(k), torch.Tensor)), None)
    if fed is not None and fed.shape[1] != count:
        raise ValueError(f"{type(model).__name__}'s prepare_inputs_for_generation does not cut the input to the "
                         f"tokens after the cache ({fed.shape[1]} instead of {count}): continuing from a filled cache "
                         "and chunked prefill are not supported for it; pass the whole prompt without a cache or "
                         "prefill_chunk_size.")


def check_chunking(model, model_kwargs: dict) -> None:
    """Refuse, by name, a chunked prefill hf_jetspec does not split as ``generate()`` does."""
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("prefill_chunk_size with inputs_embeds: the chunked prefill splits token ids; pass input_ids "
                         "only, or no prefill_chunk_size.")
    if composite(model):
        raise ValueError(f"prefill_chunk_size on {type(model).__name__}, a multimodal model (generate() splits its "
                         "encoded images and audio between chunks): pass no prefill_chunk_size.")
