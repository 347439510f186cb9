"""generate() integration: custom_generate and assistant_model routes, streamers, logits processors, stopping
criteria, returned scores, caches, attention implementations and clear errors."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import transformers
from helpers import ScrambledOracle, StopAfterToken, assert_same_tokens, greedy_reference, jetspec, make_target
from transformers import StoppingCriteriaList, SynthIDTextWatermarkingConfig, WatermarkingConfig
from transformers.generation.streamers import BaseStreamer

import hf_jetspec
from hf_jetspec import JetSpecHead, OracleDrafter
from hf_jetspec.attention import plan_tree_attention

PROMPT = torch.tensor([[5, 17, 33, 9, 71, 4]])


class Recorder(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_assistant_model_route(family):
    model = make_target(family)
    head = JetSpecHead.for_target(model, block_size=8, tree_budget=16)
    reference = greedy_reference(model, PROMPT, max_new_tokens=30)
    with pytest.raises(AttributeError, match="enable"):
        model.generate(PROMPT, max_new_tokens=30, do_sample=False, assistant_model=head)
    assert hf_jetspec.enable(model) is model and hf_jetspec.enable(model) is model
    assert type(model).__name__ == type(make_target(family)).__name__
    out = model.generate(PROMPT, max_new_tokens=30, do_sample=False, assistant_model=head,
                         return_dict_in_generate=True)
    assert_same_tokens(reference, out.sequences)
    assert sum(out.accept_lengths) + 1 == reference.shape[1] - PROMPT.shape[1]
    # An ordinary assistant model keeps transformers' own assisted decoding.
    assistant = make_target(family, seed=5)
    assert_same_tokens(reference, model.generate(PROMPT, max_new_tokens=30, do_sample=False, assistant_model=assistant))


def test_assistant_settings_a_head_does_not_read_are_named(recwarn):
    """transformers' assistant settings (`num_assistant_tokens`, prompt lookup's, ...) do not size a head's tree:
    the head route says so instead of dropping them silently, and stays silent when none was asked for (generate()
    fills every unset one with its default)."""
    model = hf_jetspec.enable(make_target("llama"))
    head = JetSpecHead.for_target(model, block_size=6, tree_budget=8)
    reference = greedy_reference(model, PROMPT, max_new_tokens=12)
    assert_same_tokens(reference, model.generate(PROMPT, max_new_tokens=12, do_sample=False, assistant_model=head))
    assert not [w for w in recwarn if "JetSpecHead does not read" in str(w.message)]
    for settings, named in [({"num_assistant_tokens": 5}, "num_assistant_tokens=5: a setting"),
                            ({"assistant_confidence_threshold": 0.1, "prompt_lookup_num_tokens": 3},
                             "assistant_confidence_threshold=0.1, prompt_lookup_num_tokens=3: settings")]:
        with pytest.warns(UserWarning, match=f"{named} .*the head's config.tree_budget") as caught:
            out = model.generate(PROMPT, max_new_tokens=12, do_sample=False, assistant_model=head, **settings)
        assert_same_tokens(reference, out)
        assert [w.filename for w in caught if "does not read" in str(w.message)] == [__file__]  # the user's line


@pytest.mark.parametrize("strategy", ["jetspec", "suffix", "jacobi", "speculative-jacobi"])
def test_assistant_settings_are_named_on_every_custom_generate_loop(strategy, recwarn):
    """The same settings passed with ``custom_generate=`` (transformers puts them on the generation config and
    calls the loop anyway) are named once per call, a batch included, at the caller's line, with what sizes that
    loop's drafts; the tokens stay plain greedy's."""
    model = make_target("llama")
    loop = {"jetspec": dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=JetSpecHead.for_target(model)),
            "suffix": dict(custom_generate=hf_jetspec.suffix_generate),
            "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate),
            "speculative-jacobi": dict(custom_generate=hf_jetspec.speculative_jacobi_generate,
                                       draft_model=make_target("llama", seed=9, layers=1))}[strategy]
    sized_by = {"jetspec": "tree_budget=", "suffix": "tree_budget=", "jacobi": "window=",
                "speculative-jacobi": "num_draft_tokens="}[strategy]
    prompts = torch.cat([PROMPT, PROMPT.flip(1)])
    reference = greedy_reference(model, prompts, max_new_tokens=10)
    assert_same_tokens(reference, model.generate(prompts, max_new_tokens=10, do_sample=False, **loop))
    assert not [w for w in recwarn if "does not read" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning raised, not once per line
        out = model.generate(prompts, max_new_tokens=10, do_sample=False, prompt_lookup_num_tokens=3, **loop)
    assert_same_tokens(reference, out)
    named = [w for w in caught if "does not read" in str(w.message)]
    assert len(named) == 1 and named[0].filename == __file__, [(str(w.message), w.filename) for w in caught]
    assert str(named[0].message).startswith("prompt_lookup_num_tokens=3: a setting") and sized_by in str(
        named[0].message)


def test_enable_touches_only_that_instance():
    a, b = make_target("qwen3"), make_target("qwen3")
    hf_jetspec.enable(a)
    assert type(a) is not type(b) and isinstance(a, type(b))
    head = JetSpecHead.for_target(b)
    with pytest.raises(AttributeError, match="enable"):
        b.generate(PROMPT, max_new_tokens=3, do_sample=False, assistant_model=head)


def test_the_enable_hint_ends_the_error_a_user_sees():
    """Uncaught, Python printed its own suggestion after the hint ("... draft_head=head)`.. Did you mean:
    'generation_config_class'?"), pointing at an attribute that is no fix."""
    script = (
        "import torch, transformers, hf_jetspec\n"
        "config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,"
        " num_attention_heads=2, num_key_value_heads=2)\n"
        "model = transformers.LlamaForCausalLM(config)\n"
        "head = hf_jetspec.JetSpecHead.for_target(model)\n"
        "model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False, assistant_model=head)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last.startswith("AttributeError: JetSpecHead is a draft head"), run.stderr[-2000:]
    assert last.endswith("draft_head=head)`."), last


def test_assistant_route_returns_several_sequences():
    """`num_return_sequences > 1` through `assistant_model=head`: generate()'s own check for assisted decoding ("has
    to be 1") refused it, though the head route decodes any number of rows. Now it draws exactly what the
    custom_generate route draws with the same seed."""
    model = hf_jetspec.enable(make_target("llama", seed=6))
    head = JetSpecHead.for_target(model, block_size=6)
    outs = []
    for route in ({"assistant_model": head}, {"custom_generate": hf_jetspec.jetspec_generate, "draft_head": head}):
        torch.manual_seed(3)
        outs.append(model.generate(PROMPT, max_new_tokens=12, do_sample=True, num_return_sequences=3, **route))
    assert outs[0].shape == (3, PROMPT.shape[1] + 12) and torch.equal(outs[0], outs[1])
    assert len({tuple(row.tolist()) for row in outs[0]}) > 1  # three draws, not one row repeated


def test_an_enabled_model_pickles_and_copies(tmp_path):
    """torch.save / pickle of an enabled model failed: pickle finds a class by name, and the enabled subclass shares
    its base's ("not the same object as ...LlamaForCausalLM"). Copies come back enabled, with the same tokens."""
    import copy
    import pickle

    model = hf_jetspec.enable(make_target("llama", seed=4))
    head = JetSpecHead.for_target(model, block_size=6)
    reference = greedy_reference(make_target("llama", seed=4), PROMPT, max_new_tokens=12)
    torch.save(model, tmp_path / "model.pt")
    copies = [torch.load(tmp_path / "model.pt", weights_only=False), pickle.loads(pickle.dumps(model)),
              copy.deepcopy(model)]
    for clone in copies:
        assert type(clone) is type(model) and clone is not model
        out = clone.generate(PROMPT, max_new_tokens=12, do_sample=False, assistant_model=head)
        assert_same_tokens(reference, out)
    plain = make_target("llama", seed=4)
    assert type(pickle.loads(pickle.dumps(plain))) is type(plain)  # models never enabled pickle as before


def test_native_dflash_drafter_with_a_head():
    """transformers >= 5.25's own DFlash drafter (``speculation_type="dflash"``) calls its assistant's forward with
    ``noise_embeds``: a head there, on a target not enabled, is named with the fix (it was "_forward_unimplemented()
    got an unexpected keyword argument 'noise_embeds'"); on an enabled target the head runs JetSpec, losslessly."""
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), "speculation_type"):
        pytest.skip(f"transformers {transformers.__version__} has no speculation_type")
    model = make_target("llama")
    head = JetSpecHead.for_target(model, block_size=6)
    with pytest.raises(TypeError, match="not a language model.*enable"):
        model.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=head, speculation_type="dflash")
    reference = greedy_reference(model, PROMPT, max_new_tokens=20)
    out = hf_jetspec.enable(model).generate(PROMPT, max_new_tokens=20, do_sample=False, assistant_model=head,
                                            speculation_type="dflash")
    assert_same_tokens(reference, out)


