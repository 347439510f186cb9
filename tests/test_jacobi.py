"""Jacobi and speculative Jacobi decoding: greedy outputs identical to plain ``generate()`` (windows 1..16, every
initialisation, n-gram pool, stops inside a window, processors, StaticCache, three model families), and sampling
that draws exactly from the target (seeded draw-for-draw identity, and a chi-squared test on 3-token joints)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from helpers import (TARGET_FAMILIES, assert_same_tokens, chi_squared_pvalue, exact_joint, greedy_reference,
                     joint_counts, make_target, processed_tables)
from transformers import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                          TopKLogitsWarper)

import hf_jetspec
from hf_jetspec.decoding import jacobi as jacobi_module
from hf_jetspec.decoding.jacobi import INITIALISERS, NgramPool, jacobi_generate, lookup_continuation
from hf_jetspec.acceptance import recursive_rejection
from hf_jetspec.decoding.spec_jacobi import speculative_jacobi_generate

_MODELS: dict = {}


def model(family: str, vocab: int = 128, seed: int = 0, layers: int = 2):
    """Cached tiny targets. Small vocabularies make greedy text repetitive, so Jacobi windows converge often."""
    key = (family, vocab, seed, layers)
    if key not in _MODELS:
        _MODELS[key] = make_target(family, seed=seed, vocab=vocab, layers=layers)
    return _MODELS[key]


def jacobi(target, prompt, **kwargs):
    return target.generate(prompt, do_sample=False, custom_generate=jacobi_generate, **kwargs)


def spec(target, prompt, **kwargs):
    return target.generate(prompt, do_sample=False, custom_generate=speculative_jacobi_generate, **kwargs)


def check_stats(out, reference, prompt_len: int, slots: int) -> None:
    assert sum(out.accept_lengths) + 1 == reference.shape[1] - prompt_len
    assert all(1 <= a <= slots + 1 for a in out.accept_lengths)
    counts = out.stats.extra["slot_accepts"]
    assert len(counts) == slots and all(a >= b for a, b in zip(counts, counts[1:]))  # slot i needs slots < i


# ------------------------------------------------------------------------------------------------ greedy Jacobi


def sweep_case(index: int) -> dict:
    rng = random.Random(index)
    return dict(
        family=TARGET_FAMILIES[index % 3], vocab=rng.choice([16, 32, 128]), window=1 + index % 16,
        init=INITIALISERS[(index + index // 16) % 4], pool=rng.choice([0, 0, 4]), prompt_len=rng.choice([1, 3, 9]),
        max_new=rng.choice([1, 5, 24, 40]), eos_at=rng.choice([None, None, 2, 9]), seed=index,
    )


_OUTPUTS: dict = {}


def run_jacobi_case(family, vocab, window, init, pool, prompt_len, max_new, eos_at, seed):
    if seed in _OUTPUTS:
        return _OUTPUTS[seed]
    target = model(family, vocab)
    prompt = torch.randint(3, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    kwargs = {"max_new_tokens": max_new}
    if eos_at is not None:
        free = greedy_reference(target, prompt, max_new_tokens=max_new)[0, prompt_len:]
        kwargs["eos_token_id"] = int(free[min(eos_at, len(free) - 1)])
    reference = greedy_reference(target, prompt, **kwargs)
    out = jacobi(target, prompt, window=window, init=init, ngram_pool=pool, return_dict_in_generate=True, **kwargs)
    assert_same_tokens(reference, out.sequences, f"[{family} V={vocab} window={window} {init} pool={pool} {kwargs}]")
    check_stats(out, reference, prompt_len, window)
    assert out.stats.extra["iterations"] == len(out.accept_lengths)
    _OUTPUTS[seed] = out
    return out


SWEEP = 48


@pytest.mark.parametrize("index", range(SWEEP))
def test_jacobi_matches_greedy(index):
    run_jacobi_case(**sweep_case(index))


def test_sweep_covers_windows_inits_and_long_accepts():
    cases = [sweep_case(i) for i in range(SWEEP)]
    assert {c["window"] for c in cases} == set(range(1, 17))
    assert {(c["init"], c["family"]) for c in cases} == set(itertools.product(INITIALISERS, TARGET_FAMILIES))
    outs = [run_jacobi_case(**c) for c in cases if c["max_new"] == 40 and c["vocab"] < 128]
    assert max(max(o.accept_lengths) for o in outs) >= 5
    assert any(o.stats.extra["pool_tokens"] > 0 for o in outs)


@pytest.mark.parametrize("init", INITIALISERS)
def test_stops_inside_an_accepted_window(init):
    """eos / max_length / a stopping criterion on a token in the middle of a multi-token Jacobi step."""
    target, prompt = model("llama", 16, seed=1), torch.tensor([[5, 6, 7, 3]])
    free = jacobi(target, prompt, window=8, init=init, max_new_tokens=60, return_dict_in_generate=True)
    steps = free.accept_lengths
    step = max(range(len(steps)), key=steps.__getitem__)
    assert steps[step] >= 4
    start = prompt.shape[1] + 1 + sum(steps[:step])  # index of the step's first token in the sequence
    tokens = free.sequences[0].tolist()
    inside = [i for i in range(start + 1, start + steps[step] - 1) if tokens[i] not in tokens[prompt.shape[1]:i]]
    cases = [dict(max_new_tokens=60, eos_token_id=tokens[inside[0]])] if inside else []
    for kwargs in cases + [dict(max_length=start + 2)]:
        reference = greedy_reference(target, prompt, **kwargs)
        out = jacobi(target, prompt, window=8, init=init, **kwargs)
        assert_same_tokens(reference, out, f"{init} {kwargs}")
        assert start < reference.shape[1] < start + steps[step]


def test_unconverged_predictions_become_the_next_guesses(monkeypatch):
    """The defining Jacobi step: guesses after the accepted prefix are the previous forward's predictions, shifted."""
    calls = []
    real = jacobi_module.verify_guesses

    def spy(model_, branches, *args):
        visited, predictions = real(model_, branches, *args)
        calls.append((branches[0], len(visited) - 1, predictions))
        return visited, predictions

    monkeypatch.setattr(jacobi_module, "verify_guesses", spy)
    target = model("qwen3", 32)
    prompt = torch.tensor([[4, 9, 4, 11]])
    reference = greedy_reference(target, prompt, max_new_tokens=40)
    assert_same_tokens(reference, jacobi(target, prompt, window=6, init="pad", max_new_tokens=40))
    for (guesses, accepted, predictions), (following, _, _) in zip(calls, calls[1:]):
        carried = predictions[accepted + 1 :]
        assert following[: len(carried)] == carried[: len(following)]
        assert following[len(carried) :] == [0] * (len(following) - len(carried))  # pad slots (pad_token_id 0)


