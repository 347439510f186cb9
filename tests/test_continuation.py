"""Prefills that do not run the whole prompt in one forward. Continuing from a filled cache (a conversation's earlier
turns), as ``generate(input_ids, past_key_values=cache)`` does: the whole sequence goes in, the prefill runs only the
tokens after the cache, and every strategy returns plain greedy's tokens (plain sampling's, draw for draw); a cache an
hf_jetspec call returned continues the next turn. Chunked prefill (``prefill_chunk_size``): the prompt runs in
forwards of at most that many tokens, as in plain ``generate()``."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import transformers
from packaging.version import Version
from helpers import TARGET_FAMILIES, ScrambledOracle, assert_same_tokens, make_target
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache

import hf_jetspec
from hf_jetspec import JetSpecHead
from hf_jetspec.cache import cache_kwarg
from hf_jetspec.kernels import kernel_available
from hf_jetspec.outputs import OUTPUT_CACHE_FIELD

VOCAB = 128
# transformers < 5.21's chunked prefill ignores a filled cache (it runs the cached tokens again after it)
CHUNKS_AFTER_A_CACHE = Version(transformers.__version__) >= Version("5.21")
# generate()'s cache argument: `cache` from transformers 5.24 (`past_key_values` then warns), `past_key_values` before
CACHE = cache_kwarg(make_target("llama"))


def strategies(model, reference: torch.Tensor, seed: int) -> dict:
    """Every strategy as ``name -> generate() kwargs``; drafters that know ``reference`` draft it unreliably."""
    torch.manual_seed(seed)
    return {
        "jetspec-oracle": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=10, retrieval=False,
                               drafter=ScrambledOracle(reference, VOCAB, 6, seed=seed)),
        "jetspec-merged": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=True,
                               node_cost=None, drafter=ScrambledOracle(reference, VOCAB, 6, seed=seed)),
        "jetspec-head": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=8, node_cost=None,
                             draft_head=JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate, window=4),
        "speculative-jacobi": dict(custom_generate=hf_jetspec.speculative_jacobi_generate, draft_model=model),
    }


def filled_cache(model, ids: torch.Tensor, cached: int, kind: str):
    """A cache holding the first ``cached`` tokens of ``ids``, filled by one forward (``kind``: dynamic / static)."""
    cache = DynamicCache(config=model.config) if kind == "dynamic" else StaticCache(config=model.config,
                                                                                      max_cache_len=160)
    with torch.no_grad():
        model(ids[:, :cached], **{CACHE: cache}, use_cache=True)
    assert cache.get_seq_length() == cached
    return cache


@pytest.mark.parametrize("case", range(12))
def test_every_strategy_continues_a_filled_cache_like_plain_greedy(case):
    """Random targets, conversation lengths, cached counts (one token short of the input down to a few), new-token
    counts and cache kinds: each strategy, given its own copy of the filled cache, returns plain greedy's tokens."""
    rng = random.Random(case)
    model = make_target(TARGET_FAMILIES[case % 3], seed=case)
    ids = torch.randint(3, VOCAB, (1, rng.randint(4, 40)), generator=torch.Generator().manual_seed(case))
    cached = rng.choice([ids.shape[1] - 1, rng.randint(1, ids.shape[1] - 1)])
    kind = ("dynamic", "static")[case % 2]
    cache = filled_cache(model, ids, cached, kind)
    max_new = rng.randint(1, 40)
    plain = model.generate(ids, do_sample=False, max_new_tokens=max_new, **{CACHE: copy.deepcopy(cache)})
    assert_same_tokens(model.generate(ids, do_sample=False, max_new_tokens=max_new), plain, "[plain, no cache]")
    for name, kwargs in strategies(model, plain, seed=case).items():
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new, **{CACHE: copy.deepcopy(cache)},
                             **kwargs)
        assert_same_tokens(plain, out, f"[case {case} {kind} cached={cached}/{ids.shape[1]} {name}]")