def test_streamer_receives_accepted_runs():
    model = make_target("llama")
    reference = greedy_reference(model, PROMPT, max_new_tokens=40)
    recorder = Recorder()
    hf_jetspec.enable(model)
    head = JetSpecHead.for_target(model, block_size=8)
    drafter = ScrambledOracle(reference, 128, 8, seed=1)
    out = jetspec(model, PROMPT, drafter=drafter, max_new_tokens=40, token_streamer=recorder,
                  return_dict_in_generate=True)
    assert_same_tokens(reference, out.sequences)
    assert recorder.ended
    # First the prompt (from generate itself), then the prefill token, then one chunk per verify step.
    assert recorder.chunks[0] == PROMPT[0].tolist()
    assert [len(c) for c in recorder.chunks[1:]] == [1] + out.accept_lengths
    assert sum(recorder.chunks[1:], []) == reference[0, PROMPT.shape[1]:].tolist()
    # The assistant_model route forwards generate()'s own streamer.
    recorder = Recorder()
    model.generate(PROMPT, max_new_tokens=40, do_sample=False, assistant_model=head, streamer=recorder)
    assert recorder.ended and sum(recorder.chunks[1:], []) == reference[0, PROMPT.shape[1]:].tolist()


@pytest.mark.parametrize(
    "settings",
    [
        dict(repetition_penalty=1.5),
        dict(no_repeat_ngram_size=2),
        dict(repetition_penalty=1.3, min_new_tokens=20, eos_token_id=7),
        dict(bad_words_ids=[[17], [33, 9]], suppress_tokens=[4, 5]),
        dict(sequence_bias={(71,): 3.0}),
    ],
)
def test_logits_processors_match_plain_generate(family, settings):
    model = make_target(family, seed=4)
    reference = greedy_reference(model, PROMPT, max_new_tokens=40, **settings)
    drafter = ScrambledOracle(reference, 128, 8, seed=2)
    out = jetspec(model, PROMPT, drafter=drafter, tree_budget=24, max_new_tokens=40, **settings)
    assert_same_tokens(reference, out, str(settings))