@pytest.mark.parametrize("settings", [dict(repetition_penalty=1.5), dict(cache_implementation="static"),
                                      dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=10)])
def test_jacobi_processors_and_static_cache(family, settings):
    target, prompt = model(family, 32), torch.tensor([[7, 8, 9]])
    reference = greedy_reference(target, prompt, max_new_tokens=40, **settings)
    for init, pool in (("ngram", 4), ("repeat-last", 0)):
        out = jacobi(target, prompt, window=7, init=init, ngram_pool=pool, max_new_tokens=40, **settings)
        assert_same_tokens(reference, out, f"{settings} {init}")


def test_jacobi_sampling_is_plain_sampling_draw_for_draw():
    """Sampling ("sample, then match") makes one multinomial draw per committed token from the same processed
    distribution, in order: with the same global seed it returns plain ``generate(do_sample=True)``'s tokens."""
    target, prompt = model("qwen3", 32, seed=2), torch.tensor([[5, 6, 7]])
    settings = dict(do_sample=True, max_new_tokens=24, repetition_penalty=1.2, top_k=10, temperature=0.8)
    for seed in range(6):
        torch.manual_seed(seed)
        reference = target.generate(prompt, **settings)
        torch.manual_seed(seed)
        out = target.generate(prompt, custom_generate=jacobi_generate, window=4, init="ngram", ngram_pool=2,
                              **settings)
        assert_same_tokens(reference, out, f"seed {seed}")


