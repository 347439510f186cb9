"""Retrieval drafting end to end: the drafter's candidates, suffix decoding without a head, datastores carried by
heads (save / load / push layout) and refused for another vocabulary."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_tokens, greedy_reference, make_target

import hf_jetspec
from hf_jetspec import Calibration, CorpusIndex, JetSpecHead, RetrievalDrafter
from hf_jetspec.calibration import CALIBRATION_FILE
from hf_jetspec.suffix_index import DATASTORE_FILE

PROMPT = torch.tensor([[5, 9, 17, 33, 8, 5, 9, 17]])


def test_drafter_proposes_what_followed_earlier():
    drafter = RetrievalDrafter(CorpusIndex.build([[7, 8, 3, 4, 5]], vocab_size=40), depth=3)
    found = drafter.candidates(torch.tensor([[7, 8, 9, 1, 2, 7, 8]]), depth=8)
    paths = found.paths()
    assert found.sources == ("context", "corpus")
    assert (9, 1, 2) in paths and paths[(9, 1, 2)][0] > 0  # context: after "7 8" came "9 1 2"
    assert (3, 4, 5) in paths and paths[(3, 4, 5)][1] > 0  # corpus: after "7 8" came "3 4 5"
    assert drafter.candidates(torch.tensor([[7, 8, 9, 1, 2, 7, 8, 30]]), depth=8) is None


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_suffix_decoding_is_greedy_and_drafts_from_a_datastore(family):
    model = make_target(family, seed=2)
    free_run = greedy_reference(model, PROMPT, max_new_tokens=30)
    out = model.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_jetspec.suffix_generate,
                         node_cost=0.05, return_dict_in_generate=True)
    assert_same_tokens(free_run, out.sequences)  # this call's own text only
    store = CorpusIndex.build([free_run[0].tolist()], vocab_size=128)
    out = model.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_jetspec.suffix_generate,
                         datastore=store, node_cost=0.05, return_dict_in_generate=True)
    assert_same_tokens(greedy_reference(model, PROMPT, max_new_tokens=30), out.sequences)
    assert out.stats.tau > 3  # ... or from the datastore


def test_calibration_log_records_every_reached_node():
    model = make_target("qwen3", seed=1)
    torch.manual_seed(0)
    head = JetSpecHead.for_target(model, block_size=4, num_hidden_layers=1)
    log: list = []
    out = model.generate(PROMPT, max_new_tokens=20, do_sample=False, custom_generate=hf_jetspec.jetspec_generate,
                         draft_head=head, node_cost=None, tree_budget=8, calibration_log=log,
                         return_dict_in_generate=True)
    accepted = sum(r["accepted"] for r in log)
    assert log and {r["kind"] for r in log} <= {"head", "retrieval"}
    assert accepted == sum(out.stats.accept_lengths) - len(out.stats.accept_lengths)  # drafted tokens accepted


def test_head_carries_its_datastore_and_calibration(tmp_path):
    model = make_target("llama", seed=0)
    head = JetSpecHead.for_target(model, block_size=4, num_hidden_layers=1)
    head.datastore = CorpusIndex.build([[1, 2, 3], [4, 5, 6, 7]], vocab_size=128)
    head.calibration = Calibration(node_cost=0.04)
    head.save_pretrained(tmp_path)
    assert (tmp_path / DATASTORE_FILE).is_file() and (tmp_path / CALIBRATION_FILE).is_file()
    loaded = JetSpecHead.from_pretrained(tmp_path)
    assert loaded.datastore.num_tokens == 7 and loaded.calibration.node_cost == 0.04
    plain = JetSpecHead.for_target(model, block_size=4, num_hidden_layers=1)
    plain.save_pretrained(tmp_path / "plain")
    assert JetSpecHead.from_pretrained(tmp_path / "plain").datastore is None
    # A head in a repository's subfolder brings its datastore and calibration too (they were looked up at the top).
    head.save_pretrained(tmp_path / "repo" / "heads" / "small")
    nested = JetSpecHead.from_pretrained(tmp_path / "repo", subfolder="heads/small")
    assert nested.datastore.num_tokens == 7 and nested.calibration.node_cost == 0.04
    with pytest.raises(FileNotFoundError, match="no such folder"):
        JetSpecHead.from_pretrained(tmp_path / "repo", subfolder="heads/missing")


def test_a_datastore_for_another_vocabulary_is_refused():
    model = make_target("llama", seed=0)
    store = CorpusIndex.build([[1, 2, 3]], vocab_size=50_000)
    with pytest.raises(ValueError, match="built for vocab size 50000, not 128"):
        model.generate(PROMPT, max_new_tokens=4, custom_generate=hf_jetspec.suffix_generate, datastore=store)
    with pytest.raises(ValueError, match="retrieval cannot be combined"):
        head = JetSpecHead.for_target(model, block_size=4, num_hidden_layers=1)
        model.generate(PROMPT, max_new_tokens=4, custom_generate=hf_jetspec.jetspec_generate, draft_head=head,
                       tree_builder="chain", retrieval=True)


def test_push_to_hub_carries_datastore_and_calibration(tmp_path, monkeypatch):
    """push_to_hub uploads datastore.safetensors and calibration.json beside the weights; a head loaded back by repo
    id (the Hub download mocked by the uploaded folder) has both."""
    import shutil

    import huggingface_hub
    import transformers.utils

    hub = tmp_path / "hub"

    class Repo:
        repo_id = "me/head"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: Repo())
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, *, repo_id, folder_path, **kw: shutil.copytree(folder_path, hub))
    model = make_target("llama", seed=0)
    head = JetSpecHead.for_target(model, block_size=4, num_hidden_layers=1)
    head.datastore = CorpusIndex.build([[1, 2, 3, 1, 2, 4]], vocab_size=128)
    head.calibration = Calibration(node_cost=0.02)
    head.push_to_hub("me/head")
    assert {DATASTORE_FILE, CALIBRATION_FILE, "config.json", "model.safetensors"} <= {p.name for p in hub.iterdir()}
    card = (hub / "README.md").read_text()  # the model card names both
    assert "## Retrieval" in card and "6 tokens in 1 documents" in card and "node cost 0.02" in card
    head.datastore = head.calibration = None
    head.save_pretrained(tmp_path / "plain")
    assert "## Retrieval" not in (tmp_path / "plain" / "README.md").read_text()

    def cached_file(repo, name, **kwargs):
        assert repo == "me/head"
        return str(hub / name) if (hub / name).is_file() else None

    monkeypatch.setattr(transformers.utils, "cached_file", cached_file)
    datastore, calibration = hf_jetspec.retrieval.load_retrieval_assets("me/head")
    assert datastore.num_tokens == 6 and calibration.node_cost == 0.02


def _recorded_trees(monkeypatch):
    """Every merged tree the loop builds, as (size, deepest head node) pairs."""
    from hf_jetspec.decoding import jetspec as loop
    from hf_jetspec.decoding.adaptive import deepest_head_node

    trees, build = [], loop.merged_tree

    def recording(*args, **kwargs):
        tree, records = build(*args, **kwargs)
        trees.append((len(tree), deepest_head_node(tree, records)))
        return tree, records

    monkeypatch.setattr(loop, "merged_tree", recording)
    return trees


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_online_calibration_shrinks_trees_where_retrieval_is_wrong(monkeypatch, seed):
    """A prompt that repeats one pattern, which a random target does not continue: the fitted (default) estimates
    keep proposing it; corrected by the call's own outcomes the trees verify fewer nodes, with the same tokens."""
    model = make_target("llama", seed=seed)
    g = torch.Generator().manual_seed(seed)
    pattern = torch.randint(0, 128, (6,), generator=g)
    prompt = torch.cat([pattern] * 8)[None]
    reference = greedy_reference(model, prompt, max_new_tokens=40)
    sizes = {}
    for online in (False, True):
        trees = _recorded_trees(monkeypatch)
        out = model.generate(prompt, max_new_tokens=40, do_sample=False, custom_generate=hf_jetspec.suffix_generate,
                             node_cost=0.02, online_calibration=online)
        assert_same_tokens(reference, out, f"online_calibration={online}")
        sizes[online] = sum(size for size, _ in trees)
    assert sizes[True] < sizes[False]