@pytest.mark.parametrize("settings", [
    dict(watermarking_config=WatermarkingConfig(bias=2.5, seeding_scheme="selfhash")),
    dict(exponential_decay_length_penalty=(5, 1.5), eos_token_id=7),
    dict(forced_eos_token_id=11, renormalize_logits=True),
    dict(guidance_scale=1.5),
])
def test_stateful_and_length_processors_match_plain_generate(settings):
    """Processors whose output depends on the position (length penalty, forced eos), on a hash of the context
    (watermarking) or on their own forward passes (classifier-free guidance) see every tree path correctly."""
    model = make_target("llama", seed=4)
    reference = greedy_reference(model, PROMPT, max_new_tokens=30, **settings)
    drafter = ScrambledOracle(reference, 128, 6, seed=1)
    out = jetspec(model, PROMPT, drafter=drafter, tree_budget=12, max_new_tokens=30, **settings)
    assert_same_tokens(reference, out, str(settings))


@pytest.mark.parametrize("settings", [
    dict(guidance_scale=1.5),
    dict(watermarking_config=SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340], ngram_len=3)),
])
def test_stateful_processors_never_see_drafts(settings):
    """Classifier-free guidance and SynthID keep state from call to call (one call per emitted token): a draft
    model's tokens scored with them advanced that state, and speculative Jacobi returned other tokens than plain
    greedy. Drafts are now scored without them (`TokenSelector.for_drafts`); with sampling, recursive rejection
    (which scores a whole tree's drafts at once) raised a shape error."""
    model, draft = make_target("llama", seed=4), make_target("llama", seed=9, layers=1)
    reference = greedy_reference(model, PROMPT, max_new_tokens=25, **settings)
    assert not torch.equal(reference, greedy_reference(model, PROMPT, max_new_tokens=25))
    out = model.generate(PROMPT, do_sample=False, max_new_tokens=25, draft_model=draft,
                         custom_generate=hf_jetspec.speculative_jacobi_generate, **settings)
    assert_same_tokens(reference, out, str(settings))
    for kwargs in (dict(custom_generate=hf_jetspec.speculative_jacobi_generate, draft_model=draft),
                   dict(custom_generate=hf_jetspec.jetspec_generate, sampling_rule="rrs", retrieval=False,
                        drafter=ScrambledOracle(reference, 128, 6, seed=1))):
        out = model.generate(PROMPT, do_sample=True, max_new_tokens=25, **kwargs, **settings)
        assert out.shape == (1, PROMPT.shape[1] + 25) and int(out.max()) < 128