def test_lookup_and_pool_helpers():
    context = torch.tensor([1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3])
    assert lookup_continuation(context, 3) == [5, 6, 2]  # latest earlier "2 3" was followed by 5 6 2
    assert lookup_continuation(torch.tensor([1, 2, 3]), 2) == []
    pool = NgramPool(3, per_key=2)
    pool.harvest(10, [1, 2, 3], [5, 6, 7])  # bigrams only: no 3-gram yet
    assert pool.candidates(1, 4) == []
    pool.harvest(11, [5, 6, 8], [6, 8, 9])  # positions 11, 12 held last time's predictions 5, 6; 13 did not
    assert pool.candidates(1, 4) == [[5, 6]] and pool.candidates(2, 4) == [[6, 8]] and pool.candidates(3, 4) == []


def test_jacobi_clear_errors():
    target = model("qwen3")
    with pytest.raises(ValueError, match="init"):
        jacobi(target, torch.tensor([[3, 4]]), init="zeros", max_new_tokens=3)
    with pytest.raises(ValueError, match="window"):
        jacobi(target, torch.tensor([[3, 4]]), window=-1, max_new_tokens=3)


# ----------------------------------------------------------------------------------------- speculative Jacobi


@pytest.mark.parametrize("index", range(12))
def test_speculative_jacobi_matches_greedy(index):
    rng = random.Random(index)
    family, vocab = TARGET_FAMILIES[index % 3], rng.choice([32, 128])
    target, draft = model(family, vocab), model("llama", vocab, seed=5 + index % 2, layers=1)
    prompt = torch.randint(3, vocab, (1, rng.choice([1, 4, 11])), generator=torch.Generator().manual_seed(index))
    kwargs = dict(max_new_tokens=rng.choice([2, 17, 36]))
    kwargs |= rng.choice([{}, {}, dict(repetition_penalty=1.4), dict(cache_implementation="static")])
    reference = greedy_reference(target, prompt, **kwargs)
    k, iterations = [1, 2, 5, 16][index % 4], rng.choice([0, 0, 2])
    out = spec(target, prompt, draft_model=draft, num_draft_tokens=k, jacobi_iterations=iterations,
               return_dict_in_generate=True, **kwargs)
    assert_same_tokens(reference, out.sequences, f"[{family} K={k} J={iterations} {kwargs}]")
    check_stats(out, reference, prompt.shape[1], k)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_target_as_its_own_draft_accepts_every_draft(family, k):
    target, prompt = model(family), torch.tensor([[3, 14, 15, 92]])
    reference = greedy_reference(target, prompt, max_new_tokens=41)
    out = spec(target, prompt, draft_model=target, num_draft_tokens=k, return_dict_in_generate=True,
               max_new_tokens=41)
    assert_same_tokens(reference, out.sequences)
    assert out.accept_lengths[:-1] == [k + 1] * (len(out.accept_lengths) - 1)
    eos = int(reference[0, prompt.shape[1] + k + 2 + k // 2])  # inside the second accepted chain
    kwargs = dict(max_new_tokens=41, eos_token_id=eos)
    assert_same_tokens(greedy_reference(target, prompt, **kwargs),
                       spec(target, prompt, draft_model=target, num_draft_tokens=k, **kwargs))


def test_truncated_draft(family):
    from hf_jetspec.models import truncated_draft

    target, prompt = model(family, 32, layers=3), torch.tensor([[3, 14, 15]])
    full = truncated_draft(target, 3)
    torch.testing.assert_close(full(prompt).logits, target(prompt).logits, atol=0, rtol=0)
    draft = truncated_draft(target, 1)
    assert draft.config.num_hidden_layers == 1 and len(draft.model.layers) == 1 and target.config.num_hidden_layers == 3
    reference = greedy_reference(target, prompt, max_new_tokens=20)
    assert_same_tokens(reference, spec(target, prompt, draft_model=draft, num_draft_tokens=3, max_new_tokens=20))
    with pytest.raises(ValueError, match="num_layers"):
        truncated_draft(target, 4)


def test_speculative_jacobi_clear_errors():
    target = model("qwen3")
    with pytest.raises(ValueError, match="draft_model"):
        spec(target, torch.tensor([[3, 4]]), max_new_tokens=3)
    with pytest.raises(ValueError, match="vocabulary"):
        spec(target, torch.tensor([[3, 4]]), draft_model=model("llama", 32), max_new_tokens=3)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        spec(target, torch.tensor([[3, 4]]), draft_model=target, num_draft_tokens=0, max_new_tokens=3)


# ----------------------------------------------------------------- speculative sampling: exact distribution

VOCAB, PROMPT, DRAFTS, MAX_NEW = 8, torch.tensor([[3, 5, 3]]), 2, 4
SAMPLING = dict(do_sample=True, temperature=1.3, top_k=6, repetition_penalty=1.5)


def processors() -> LogitsProcessorList:
    """What generate() builds for ``SAMPLING`` (checked against its output_scores below)."""
    return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), TemperatureLogitsWarper(1.3),
                                TopKLogitsWarper(6)])