@pytest.mark.parametrize("family", TARGET_FAMILIES)
def test_a_conversation_continues_from_the_cache_each_turn_returned(family):
    """Three turns, each decoded with a head (``assistant_model=``) from the cache the turn before returned (turns
    stop at an eos token mid-tree or at their length): every turn's tokens are plain greedy's on the whole
    conversation, and each returned cache holds every token but the last, as plain generate()'s does."""
    model = make_target(family, seed=7)
    hf_jetspec.enable(model)
    head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
    gen = torch.Generator().manual_seed(7)
    ids, cache = torch.randint(3, VOCAB, (1, 9), generator=gen), None
    for turn in range(3):
        free = model.generate(ids, do_sample=False, max_new_tokens=30)
        stop = int(free[0, ids.shape[1] + 5 + 4 * turn])  # a token the answer reaches
        kwargs = dict(do_sample=False, max_new_tokens=30, eos_token_id=stop)
        plain = model.generate(ids, **kwargs)
        out = model.generate(ids, assistant_model=head, return_dict_in_generate=True, **{CACHE: cache}, **kwargs)
        assert_same_tokens(plain, out.sequences, f"[{family} turn {turn}]")
        assert getattr(out, OUTPUT_CACHE_FIELD).get_seq_length() == out.sequences.shape[1] - 1
        user = torch.randint(3, VOCAB, (1, 4 + turn), generator=gen)
        ids, cache = torch.cat((out.sequences, user), dim=1), getattr(out, OUTPUT_CACHE_FIELD)


@pytest.mark.parametrize("seed", range(3))
def test_sampling_from_a_filled_cache_is_plain_sampling_draw_for_draw(seed):
    """With the same seed, JetSpec ("match"), suffix and Jacobi decoding from a filled cache return plain sampling's
    tokens from that cache."""
    model = make_target("qwen3", seed=seed)
    ids = torch.randint(3, VOCAB, (1, 14), generator=torch.Generator().manual_seed(seed))
    cache = filled_cache(model, ids, 10, "dynamic")
    kwargs = dict(do_sample=True, temperature=0.8, top_k=20, max_new_tokens=24)
    torch.manual_seed(seed)
    plain = model.generate(ids, **{CACHE: copy.deepcopy(cache)}, **kwargs)
    for name, extra in [("jetspec", dict(custom_generate=hf_jetspec.jetspec_generate, retrieval=False,
                                         drafter=ScrambledOracle(plain, VOCAB, 6, seed=seed))),
                        ("suffix", dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None)),
                        ("jacobi", dict(custom_generate=hf_jetspec.jacobi_generate))]:
        torch.manual_seed(seed)
        out = model.generate(ids, **{CACHE: copy.deepcopy(cache)}, **kwargs, **extra)
        assert_same_tokens(plain, out, f"[seed {seed} {name}]")