@pytest.mark.parametrize("settings", [
    dict(min_p=0.1, temperature=1.2), dict(typical_p=0.7), dict(epsilon_cutoff=3e-3), dict(eta_cutoff=1e-3),
    dict(watermarking_config=WatermarkingConfig(bias=2.5)),
])
def test_sampling_warpers_match_plain_sampling_draw_for_draw(settings):
    """With the "match" rule every emitted token is one draw from the processed distribution, in order: the
    warpers plain sampling applies give the same tokens for the same seed."""
    model = make_target("qwen3", seed=5)
    drafter = ScrambledOracle(greedy_reference(model, PROMPT, max_new_tokens=30), 128, 6, seed=1)
    for seed in range(4):
        torch.manual_seed(seed)
        plain = model.generate(PROMPT, max_new_tokens=30, do_sample=True, **settings)
        torch.manual_seed(seed)
        out = model.generate(PROMPT, custom_generate=hf_jetspec.jetspec_generate, drafter=drafter, tree_budget=12,
                             sampling_rule="match", max_new_tokens=30, do_sample=True, **settings)
        assert out.tolist() == plain.tolist(), f"seed {seed}, {settings}"


def test_custom_stopping_criteria_and_max_length():
    model = make_target("qwen3", seed=6)
    free_run = greedy_reference(model, PROMPT, max_new_tokens=40)
    stop = StoppingCriteriaList([StopAfterToken(int(free_run[0, PROMPT.shape[1] + 9]))])
    reference = greedy_reference(model, PROMPT, max_new_tokens=40, stopping_criteria=stop)
    out = jetspec(model, PROMPT, drafter=OracleDrafter(free_run, 128, 16), tree_budget=16, max_new_tokens=40,
                  stopping_criteria=stop)
    assert_same_tokens(reference, out)
    for max_length in (PROMPT.shape[1] + 1, PROMPT.shape[1] + 5, 30):
        reference = greedy_reference(model, PROMPT, max_length=max_length)
        out = jetspec(model, PROMPT, drafter=OracleDrafter(free_run, 128, 16), max_length=max_length)
        assert_same_tokens(reference, out, f"max_length={max_length}")


