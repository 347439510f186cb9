"""Batches (`hf_jetspec.decoding.rows`): equal-length and left-padded prompts and ``num_return_sequences`` run the
loop once per row and return what plain batched ``generate()`` returns, finished rows completed as it completes
them; what a row-by-row batch cannot reproduce is refused by name."""

from __future__ import annotations

import pytest
import torch
from helpers import TARGET_FAMILIES, ScrambledOracle, StopAfterToken, assert_same_tokens, make_target
from transformers import StoppingCriteriaList, SynthIDTextWatermarkingConfig

import hf_jetspec
from hf_jetspec import JetSpecHead

ROWS, LENGTH, NEW, PAD = 3, 8, 30, 0


def batch_and_eos(family: str, seed: int):
    """A target, ``ROWS`` prompts of one length, and an eos token row 0 emits early while another row does not (so
    rows stop at different steps)."""
    model = make_target(family, seed=seed)
    prompts = torch.randint(3, 128, (ROWS, LENGTH), generator=torch.Generator().manual_seed(seed))
    free = model.generate(prompts, do_sample=False, max_new_tokens=NEW, pad_token_id=PAD)
    new = free[:, LENGTH:].tolist()
    eos = next(t for t in new[0][3:] if any(t not in row for row in new[1:]))
    return model, prompts, eos


def strategies(model, reference: torch.Tensor):
    head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
    return {
        "jetspec-head": dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head),
        "jetspec-oracle-static": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=False,
                                      drafter=ScrambledOracle(reference[0], 128, 6), cache_implementation="static"),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate, ngram_pool=2),
        "speculative-jacobi": dict(custom_generate=hf_jetspec.speculative_jacobi_generate,
                                   draft_model=make_target("llama", seed=9, layers=1)),
        "assistant": dict(assistant_model=head),
    }


@pytest.mark.parametrize("family", TARGET_FAMILIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_equal_length_batch_is_plain_batched_greedy(family, seed):
    model, prompts, eos = batch_and_eos(family, seed)
    kwargs = dict(do_sample=False, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=PAD)
    reference = model.generate(prompts, **kwargs)
    lengths = [int((row != PAD).sum()) for row in reference]  # the row that hit eos is padded
    assert reference.shape == (ROWS, LENGTH + NEW) and min(lengths) < LENGTH + NEW
    hf_jetspec.enable(model)
    for name, extra in strategies(model, reference).items():
        out = model.generate(prompts, **kwargs, **extra)
        assert out.shape == reference.shape, name
        for row in range(ROWS):
            assert_same_tokens(reference[row : row + 1], out[row : row + 1], f"[{family} {name} row {row}]")


def test_custom_stopping_criteria_stop_rows_independently():
    model, prompts, eos = batch_and_eos("qwen3", 2)
    kwargs = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=PAD,
                  stopping_criteria=StoppingCriteriaList([StopAfterToken(eos)]))
    reference = model.generate(prompts, **kwargs)
    out = model.generate(prompts, custom_generate=hf_jetspec.suffix_generate, node_cost=None, **kwargs)
    assert_same_tokens(reference, out)


def test_rows_that_end_together_need_no_pad_token():
    model = make_target("llama", seed=3)
    model.generation_config.pad_token_id = None
    prompts = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(3))
    reference = model.generate(prompts, do_sample=False, max_new_tokens=12)
    assert_same_tokens(reference, model.generate(prompts, do_sample=False, max_new_tokens=12,
                                                 custom_generate=hf_jetspec.jacobi_generate))


