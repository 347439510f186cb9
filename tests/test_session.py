"""`DecodingSession`: the loop skeleton every strategy shares, driven here by a strategy written in the test (what
a new strategy's author writes): verify guesses, accept, commit."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_tokens, greedy_reference, make_target

from hf_jetspec.acceptance import accept_walk
from hf_jetspec.decoding.session import DecodingSession
from hf_jetspec.tree import DraftTree

PROMPT = torch.tensor([[5, 9, 17, 33, 8]])


def guessing_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                      streamer=None, reference=None, guesses=3, wrong_every=2, record=None, **model_kwargs):
    """A strategy built on the session: guess ``guesses`` tokens of ``reference`` (every ``wrong_every``-th step the
    second guess is wrong), verify them as a chain plus one wrong sibling branch, accept, commit."""
    with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, model_kwargs, layer_ids=[0, 1]) as session:
        session.prefill()
        record["prefill_features"] = tuple(session.features.shape)
        step = 0
        while not session.finished:
            depth = min(guesses, session.max_depth())
            length = session.ids.shape[1]
            chain = reference[0, length : length + depth].tolist()
            if step % wrong_every == 1 and len(chain) > 1:
                chain[1] = (chain[1] + 1) % 128
            branches = [chain, [(chain[0] + 1) % 128]] if chain else [chain]
            branches = branches[:1] if session.node_room(1 + depth + 1) < 2 + depth else branches
            tree, _ = DraftTree.from_branches(session.anchor, branches)
            prefix = session.prefix
            logits = session.verify(tree)
            record.setdefault("features", []).append(tuple(session.features.shape) == (len(tree), 2 * 64))
            visited = accept_walk(tree, logits, session.selector, session.writer)
            session.commit(visited)
            cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))
            record.setdefault("prefix", []).append(session.prefix == prefix + len(visited) == cache.get_seq_length())
            step += 1
        record["hooks"] = session.tap
        return session.finish()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("guesses, wrong_every", [(1, 1), (3, 2), (6, 3)])
def test_a_session_strategy_returns_plain_greedy(cache, guesses, wrong_every):
    model = make_target("qwen3", seed=4)
    reference = greedy_reference(model, PROMPT, max_new_tokens=21)
    record = {}
    out = model.generate(PROMPT, max_new_tokens=21, do_sample=False, custom_generate=guessing_generate,
                         cache_implementation=cache, reference=reference, guesses=guesses, wrong_every=wrong_every,
                         record=record, return_dict_in_generate=True)
    assert_same_tokens(reference, out.sequences)
    assert record["prefill_features"] == (PROMPT.shape[1], 2 * 64)
    assert all(record["features"]) and all(record["prefix"])  # the prefix is derived and matches the cache
    assert sum(out.stats.accept_lengths) == 21 - 1  # every token after the prefill's is a step's
    assert max(out.stats.accept_lengths) <= guesses + 1
    assert record["hooks"]._handles == []  # forward hooks removed when the session closes


def test_hooks_are_removed_when_a_step_raises():
    model = make_target("llama", seed=1)
    sessions = []

    def failing_generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                         synced_gpus=False, streamer=None, **model_kwargs):
        with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                             streamer, model_kwargs, layer_ids=[1]) as session:
            sessions.append(session)
            session.prefill()
            raise RuntimeError("a drafter failed")

    with pytest.raises(RuntimeError, match="a drafter failed"):
        model.generate(PROMPT, max_new_tokens=5, do_sample=False, custom_generate=failing_generate)
    assert sessions[0].tap._handles == [] and not model.model.layers[1]._forward_hooks


def test_room_and_depth_follow_the_static_cache_and_max_length():
    model = make_target("llama", seed=2)
    seen = {}

    def probe(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
              streamer=None, **model_kwargs):
        with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                             streamer, model_kwargs) as session:
            session.prefill()
            seen.update(room=session.node_room(10_000), depth=session.max_depth(), prefix=session.prefix)
            return session.finish()

    model.generate(PROMPT, max_new_tokens=9, do_sample=False, custom_generate=probe, cache_implementation="static")
    # prompt 5 + 9 new: one token emitted by prefill, 8 left -> a depth-7 chain; generate() sizes the static cache
    # max_length - 1 = 13 slots (the last token never enters it), 8 of them free after the prompt
    assert seen == {"room": 13 - 5, "depth": 7, "prefix": 5}
    model.generate(PROMPT, max_new_tokens=9, do_sample=False, custom_generate=probe)
    assert seen == {"room": 10_000, "depth": 7, "prefix": 5}