def tables(lm, depth: int = 3) -> list[torch.Tensor]:
    """Processed next-token distributions after every continuation prefix: ``out[l][code]`` is ``[V]`` for the
    prefix of length l whose base-V code is ``code`` (one batched forward over all V^depth continuations)."""
    return processed_tables(lm, PROMPT, processors(), VOCAB, depth)


def chain_rule(drafts, q, p, generator):
    """`hf_jetspec.acceptance.rejection_walk` on a chain, row by row, making its random draws in its order:
    recursive rejection of each draft against the q it was drawn from; a draw from p after the last.
    drafts ``[B, K]``, q ``[B, K, V]``, p ``[B, K + 1, V]`` -> (accepted ``[B]``, next token ``[B]``)."""
    accepted, tokens = [], []
    for b in range(drafts.shape[0]):
        k = drafts.shape[1]
        for i in range(k):
            index, token = recursive_rejection(p[b, i], q[b, i], [int(drafts[b, i])], generator)
            if index is None:
                break
        else:
            i, token = k, recursive_rejection(p[b, k], p[b, k], [], generator)[1]
        accepted.append(i)
        tokens.append(token)
    return torch.tensor(accepted), torch.tensor(tokens)


def simulate(p, q, batch: int, generator: torch.Generator, rule=chain_rule) -> torch.Tensor:
    """Batched replica of `speculative_jacobi_generate`'s sampling schedule (prefill draw, then rounds of
    ``min(K, remaining - 1)`` draft draws + the acceptance ``rule``) on exact tables; ``[batch, MAX_NEW]`` tokens.
    For batch 1 it makes the loop's random draws in the loop's order."""
    out = torch.zeros(batch, MAX_NEW, dtype=torch.long)
    out[:, 0] = torch.multinomial(p[0].expand(batch, -1), 1, generator=generator)[:, 0]
    length = torch.ones(batch, dtype=torch.long)
    while bool((length < MAX_NEW).any()):
        now = int(length[length < MAX_NEW].min())
        rows = (length == now).nonzero()[:, 0]
        code = sum(out[rows, i] * VOCAB ** (now - 1 - i) for i in range(now))
        k = min(DRAFTS, MAX_NEW - now - 1)
        drafts, qs, ps = [], [], []
        for i in range(k):
            qs.append(q[now + i][code])
            ps.append(p[now + i][code])
            drafts.append(torch.multinomial(qs[-1], 1, generator=generator)[:, 0])
            code = code * VOCAB + drafts[-1]
        ps.append(p[now + k][code])
        if k == 0:
            accepted, token = torch.zeros_like(rows), torch.multinomial(ps[0], 1, generator=generator)[:, 0]
        else:
            accepted, token = rule(torch.stack(drafts, 1), torch.stack(qs, 1), torch.stack(ps, 1), generator)
        chain = torch.stack(drafts + [token], 1) if drafts else token[:, None]
        for j in range(k + 1):
            write = (j <= accepted) & (now + j < MAX_NEW)
            values = torch.where(j == accepted, token, chain[:, j])
            out[rows[write], now + j] = values[write]
        length[rows] = torch.clamp(now + accepted + 1, max=MAX_NEW)
    return out