def tiny(model_type: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=512, initializer_range=0.2, pad_token_id=0, **extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model


def test_a_sliding_window_target_continues_from_its_own_cache_but_not_plain_generates():
    """Mistral with a window of 4: hf_jetspec's returned cache keeps every position, so the next turn continues
    losslessly; the cache plain generate() made (sliding layers, older keys dropped) is refused by name."""
    model = tiny("mistral", sliding_window=4)
    ids = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    first = model.generate(ids, do_sample=False, max_new_tokens=12, return_dict_in_generate=True,
                           custom_generate=hf_jetspec.suffix_generate)
    ids = torch.cat((first.sequences, torch.tensor([[5, 9, 11]])), dim=1)
    plain = model.generate(ids, do_sample=False, max_new_tokens=20)
    for name, kwargs in strategies(model, plain, seed=3).items():
        if name == "jetspec-head":
            continue  # covered on full-attention targets above
        out = model.generate(ids, do_sample=False, max_new_tokens=20, **{CACHE: copy.deepcopy(
            getattr(first, OUTPUT_CACHE_FIELD))}, **kwargs)
        assert_same_tokens(plain, out, f"[mistral {name}]")
    sliding = model.generate(first.sequences, do_sample=False, max_new_tokens=2, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="sliding-window layers"):
        model.generate(ids, do_sample=False, max_new_tokens=4, **{CACHE: getattr(sliding, OUTPUT_CACHE_FIELD)},
                       custom_generate=hf_jetspec.jacobi_generate)


def test_what_a_continuation_cannot_reproduce_is_refused_by_name():
    model = make_target("llama", seed=1)
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    run = dict(do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.suffix_generate)
    with pytest.raises(ValueError, match="holds 10 tokens but input_ids has 10"):
        model.generate(ids, **{CACHE: filled_cache(model, ids, 10, "dynamic")}, **run)
    with pytest.raises(ValueError, match="attention_mask covers 10 tokens and input_ids 6"):  # new tokens only
        model.generate(ids[:, 4:], attention_mask=torch.ones(1, 10, dtype=torch.long),
                       **{CACHE: filled_cache(model, ids, 4, "dynamic")}, **run)
    with pytest.raises(ValueError, match="filled cache with a batch"):
        model.generate(ids.repeat(2, 1), **{CACHE: filled_cache(model, ids.repeat(2, 1), 6, "dynamic")}, **run)
    small = StaticCache(config=model.config, max_cache_len=14)
    longer = torch.cat((ids, ids[:, :6]), dim=1)
    with pytest.raises(ValueError, match="StaticCache has room for 14 more positions but the prompt runs 16"):
        model.generate(longer, **{CACHE: copy.deepcopy(small)}, **run)
    filled = copy.deepcopy(small)
    with torch.no_grad():
        model(ids, **{CACHE: filled}, use_cache=True)
    with pytest.raises(ValueError, match="StaticCache has room for 4 more positions but the prompt runs 6"):
        model.generate(longer, **{CACHE: filled}, **run)
    for strategy in (hf_jetspec.suffix_generate, hf_jetspec.jacobi_generate):  # plain generate(): an IndexError
        with pytest.raises(ValueError, match=r"StaticCache is full \(14 positions\)"):
            model.generate(ids, **{CACHE: copy.deepcopy(small), **run, "max_new_tokens": 10,
                                   "custom_generate": strategy})
    dynamic = tiny("llama", rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0))
    with pytest.raises(ValueError, match="RoPE frequencies change"):
        dynamic.generate(ids, **{CACHE: filled_cache(dynamic, ids, 6, "dynamic")}, **run)


def test_a_multimodal_target_continues_without_a_cache_or_chunks_only():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, head_dim=8, sliding_window=5, pad_token_id=0)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    model = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=VOCAB - 1,
        boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)).eval()
    ids = torch.randint(3, VOCAB - 4, (1, 10), generator=torch.Generator().manual_seed(2))
    first = model.generate(ids, do_sample=False, max_new_tokens=3, return_dict_in_generate=True,
                           custom_generate=hf_jetspec.suffix_generate)
    with pytest.raises(ValueError, match="supported for text-only models; Gemma3ForConditionalGeneration"):
        model.generate(torch.cat((first.sequences, ids[:, :2]), dim=1), do_sample=False, max_new_tokens=3,
                       **{CACHE: getattr(first, OUTPUT_CACHE_FIELD)}, custom_generate=hf_jetspec.suffix_generate)
    with pytest.raises(ValueError, match="prefill_chunk_size on Gemma3ForConditionalGeneration, a multimodal model"):
        model.generate(ids, do_sample=False, max_new_tokens=3, prefill_chunk_size=4,
                       custom_generate=hf_jetspec.suffix_generate)


def forward_lengths(model) -> tuple[list[int], object]:
    """The token count of every forward of ``model`` (a hook on its first decoder layer: a head embeds its blocks
    with the target's embeddings) and the hook's handle."""
    lengths = []
    handle = model.model.layers[0].register_forward_hook(
        lambda m, a, out: lengths.append((out[0] if isinstance(out, tuple) else out).shape[1]))
    return lengths, handle