def test_returned_scores_and_logits_match_plain_generate():
    model = make_target("llama", seed=7)
    kwargs = dict(max_new_tokens=25, return_dict_in_generate=True, output_scores=True, output_logits=True,
                  repetition_penalty=1.2)
    reference = model.generate(PROMPT, do_sample=False, **kwargs)
    drafter = ScrambledOracle(reference.sequences, 128, 6, seed=3)
    out = jetspec(model, PROMPT, drafter=drafter, **kwargs)
    assert_same_tokens(reference.sequences, out.sequences)
    assert len(out.scores) == len(reference.scores) == len(out.logits)
    for a, b in zip(out.scores, reference.scores):
        assert torch.allclose(a, b, atol=1e-4)
    for a, b in zip(out.logits, reference.logits):
        assert torch.allclose(a, b, atol=1e-4)
    assert out.cache.get_seq_length() == reference.cache.get_seq_length() if hasattr(out, "cache") else True


def test_static_cache(family):
    model = make_target(family, seed=8)
    reference = greedy_reference(model, PROMPT, max_new_tokens=30)
    drafter = ScrambledOracle(reference, 128, 8, seed=4)
    out = jetspec(model, PROMPT, drafter=drafter, tree_budget=32, max_new_tokens=30, cache_implementation="static")
    assert_same_tokens(reference, out)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_implementations_with_a_tree_mask(impl):
    model = make_target("qwen3", seed=9, attn_implementation=impl)
    reference = greedy_reference(model, PROMPT, max_new_tokens=30)
    out = jetspec(model, PROMPT, drafter=ScrambledOracle(reference, 128, 8, seed=5), max_new_tokens=30)
    assert_same_tokens(reference, out, impl)


def compiled_llama(how: str):
    model = make_target("llama", seed=3)
    if how == "forward":
        model.forward = torch.compile(model.forward, backend="eager")
    else:
        model.compile(backend="eager")
    return model


@pytest.mark.parametrize("how", ["forward", "module"])
def test_a_compiled_target(how):
    """torch.compile'd targets (`model.forward = torch.compile(model.forward)` or `model.compile()`; backend
    "eager" keeps dynamo's tracing, the part that matters, without building kernels): every strategy gives plain
    greedy's tokens when the head's call comes first. Code compiled before the head's hooks existed (a plain
    generate() first) skips them: that was "No hidden states were captured" (an internal RuntimeError), now a
    ValueError that names the compile; the training-free strategies, which read no states, still decode."""
    reference = greedy_reference(make_target("llama", seed=3), PROMPT, max_new_tokens=24)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=2):  # then eager: tracing is the slow part here
            model = compiled_llama(how)
            head = JetSpecHead.for_target(model, block_size=6, tree_budget=12)
            assert_same_tokens(reference, jetspec(model, PROMPT, draft_head=head, max_new_tokens=24), "head first")
            assert_same_tokens(reference, greedy_reference(model, PROMPT, max_new_tokens=24), "plain after")
            torch._dynamo.reset()
            model = compiled_llama(how)
            assert_same_tokens(reference, greedy_reference(model, PROMPT, max_new_tokens=24), "plain first")
            with pytest.raises(ValueError, match="torch.compile'd code that skips the forward hooks"):
                jetspec(model, PROMPT, draft_head=head, max_new_tokens=24)
            for strategy in (hf_jetspec.suffix_generate, hf_jetspec.jacobi_generate):
                out = model.generate(PROMPT, max_new_tokens=24, do_sample=False, custom_generate=strategy)
                assert_same_tokens(reference, out, strategy.__name__)
    finally:
        torch._dynamo.reset()