def test_draft_depth_follows_the_trees():
    from hf_jetspec.decoding.adaptive import DraftDepth, deepest_head_node
    from hf_jetspec.tree import DraftTree

    # a root with a head chain 3 deep and a retrieval chain 5 deep: retrieval nodes do not count
    tokens, parents, depths = [0, 1, 2, 3, 4, 5, 6, 7, 8], [-1, 0, 1, 2, 0, 4, 5, 6, 7], [0, 1, 2, 3, 1, 2, 3, 4, 5]
    records = [None] + [("head", [])] * 3 + [("retrieval", [])] * 5
    assert deepest_head_node(DraftTree.from_lists(tokens, parents, depths, [0.0] * 9), records) == 3
    assert deepest_head_node(DraftTree.from_lists([0], [-1], [0], [0.0]), [None]) == 0

    limit = DraftDepth(15)
    assert limit.limit == 15  # the first tree drafts the whole block
    limit.update(3)
    assert limit.limit == 5  # the deepest head node + 2
    limit.update(5)
    assert limit.limit == 10  # a tree took the limit: doubled
    limit.update(10)
    assert limit.limit == 15  # doubled, at most the block
    for _ in range(8):
        limit.update(1)
    assert limit.limit == 3  # the window forgot the deep trees
    for _ in range(8):
        limit.update(0)
    assert limit.limit == 2  # at least `least`
    assert DraftDepth(1).limit == 1 and DraftDepth(1, least=2).least == 1


@pytest.mark.parametrize("seed", [0, 3])
def test_the_head_drafts_only_as_deep_as_merged_trees_go(monkeypatch, seed):
    """With retrieval the head is asked for the depth recent trees used (plus a margin), not the whole block;
    the tokens stay plain greedy's."""
    from hf_jetspec.decoding.adaptive import DraftDepth
    from hf_jetspec.drafters import HeadDrafter

    model = make_target("qwen3", seed=seed)
    torch.manual_seed(seed)
    head = JetSpecHead.for_target(model, block_size=12, num_hidden_layers=1)
    asked, propose = [], HeadDrafter.propose
    monkeypatch.setattr(HeadDrafter, "propose", lambda self, ids, depth: (asked.append(depth), propose(self, ids,
                                                                                                        depth))[1])
    trees = _recorded_trees(monkeypatch)
    out = model.generate(PROMPT, max_new_tokens=40, do_sample=False, custom_generate=hf_jetspec.jetspec_generate,
                         draft_head=head, tree_budget=32, node_cost=0.02, return_dict_in_generate=True)
    assert_same_tokens(greedy_reference(model, PROMPT, max_new_tokens=40), out.sequences)
    assert len(asked) == len(trees) == len(out.stats.accept_lengths)
    replay, left = DraftDepth(11), 40 - 1  # the prefill's token is not drafted
    for depth, (_, used), accepted in zip(asked, trees, out.stats.accept_lengths):
        assert depth == min(replay.limit, left - 1)  # the controller's limit, or what is left to generate
        replay.update(used)
        left -= accepted
    assert asked[0] == 11 and min(asked[:-3]) < 11  # shallow trees: less than the block is drafted