@pytest.mark.parametrize("case", range(6))
def test_a_chunked_prefill_runs_in_chunks_and_changes_no_token(case):
    """``prefill_chunk_size``: every strategy's first forwards are the chunks plain generate() runs (after a filled
    cache, when there is one), and its tokens are plain greedy's with the same setting."""
    rng = random.Random(case)
    model = make_target(TARGET_FAMILIES[case % 3], seed=30 + case)
    ids = torch.randint(3, VOCAB, (1, rng.randint(10, 40)), generator=torch.Generator().manual_seed(case))
    cached = rng.choice([0, rng.randint(1, 8)])
    chunk = rng.randint(2, 9)
    cache = filled_cache(model, ids, cached, "dynamic") if cached else None
    kwargs = dict(do_sample=False, max_new_tokens=rng.randint(5, 30), prefill_chunk_size=chunk)
    lengths, handle = forward_lengths(model)
    chunks = [min(chunk, ids.shape[1] - start) for start in range(cached, ids.shape[1], chunk)]
    if cached and not CHUNKS_AFTER_A_CACHE:  # nothing to compare with but the unchunked prefill
        plain = model.generate(ids, **{**kwargs, "prefill_chunk_size": None}, **{CACHE: copy.deepcopy(cache)})
    else:
        plain = model.generate(ids, **kwargs, **({CACHE: copy.deepcopy(cache)} if cached else {}))
        assert lengths[: len(chunks)] == chunks  # what plain generate() runs
    for name, extra in strategies(model, plain, seed=case).items():
        lengths.clear()
        out = model.generate(ids, **kwargs, **extra, **({CACHE: copy.deepcopy(cache)} if cached else {}))
        assert_same_tokens(plain, out, f"[case {case} chunk {chunk} cached {cached} {name}]")
        assert lengths[: len(chunks)] == chunks, (name, lengths[: len(chunks) + 1])
    handle.remove()


def test_a_chunked_prefill_hf_jetspec_cannot_split_is_refused_by_name():
    model = make_target("qwen3", seed=2)
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match=f"prefill_chunk_size must be a positive integer \\(or None\\), got {bad}"):
            model.generate(ids, prefill_chunk_size=bad, do_sample=False, max_new_tokens=3,
                           custom_generate=hf_jetspec.suffix_generate)
    with pytest.raises(ValueError, match="prefill_chunk_size with inputs_embeds"):
        model.generate(ids, inputs_embeds=model.get_input_embeddings()(ids), prefill_chunk_size=4, do_sample=False,
                       max_new_tokens=3, custom_generate=hf_jetspec.jacobi_generate)


def test_a_model_whose_input_preparation_ignores_the_cache_is_refused_by_name():
    """A ``prepare_inputs_for_generation`` that drops ``next_sequence_length`` would run the cached tokens again
    (plain ``generate()`` then returns other tokens than without a cache): refused, continuation and chunks alike."""
    from transformers import LlamaForCausalLM

    class Unsliced(LlamaForCausalLM):
        def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, **kwargs):
            return super().prepare_inputs_for_generation(input_ids, **kwargs)

    base = make_target("llama", seed=3)
    model = Unsliced(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.generation_config = base.generation_config
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    run = dict(do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.jacobi_generate)
    assert_same_tokens(base.generate(ids, do_sample=False, max_new_tokens=4), model.generate(ids, **run))
    with pytest.raises(ValueError, match="Unsliced's prepare_inputs_for_generation does not cut the input"):
        model.generate(ids, **{CACHE: filled_cache(model, ids, 5, "dynamic")}, **run)
    with pytest.raises(ValueError, match="8 instead of 4"):  # the second chunk
        model.generate(ids, prefill_chunk_size=4, **run)


@pytest.mark.skipif(not kernel_available("cpu"), reason="needs Triton imported with TRITON_INTERPRET=1 (conftest.py)")
def test_tree_steps_through_the_kernel_continue_a_filled_cache():
    """The Triton tree-attention kernel (interpreted here) attends to the cached turns as to any prefix."""
    model = make_target("qwen3", seed=13)
    ids = torch.randint(3, VOCAB, (1, 15), generator=torch.Generator().manual_seed(13))
    cache = filled_cache(model, ids, 7, "dynamic")
    plain = model.generate(ids, do_sample=False, max_new_tokens=20, **{CACHE: copy.deepcopy(cache)})
    out = model.generate(ids, do_sample=False, max_new_tokens=20, **{CACHE: copy.deepcopy(cache)},
                         custom_generate=hf_jetspec.jetspec_generate, retrieval=False, tree_budget=12,
                         drafter=ScrambledOracle(plain, VOCAB, 8, seed=13), tree_kernel=True,
                         return_dict_in_generate=True)
    assert_same_tokens(plain, out.sequences, "[kernel]")
    assert max(out.accept_lengths) > 1