def test_tree_attention_plan():
    model = make_target("qwen3")
    config = model.config
    for impl, expected in [("sdpa", "sdpa"), ("eager", "eager"), ("flash_attention_2", "sdpa"),
                           ("flash_attention_3", "sdpa")]:
        config._attn_implementation = impl
        plan = plan_tree_attention(model, use_kernel=False)
        assert plan.implementation == expected and not plan.kernel
    config._attn_implementation = "paged|sdpa"
    with pytest.raises(ValueError, match="cannot take a tree attention mask"):
        plan_tree_attention(model, use_kernel=False)


def test_clear_errors():
    model = make_target("qwen3")
    head = JetSpecHead.for_target(model)
    with pytest.raises(ValueError, match="draft head"):
        jetspec(model, PROMPT, max_new_tokens=5)
    with pytest.raises(TypeError, match="JetSpecHead"):
        jetspec(model, PROMPT, draft_head=make_target("qwen3"), max_new_tokens=5)
    with pytest.raises(ValueError, match="tree_builder"):
        jetspec(model, PROMPT, draft_head=head, tree_builder="beam", max_new_tokens=5)
    with pytest.raises(ValueError, match="tree_budget"):
        jetspec(model, PROMPT, draft_head=head, tree_budget=0, max_new_tokens=5)
    with pytest.raises(ValueError, match="must be left-padded"):
        jetspec(model, PROMPT, attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0]]), draft_head=head, max_new_tokens=5)
    with pytest.raises(ValueError, match="KV cache"):
        jetspec(model, PROMPT, draft_head=head, use_cache=False, max_new_tokens=5)
    embeds = model.get_input_embeddings()(PROMPT)
    with pytest.raises(ValueError, match="inputs_embeds without input_ids"):
        model.generate(inputs_embeds=embeds, do_sample=False, custom_generate=hf_jetspec.jetspec_generate,
                       draft_head=head, max_new_tokens=5)
    # With input_ids the embeddings are used (as by plain generate): here perturbed ones, a different continuation.
    embeds = embeds + torch.randn(embeds.shape, generator=torch.Generator().manual_seed(0))
    reference = model.generate(PROMPT, inputs_embeds=embeds, do_sample=False, max_new_tokens=12)
    assert not torch.equal(reference, greedy_reference(model, PROMPT, max_new_tokens=12))
    assert_same_tokens(reference, jetspec(model, PROMPT, inputs_embeds=embeds, draft_head=head,
                                          max_new_tokens=12))


@pytest.mark.parametrize("settings, method", [
    (dict(penalty_alpha=0.6, top_k=4), "contrastive search"),
    (dict(dola_layers="high"), "DoLa"),
])
@pytest.mark.parametrize("loop", ["jetspec_generate", "suffix_generate", "jacobi_generate"])
def test_other_decoding_methods_are_refused(settings, method, loop):
    """custom_generate replaces generate()'s dispatch: contrastive search or DoLa options would otherwise be
    dropped silently and plain greedy tokens returned."""
    model = make_target("llama")
    kwargs = dict(draft_head=JetSpecHead.for_target(model)) if loop == "jetspec_generate" else {}
    with pytest.raises(ValueError, match=f"{method}.*different decoding method"):
        model.generate(PROMPT, max_new_tokens=5, do_sample=False, custom_generate=getattr(hf_jetspec, loop),
                       **kwargs, **settings)
    # top_k alone (no penalty_alpha) is not contrastive search: greedy runs.
    out = model.generate(PROMPT, max_new_tokens=5, do_sample=False, top_k=4, custom_generate=getattr(hf_jetspec, loop),
                         **kwargs)
    assert out.shape[1] == PROMPT.shape[1] + 5


def test_bf16_target_runs_and_reports_drift():
    """bf16 multi-token forwards round differently from one-token decoding: the loop must run and stay close;
    exact equality is only promised in float32 (see docs/compatibility.md)."""
    model = make_target("qwen3", seed=10).to(torch.bfloat16)
    reference = greedy_reference(model, PROMPT, max_new_tokens=30)
    out = jetspec(model, PROMPT, drafter=OracleDrafter(reference, 128, 8), max_new_tokens=30,
                  return_dict_in_generate=True)
    assert out.sequences.shape[1] == reference.shape[1]
    assert out.sequences[0, : PROMPT.shape[1] + 1].tolist() == reference[0, : PROMPT.shape[1] + 1].tolist()


