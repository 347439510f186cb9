"""vLLM (CPU build) serves the shipped SmolLM2 head exported by `hf-jetspec export-vllm` as a DFlash drafter:
greedy outputs equal vLLM's own non-speculative greedy outputs, offline (`vllm.LLM`) and through the
OpenAI-compatible server; the mean acceptance length from vLLM's spec-decode counters is reported."""

from __future__ import annotations

import pytest
from conftest import MAX_TOKENS
from vllm_common import acceptance, complete, run_offline, server_spec_counters, spec_config, vllm_server

K = 3  # num_speculative_tokens


@pytest.fixture(scope="module")
def plain(target, prompts):
    return run_offline(target, prompts, None, MAX_TOKENS)


def test_offline_dflash_greedy_equals_plain_greedy(target, head_dir, prompts, plain):
    spec = run_offline(target, prompts, spec_config("dflash", head_dir, K), MAX_TOKENS)
    assert spec["token_ids"] == plain["token_ids"]
    stats = spec["spec"]
    print(f"\noffline dflash K={K}: mean acceptance length {stats['mean_acceptance_length']:.3f} "
          f"({stats['num_accepted_tokens']:.0f} accepted / {stats['num_drafts']:.0f} drafts); "
          f"{sum(map(len, spec['token_ids'])) / spec['seconds']:.1f} tok/s vs plain "
          f"{sum(map(len, plain['token_ids'])) / plain['seconds']:.1f} tok/s")
    assert stats["num_drafts"] > 0 and stats["num_accepted_tokens"] > 0  # the head's drafts really get accepted


def test_server_dflash_greedy_equals_plain_greedy(target, head_dir, prompts, plain, tmp_path):
    with open(tmp_path / "server.log", "w") as log, vllm_server(target, spec_config("dflash", head_dir, K),
                                                                 max_num_seqs=4, log=log) as base:
        replies = [complete(base, prompt, MAX_TOKENS) for prompt in prompts]  # bounded: one request per prompt
        stats = acceptance(server_spec_counters(base))
    assert [r["text"] for r in replies] == plain["texts"]
    print(f"\nserver dflash K={K}: mean acceptance length {stats['mean_acceptance_length']:.3f} "
          f"({stats['num_accepted_tokens']:.0f} accepted / {stats['num_drafts']:.0f} drafts)")
    assert stats["num_drafts"] > 0
