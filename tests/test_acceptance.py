"""Acceptance rules on hand-made trees: the match walk (greedy and sampling) and recursive rejection."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import EosTokenCriteria, MaxLengthCriteria

from hf_jetspec.acceptance import accept_walk, check_sampling_rule, recursive_rejection, rejection_walk
from hf_jetspec.tokens import TokenSelector, TokenWriter
from hf_jetspec.tree import DraftTree

VOCAB = 10
PROMPT = torch.tensor([[7, 8]])


def one_hot_logits(choices: list[int]) -> torch.Tensor:
    """Target logits ``[N, V]`` whose argmax at node i is ``choices[i]``."""
    logits = torch.zeros(len(choices), VOCAB)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 5.0
    return logits


def walker(max_length: int = 50, eos: int | None = None, scores: bool = False):
    config = GenerationConfig(do_sample=False, max_length=max_length, return_dict_in_generate=scores,
                              output_scores=scores)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length)] + ([EosTokenCriteria(eos)] if eos else []))
    return TokenSelector(LogitsProcessorList(), config), TokenWriter(PROMPT.clone(), criteria, config)


# tree: 0 (anchor 3) -> 1 (tok 4) -> 3 (tok 6) -> 5 (tok 9)
#                    -> 2 (tok 5) -> 4 (tok 1)
TREE = DraftTree.from_lists([3, 4, 5, 6, 1, 9], [-1, 0, 0, 1, 2, 3], [0, 1, 1, 2, 2, 3])


@pytest.mark.parametrize("scores", [False, True])  # the fast argmax path and the processed-scores path
def test_walk_follows_matching_children_and_emits_the_bonus(scores):
    selector, writer = walker(scores=scores)
    visited = accept_walk(TREE, one_hot_logits([4, 6, 0, 9, 0, 2]), selector, writer)
    assert visited == [0, 1, 3, 5]
    assert writer.ids[0, 2:].tolist() == [4, 6, 9, 2]  # three accepted drafts + the target's token at node 5
    assert writer.scores is None or len(writer.scores) == 4


def test_walk_leaves_the_first_branch():
    selector, writer = walker()
    assert accept_walk(TREE, one_hot_logits([5, 0, 1, 0, 8, 0]), selector, writer) == [0, 2, 4]
    assert writer.ids[0, 2:].tolist() == [5, 1, 8]


def test_walk_rejecting_every_child_emits_one_token():
    selector, writer = walker()
    assert accept_walk(TREE, one_hot_logits([7, 0, 0, 0, 0, 0]), selector, writer) == [0]
    assert writer.ids[0, 2:].tolist() == [7]


def test_walk_stops_exactly_at_a_stop():
    selector, writer = walker(eos=6)  # node 1's target token (6) is a stop: nothing after it is emitted
    assert accept_walk(TREE, one_hot_logits([4, 6, 0, 9, 0, 2]), selector, writer) == [0, 1]
    assert writer.ids[0, 2:].tolist() == [4, 6] and writer.finished
    selector, writer = walker(max_length=PROMPT.shape[1] + 2)
    assert accept_walk(TREE, one_hot_logits([4, 6, 0, 9, 0, 2]), selector, writer) == [0, 1]
    assert writer.ids.shape[1] == PROMPT.shape[1] + 2 and writer.finished


def test_rejection_walk_with_q_equal_p_accepts_every_drafted_child():
    """A chain drawn from q = p: recursive rejection accepts with probability 1 at every node."""
    chain = DraftTree.from_lists([3, 4, 6, 9], [-1, 0, 1, 2], [0, 1, 2, 3])
    logits = one_hot_logits([4, 6, 9, 0])
    p = torch.softmax(logits, -1)
    selector, writer = walker()
    assert rejection_walk(chain, logits, p[:3], selector, writer) == [0, 1, 2, 3]
    assert writer.ids[0, 2:5].tolist() == [4, 6, 9]


def test_recursive_rejection_never_accepts_what_the_target_rules_out():
    gen = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    for _ in range(50):
        index, token = recursive_rejection(p, q, [2], gen)
        assert index is None and token in (0, 1)


def test_unknown_sampling_rule_is_refused():
    with pytest.raises(ValueError, match="Unknown sampling_rule"):
        check_sampling_rule("typical")
