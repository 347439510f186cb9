"""The strategy registry: every registered strategy runs through the benchmark's path and returns plain greedy's
tokens; the CLI, bench and the custom_generate folder all read the same registry."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_tokens, make_target

import hf_jetspec
from hf_jetspec import bench
from hf_jetspec.calibration import measure_cost_curve
from hf_jetspec.cli_parser import GENERATE_STRATEGIES, build_parser
from hf_jetspec.strategies import STRATEGIES, Resources, StrategySpec, get_strategy


@pytest.fixture(scope="module")
def setup():
    target = make_target("qwen3", seed=0, vocab=32)
    draft = make_target("llama", seed=5, vocab=32, layers=1)
    torch.manual_seed(0)
    head = hf_jetspec.JetSpecHead.for_target(target, block_size=4, num_hidden_layers=1)
    return target, Resources(head=head, draft_model=draft)


def test_every_registered_strategy_returns_plain_greedy(setup):
    target, resources = setup
    measure_cost_curve(target, 64)  # once per model (cached): its timing forwards are not a strategy's
    prompt = torch.tensor([[5, 6, 7]])
    strategies = bench.parse_strategies(",".join(STRATEGIES), [6])
    assert {s.kind for s in strategies} == set(STRATEGIES)
    reference, *_ = bench.run_strategy(target, prompt, strategies[0], 20, resources)
    for strategy in strategies[1:]:
        out, _, forwards, _ = bench.run_strategy(target, prompt, strategy, 20, resources, reference)
        assert_same_tokens(reference, out, strategy.name)
        assert forwards <= 20


def test_missing_resources_are_named():
    with pytest.raises(ValueError, match="needs a draft model"):
        get_strategy("spec-jacobi").generate_kwargs(Resources())
    with pytest.raises(ValueError, match="needs a draft head"):
        get_strategy("jetspec").generate_kwargs(Resources(), 8)
    with pytest.raises(ValueError, match="Unknown strategy 'warp'"):
        get_strategy("warp")


def test_one_registry_feeds_cli_bench_and_package(monkeypatch):
    assert set(GENERATE_STRATEGIES) == {n for n, s in STRATEGIES.items() if "reference" not in s.needs}
    assert bench.STRATEGY_KINDS == tuple(STRATEGIES)
    assert set(hf_jetspec.DECODING_FUNCTIONS) <= set(STRATEGIES)
    args = build_parser().parse_args(["generate", "--strategy", "spec-jacobi", "--draft-model", "d", "hello"])
    assert args.strategy == "spec-jacobi" and args.draft_model == "d"
    # adding a strategy is one entry: bench and the CLI's choices pick it up
    monkeypatch.setitem(STRATEGIES, "jacobi-wide", StrategySpec("jacobi-wide", "a wider Jacobi window",
                                                                hf_jetspec.jacobi_generate, {"window": 12}))
    assert [s.kind for s in bench.parse_strategies("ar,jacobi-wide", [8])] == ["ar", "jacobi-wide"]
    assert get_strategy("jacobi-wide").generate_kwargs(Resources())["window"] == 12