def test_custom_generate_folder(tmp_path):
    model = make_target("qwen3", seed=11)
    head = JetSpecHead.for_target(model, block_size=8)
    reference = greedy_reference(model, PROMPT, max_new_tokens=24)
    recorder = Recorder()
    out = model.generate(PROMPT, do_sample=False, max_new_tokens=24, custom_generate=hf_jetspec.custom_generate_path(),
                         trust_remote_code=True, draft_head=head, streamer=recorder)
    assert_same_tokens(reference, out)
    assert recorder.ended and sum(recorder.chunks[1:], []) == reference[0, PROMPT.shape[1]:].tolist()
    for strategy, why in (("nope", "'nope' is unknown"), ("ar", "'ar' is benchmark-only")):
        with pytest.raises(ValueError, match=why):
            model.generate(PROMPT, max_new_tokens=4, custom_generate=hf_jetspec.custom_generate_path(),
                           trust_remote_code=True, draft_head=head, strategy=strategy)


@pytest.mark.parametrize("offload", ["cpu_offload", "dispatch_model"])
def test_accelerate_offloaded_target(offload, tmp_path):
    """accelerate's offloading leaves the weights on ``meta`` and moves them in per forward: every strategy (the
    measured cost curve of the default merged tree included) must find the execution device, and stay lossless; a
    head loaded by folder for it, or made for it, lands on that device, not on ``meta``."""
    import copy

    from accelerate import cpu_offload, dispatch_model

    from hf_jetspec.devices import execution_device

    model = make_target("qwen3", seed=4)
    reference = greedy_reference(model, PROMPT, max_new_tokens=24)
    offloaded = copy.deepcopy(model)
    if offload == "cpu_offload":
        cpu_offload(offloaded, execution_device="cpu")
        assert next(offloaded.parameters()).device.type == "meta"
    else:
        offloaded = dispatch_model(offloaded, device_map={"": "cpu"})
    assert execution_device(offloaded) == torch.device("cpu")
    calls = {
        "jetspec-merged": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12,
                               drafter=ScrambledOracle(reference, 128, 6, seed=1)),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate),
        "assistant": dict(assistant_model=JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)),
    }
    JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1).save_pretrained(tmp_path / "head")
    made = JetSpecHead.for_target(offloaded, block_size=6, num_hidden_layers=1)
    assert made.fc.weight.device == torch.device("cpu")
    calls |= {"head-folder": dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=str(tmp_path / "head")),
              "head-made": dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=made)}
    target = hf_jetspec.enable(offloaded)
    for name, kwargs in calls.items():
        out = target.generate(PROMPT, max_new_tokens=24, do_sample=False, **kwargs)
        assert_same_tokens(reference, out, name)


def test_text_generation_pipeline(model_dir):
    """transformers' ``pipeline("text-generation")`` passes generate kwargs through: every strategy, a chat batch
    (left-padded by the pipeline), returns the texts plain greedy does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(model_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "model")
    head = JetSpecHead.from_pretrained(model_dir / "head")
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    chats = [[{"role": "user", "content": "Write a haiku about the sea."}],
             [{"role": "user", "content": "What is 2 + 2? Answer briefly."}]]
    run = dict(max_new_tokens=12, do_sample=False, batch_size=2)

    def texts(**kwargs):
        return [out[0]["generated_text"][-1]["content"] for out in pipe(chats, **run, **kwargs)]

    reference = texts()
    hf_jetspec.enable(model)
    assert texts(assistant_model=head) == reference
    assert texts(custom_generate=hf_jetspec.jetspec_generate, draft_head=head, tree_budget=5) == reference
    assert texts(custom_generate=hf_jetspec.suffix_generate) == reference
    assert texts(custom_generate=hf_jetspec.jacobi_generate, window=3) == reference