@pytest.fixture(scope="module")
def sampling_pair():
    target = make_target("qwen3", seed=11, vocab=VOCAB, layers=1, hidden=32, heads=2, kv_heads=1)
    draft = make_target("llama", seed=12, vocab=VOCAB, layers=1, hidden=32, heads=2, kv_heads=1)
    return target, draft, tables(target), tables(draft)


def test_tables_are_generates_processed_distributions(sampling_pair):
    for lm, table in ((sampling_pair[0], sampling_pair[2]), (sampling_pair[1], sampling_pair[3])):
        for seed in range(3):
            torch.manual_seed(seed)
            out = lm.generate(PROMPT, max_new_tokens=3, output_scores=True, return_dict_in_generate=True, **SAMPLING)
            new = out.sequences[0, PROMPT.shape[1]:].tolist()
            for length, scores in enumerate(out.scores):
                code = sum(t * VOCAB ** (length - 1 - i) for i, t in enumerate(new[:length]))
                torch.testing.assert_close(torch.softmax(scores[0], -1), table[length][code], atol=1e-5, rtol=1e-4)


def test_speculative_sampling_loop_is_the_simulation_draw_for_draw(sampling_pair):
    target, draft, p, q = sampling_pair
    for seed in range(25):
        out = target.generate(PROMPT, max_new_tokens=MAX_NEW, custom_generate=speculative_jacobi_generate,
                              draft_model=draft, num_draft_tokens=DRAFTS, generator=torch.Generator().manual_seed(seed),
                              **SAMPLING)
        expected = simulate(p, q, 1, torch.Generator().manual_seed(seed))
        assert out[0, PROMPT.shape[1]:].tolist() == expected[0].tolist(), f"seed {seed}"


def naive_rule(drafts, q, p, generator):
    """A classic bug for the power check: on rejection, draw from p instead of norm(max(0, p - q))."""
    k = drafts.shape[1]
    ratio = p[:, :k].gather(-1, drafts[..., None])[..., 0] / q.gather(-1, drafts[..., None])[..., 0]
    accepted = (torch.rand(drafts.shape, generator=generator) < ratio).long().cumprod(-1).sum(-1)
    return accepted, torch.multinomial(p[torch.arange(len(drafts)), accepted], 1, generator=generator)[:, 0]


def test_speculative_sampling_matches_the_target_distribution(sampling_pair):
    """40k 3-token continuations (drafts accepted 0, 1 and 2 times per round) against the exact joint of plain
    sampling, enumerated from the target: chi-squared p > 0.01 (fixed seed); the same test rejects a subtly wrong
    rule and the draft's own distribution, so it has power."""
    _, _, p, q = sampling_pair
    target_joint, draft_joint = exact_joint(p, 3), exact_joint(q, 3)
    counts = joint_counts(simulate(p, q, 40_000, torch.Generator().manual_seed(0))[:, :3], VOCAB)
    assert chi_squared_pvalue(counts, target_joint) > 0.01
    assert chi_squared_pvalue(counts, draft_joint) < 1e-6
    wrong = joint_counts(simulate(p, q, 40_000, torch.Generator().manual_seed(0), rule=naive_rule)[:, :3], VOCAB)
    assert chi_squared_pvalue(wrong, target_joint) < 1e-6


def test_chain_rule_unit_cases():
    """Unit cases of recursive rejection on a chain: identical p and q accept everything; a draft the target rules
    out is always rejected."""
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]])
    accepted, token = chain_rule(torch.tensor([[1, 2]]), p[:, :2], p, torch.Generator().manual_seed(0))
    assert int(accepted) == 2 and int(token) == 0
    q = torch.tensor([[[0.0, 0.0, 1.0], [0.2, 0.3, 0.5]]])
    accepted, token = chain_rule(torch.tensor([[2, 2]]), q, p, torch.Generator().manual_seed(0))
    assert int(accepted) == 0 and int(token) in (0, 1)


# ------------------------------------------------------------------------------------------- bench and CLI


def test_exports():
    assert hf_jetspec.jacobi_generate is jacobi_generate
    assert hf_jetspec.speculative_jacobi_generate is speculative_jacobi_generate
