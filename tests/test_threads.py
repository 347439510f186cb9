"""Several threads generating with the same model object at once (a web app serving requests from threads): every
call returns its own plain-greedy tokens. The head's feature taps are forward hooks on the shared decoder layers,
and a tree step may switch the shared config's attention implementation: both must stay per call."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import greedy_reference, make_target

import hf_jetspec
from hf_jetspec import JetSpecHead
from hf_jetspec.attention import attention_implementation, current_implementation
from hf_jetspec.features import FeatureTap


def prompts(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (1, int(torch.randint(2, 14, (1,), generator=g))), generator=g)
            for _ in range(count)]


@pytest.mark.parametrize("family, seed", [("llama", 0), ("qwen3_moe", 2)])
def test_threads_sharing_a_model_get_their_own_tokens(family, seed):
    """Four threads run eighteen calls mixing the assistant_model route, custom_generate with an untrained head
    (retrieval on and off), suffix decoding, Jacobi and plain generate(). Before the taps recorded only their own
    thread, a head call crashed in torch.cat on another call's states (or drafted from them)."""
    model = make_target(family, seed=seed)
    head = JetSpecHead.for_target(model, block_size=6, tree_budget=12)
    hf_jetspec.enable(model)
    inputs = prompts(6, seed)
    length = 24
    references = [greedy_reference(model, p, max_new_tokens=length) for p in inputs]
    calls = [
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False, assistant_model=head),
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False,
                                 custom_generate=hf_jetspec.jetspec_generate, draft_head=head),
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False,
                                 custom_generate=hf_jetspec.jetspec_generate, draft_head=head, retrieval=False),
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False,
                                 custom_generate=hf_jetspec.suffix_generate),
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False,
                                 custom_generate=hf_jetspec.jacobi_generate, window=4),
        lambda p: model.generate(p, max_new_tokens=length, do_sample=False),
    ]
    jobs = [(i % len(inputs), (i + seed) % len(calls)) for i in range(18)]
    with ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda job: calls[job[1]](inputs[job[0]]), jobs))
    for (row, call), output in zip(jobs, outputs):
        assert torch.equal(output, references[row]), (family, row, call)


def test_a_tap_records_only_its_own_threads_forwards():
    """Deterministic form of the race above: another thread's forward between this call's forward and its read."""
    model = make_target("llama")
    ids = torch.tensor([[5, 6, 7]])
    with FeatureTap(model, [1, 3]) as tap:
        model(ids)
        mine = tap.features()
        model(ids)
        thread = threading.Thread(target=lambda: model(torch.tensor([[9, 10, 11, 12, 13]])))
        thread.start()
        thread.join()
        assert torch.equal(tap.features(), mine)
        with pytest.raises(RuntimeError, match="No hidden states"):  # a read takes the states: never read twice
            tap.features()


def test_tree_steps_of_two_threads_do_not_restore_each_others_switch():
    """Call A switches an eager model to sdpa for its tree step; call B's tree step starts meanwhile. Without a
    lock B found sdpa already set (no switch), A restored eager, and B's tree forward ran eager: the wrong
    implementation for a flash_attention target's dense tree mask."""
    model = make_target("llama", attn_implementation="eager")
    config = model.config.get_text_config()
    a_inside, a_left, seen, own = threading.Event(), threading.Event(), [], []

    def call_a():
        try:
            with attention_implementation(model, "sdpa"):
                own.append(current_implementation(model))  # the model's own, while switched
                a_inside.set()
                b.join(timeout=0.5)  # B blocks on the lock (without one it would finish in here)
        finally:
            a_inside.set()
            a_left.set()

    def call_b():
        a_inside.wait()
        with attention_implementation(model, "sdpa"):
            a_left.wait(timeout=5)  # hold on until A has restored its switch (at once when B runs after it)
            seen.append(config._attn_implementation)

    a, b = threading.Thread(target=call_a), threading.Thread(target=call_b)
    b.start()
    a.start()
    a.join()
    b.join()
    assert own == ["eager"] and seen == ["sdpa"] and config._attn_implementation == "eager"