def left_padded(lengths: list[int], seed: int, vocab: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of random prompts of ``lengths`` (pad id 0) and its attention mask."""
    generator, width = torch.Generator().manual_seed(seed), max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(3, vocab, (n,), generator=generator)
        mask[row, width - n :] = 1
    return ids, mask


@pytest.mark.parametrize("family", TARGET_FAMILIES)
@pytest.mark.parametrize("settings", [
    dict(),
    dict(min_length=25, eos_token_id=7),  # counts the padding
    dict(min_new_tokens=12, eos_token_id=9, repetition_penalty=1.3),  # the penalty ignores each row's padding
    dict(forced_eos_token_id=5, no_repeat_ngram_size=2),  # forced at the padded batch's max_length
    dict(exponential_decay_length_penalty=(4, 1.6), eos_token_id=11),
])
def test_left_padded_batch_is_plain_padded_batched_greedy(family, settings):
    """Rows decoded without their padding; processors and stopping criteria see it put back, so every
    length-dependent one counts as in the padded batch."""
    model = make_target(family, seed=5)
    ids, mask = left_padded([9, 4, 7, 1], seed=5)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=PAD, **settings)
    reference = model.generate(ids, **kwargs)
    hf_jetspec.enable(model)
    for name, extra in strategies(model, reference[:, ids.shape[1]:]).items():
        out = model.generate(ids, **kwargs, **extra)
        assert out.shape == reference.shape, name
        for row in range(ids.shape[0]):
            assert_same_tokens(reference[row : row + 1], out[row : row + 1], f"[{family} {settings} {name} row {row}]")


def test_one_padded_prompt():
    model = make_target("llama", seed=6)
    ids, mask = left_padded([5, 8], seed=6)
    reference = model.generate(ids[:1], attention_mask=mask[:1], do_sample=False, max_new_tokens=NEW)
    out = model.generate(ids[:1], attention_mask=mask[:1], do_sample=False, max_new_tokens=NEW,
                         custom_generate=hf_jetspec.jacobi_generate)
    assert_same_tokens(reference, out)


def test_padded_batch_across_a_rope_switch_is_refused():
    """Phi-3's longrope switches for the whole padded batch at once (by its longest row): refused by name when the
    generation reaches the switch; an equal-length batch is exact."""
    from test_architectures import ROPE, VOCAB, make

    model = make(ROPE["longrope"][0], seed=2, **ROPE["longrope"][1])
    ids, mask = left_padded([6, 3], seed=2, vocab=VOCAB)
    with pytest.raises(ValueError, match="RoPE frequencies change at position 16"):
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                       custom_generate=hf_jetspec.jacobi_generate)
    short = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                           custom_generate=hf_jetspec.jacobi_generate)  # ends before the switch
    assert_same_tokens(model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8), short)


def test_what_a_row_by_row_batch_cannot_reproduce_is_refused():
    model = make_target("qwen3", seed=4)
    prompts = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(4))
    call = dict(do_sample=False, max_new_tokens=5, custom_generate=hf_jetspec.suffix_generate)
    mask = torch.ones_like(prompts)
    mask[1, -2:] = 0  # right padding
    with pytest.raises(ValueError, match="must be left-padded"):
        model.generate(prompts, attention_mask=mask, **call)
    with pytest.raises(ValueError, match="must be left-padded"):
        model.generate(prompts, attention_mask=torch.zeros_like(prompts), **call)
    with pytest.raises(ValueError, match="SynthID watermarking with a batch"):
        model.generate(prompts, watermarking_config=SynthIDTextWatermarkingConfig(keys=[5, 6, 7], ngram_len=2), **call)
    with pytest.raises(ValueError, match="return_dict_in_generate=True with a batch"):
        model.generate(prompts, return_dict_in_generate=True, **call)
    with pytest.raises(ValueError, match="guidance_scale=1.5 with a batch"):
        model.generate(prompts, guidance_scale=1.5, **call)
    with pytest.raises(ValueError, match="prefix_allowed_tokens_fn with a batch"):
        model.generate(prompts, prefix_allowed_tokens_fn=lambda batch_id, ids: list(range(128)), **call)
    with pytest.raises(ValueError, match="streamer takes one unpadded sequence"):
        model.generate(prompts, token_streamer=object(), **call)
    with pytest.raises(ValueError, match="Beam search"):
        model.generate(prompts, num_beams=2, **call)
    # One row of each of those is fine.
    out = model.generate(prompts[:1], return_dict_in_generate=True, guidance_scale=1.5, **call)
    assert out.sequences.shape == (1, 11)
