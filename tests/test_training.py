"""Training: the loss against a hand computation, anchors and masks, the feature store, Trainer runs, PEFT."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import assert_same_tokens, greedy_reference, jetspec, make_target
from transformers import TrainingArguments

import hf_jetspec
from hf_jetspec import JetSpecHead, jetspec_generate
from hf_jetspec.drafters import HeadDrafter
from hf_jetspec.head import HeadContext
from hf_jetspec.prompts import is_held_out
from hf_jetspec.training import diagnose, vocab
from hf_jetspec.training.features import FeatureStore, build_feature_store, target_states, training_rows
from hf_jetspec.training.init import init_from_target
from hf_jetspec.training.loss import (
    depth_weights,
    forward_kl,
    head_block_hidden,
    jetspec_loss,
    sample_anchors,
    training_mask,
)
from hf_jetspec.training.trainer import AnchorCollator, SequenceDataset, StoreDataset, measure_tau, train_head
from hf_jetspec.training.vocab import coverage, frequent_tokens


def self_generated_rows(target, count=24, prompt_len=5, new=30, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        prompt = torch.randint(3, target.config.vocab_size, (1, prompt_len), generator=gen)
        out = greedy_reference(target, prompt, max_new_tokens=new)
        rows.append({"id": str(i), "input_ids": out[0].tolist(), "prompt_len": prompt_len})
    return rows


def loss_setup(family: str, seed: int, block_size: int, lengths: list[int], masked: bool):
    """A tiny target (``seed``), a fresh 1-layer head, random ids ``[b, max(lengths)]``, and the target's features
    and teacher logits for them (``masked``: an attention mask from ``lengths``)."""
    target = make_target(family, seed=seed)
    torch.manual_seed(seed + 1)
    head = JetSpecHead.for_target(target, block_size=block_size, num_hidden_layers=1)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    ids = torch.randint(3, 128, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(seed + 2))
    lengths = torch.tensor(lengths)
    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long() if masked else None
    features, final = target_states(target, ids, mask, head.config.target_layer_ids)
    return head, embed, lm_head, ids, lengths, features, lm_head(final)


def test_loss_matches_hand_computation():
    head, embed, lm_head, ids, lengths, features, teacher_logits = loss_setup("llama", 1, 4, [12, 9], masked=True)
    anchors = torch.tensor([[2, 7, 10], [4, 6, -1]])
    loss = jetspec_loss(head, features, ids, lengths, anchors, lambda b, p: teacher_logits[b, p], embed, lm_head,
                        temperature=1.5)
    # By hand: the inference drafting path for every anchor, then an explicit KL sum.
    terms = []
    for b in range(2):
        for a in anchors[b].tolist():
            if a < 0:
                continue
            logits = head.draft(HeadContext(), features[b, :a], int(ids[b, a]), embed, lm_head)  # [B-1, V]
            for k in range(1, 4):
                if a + k >= lengths[b]:
                    continue
                p = torch.softmax(teacher_logits[b, a + k - 1] / 1.5, -1)
                q = torch.softmax(logits[k - 1] / 1.5, -1)
                terms.append((p * (p.log() - q.log())).sum() * 1.5**2)
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)
    # The bf16 LM-head matmul (the fast CPU option) computes the same loss up to bf16 rounding.
    fast = jetspec_loss(head, features, ids, lengths, anchors, lambda b, p: teacher_logits[b, p], embed, lm_head,
                        temperature=1.5, logits_dtype=torch.bfloat16)
    assert fast.dtype == torch.float32 and fast != loss
    assert torch.allclose(fast, loss, rtol=2e-2)


def test_anchor_slot_and_out_of_range_slots_get_no_loss():
    target = make_target("qwen3")
    head = JetSpecHead.for_target(target, block_size=5, num_hidden_layers=1)
    ids = torch.randint(3, 128, (1, 10))
    features, _ = target_states(target, ids, None, head.config.target_layer_ids)
    asked = []

    def teacher(batch_index, positions):
        asked.extend(positions.tolist())
        return torch.zeros(len(positions), 128)

    jetspec_loss(head, features, ids, torch.tensor([10]), torch.tensor([[3, 7]]), teacher,
                 target.get_input_embeddings(), target.get_output_embeddings())
    # anchor 3: depths 1..4 -> teacher positions 3..6; anchor 7: depths 1, 2 (8, 9 < 10) -> 7, 8
    assert sorted(asked) == [3, 4, 5, 6, 7, 8]
    assert depth_weights(5, None).tolist() == [0, 1, 1, 1, 1]
    decay = depth_weights(5, 2.0)
    assert decay[0] == 0 and decay[1] == 1 and torch.all(decay[2:] < decay[1:-1])


def test_anchor_chunks_and_slot_sampling_keep_the_objective():
    head, embed, lm_head, ids, lengths, features, teacher_logits = loss_setup("qwen3", 4, 5, [16, 11], masked=False)

    def loss(**kw):
        return jetspec_loss(head, features, ids, lengths, torch.tensor([[1, 5, 9, 12], [2, 4, 7, -1]]),
                            lambda b, p: teacher_logits[b, p], embed, lm_head, **kw).detach()

    weighted = loss(decay=1.0)
    # Anchors run in chunks only to bound memory: the head's block states do not depend on the chunking.
    anchors = torch.tensor([[1, 5, 9, 12], [2, 4, 7, -1]])
    whole = head_block_hidden(head, features, ids, anchors, embed)
    assert torch.allclose(head_block_hidden(head, features, ids, anchors, embed, anchor_chunk=1), whole, atol=1e-5)
    # Slot sampling: unbiased for the weighted objective (up to the ratio estimator's small bias) ...
    gen = torch.Generator().manual_seed(7)
    sampled = torch.stack([loss(decay=1.0, sample_slots=True, generator=gen) for _ in range(400)])
    uniform = loss()
    assert abs(weighted - uniform) > 0.01  # the decay really changes the objective here
    assert abs(sampled.mean() - weighted) < 0.25 * abs(weighted - uniform)
    assert sampled.std() > 0  # ... and really random
    # With uniform weights every slot is kept: identical to the weighted loss.
    assert torch.allclose(loss(sample_slots=True, generator=gen), uniform, atol=1e-6)


def test_training_mask_by_rules():
    anchors = torch.tensor([[1, 4], [3, -1]])
    mask = training_mask(anchors, seq_len=6, block_size=3, causal=True)[:, 0]
    assert mask.shape == (2, 6, 6 + 6)
    for b in range(2):
        for j in range(2):
            for s in range(3):
                row = mask[b, j * 3 + s]
                a = anchors[b, j].item()
                assert row[:6].tolist() == [p < a for p in range(6)]
                assert row[6:].tolist() == [jj == j and ss <= s for jj in range(2) for ss in range(3)]
    full = training_mask(anchors, seq_len=6, block_size=3, causal=False)[0, 0]
    assert full[6:][:3].all() and not full[6 + 3 :].any()


def test_forward_kl_properties():
    logits = torch.randn(4, 10)
    assert torch.allclose(forward_kl(logits, logits), torch.zeros(4), atol=1e-6)
    assert (forward_kl(torch.randn(4, 10), logits) > 0).all()


def test_sample_anchors_stay_in_the_response():
    lengths, starts = torch.tensor([20, 8, 5]), torch.tensor([4, 6, 4])
    anchors = sample_anchors(lengths, starts, 6, torch.Generator().manual_seed(0))
    assert anchors.shape == (3, 6)
    assert all(4 <= a <= 18 for a in anchors[0].tolist())
    assert anchors[1].tolist()[:1] == [6] and anchors[1].tolist()[1:] == [-1] * 5
    assert anchors[2].tolist() == [-1] * 6  # start 4 == length - 1: no room for a supervised depth


def test_feature_store_equals_online_states(tmp_path):
    target = make_target("qwen3", seed=3)
    rows = self_generated_rows(target, count=6, new=12)
    layer_ids = [1, 2]
    build_feature_store(target, rows, layer_ids, tmp_path, shard_size=4, batch_tokens=40)
    store = FeatureStore(tmp_path)
    assert len(store) == 6 and store.layer_ids == layer_ids
    by_ids = {tuple(store[i]["input_ids"].tolist()): store[i] for i in range(len(store))}
    for row in rows:
        item = by_ids[tuple(row["input_ids"])]
        features, final = target_states(target, torch.tensor([row["input_ids"]]), None, layer_ids)
        assert torch.allclose(item["features"].float(), features[0], rtol=1e-2, atol=1e-2)
        assert torch.allclose(item["final"].float(), final[0], rtol=1e-2, atol=1e-2)
        assert item["prompt_len"] == row["prompt_len"]
    # Resumable: an existing shard is kept as is.
    before = (tmp_path / "shard_00000.safetensors").stat().st_mtime_ns
    build_feature_store(target, rows, layer_ids, tmp_path, shard_size=4)
    assert (tmp_path / "shard_00000.safetensors").stat().st_mtime_ns == before


def _args(tmp_path, steps):
    return TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=steps, learning_rate=3e-3,
                             per_device_train_batch_size=6, logging_steps=5, report_to=[], save_strategy="no",
                             remove_unused_columns=False, use_cpu=True, eval_strategy="no")


@pytest.mark.parametrize("source", ["online", "store"])
def test_training_lowers_the_loss_and_decodes_losslessly(tmp_path, source):
    target = make_target("qwen3", seed=4)
    rows = self_generated_rows(target, count=24, new=30)
    torch.manual_seed(0)
    head = JetSpecHead.for_target(target, block_size=6, num_hidden_layers=1)
    if source == "store":
        dataset = StoreDataset(FeatureStore(build_feature_store(target, rows, head.config.target_layer_ids,
                                                                tmp_path / "store")))
    else:
        dataset = SequenceDataset(rows)
    prompts = [r["input_ids"][:5] for r in rows[:3]]
    tau_before = measure_tau(target, head, prompts, 30)
    trainer = train_head(target, head, dataset, _args(tmp_path, 60), num_anchors=8, seed=0)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.7 * losses[0]
    assert measure_tau(target, head, prompts, 30) > tau_before  # it learned the target's own continuations
    trainer.save_model(str(tmp_path / "head"))
    loaded = JetSpecHead.from_pretrained(tmp_path / "head")
    for prompt in (torch.tensor([prompts[0]]), torch.tensor([[9, 8, 7]])):
        assert_same_tokens(greedy_reference(target, prompt, max_new_tokens=40),
                           jetspec(target, prompt, draft_head=loaded, max_new_tokens=40))


def test_collator_pads_and_anchors():
    items = [{"input_ids": torch.arange(10), "prompt_len": 4}, {"input_ids": torch.arange(6), "prompt_len": 2}]
    batch = AnchorCollator(num_anchors=3, seed=0)(items)
    assert batch["input_ids"].shape == (2, 10) and batch["lengths"].tolist() == [10, 6]
    assert batch["attention_mask"].sum(1).tolist() == [10, 6]
    assert ((batch["anchors"][0] >= 3) & (batch["anchors"][0] <= 8)).all()


def test_peft_lora_target(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = make_target("llama", seed=5)
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).eval()
    head = JetSpecHead.for_target(model, block_size=5, num_hidden_layers=1)
    rows = self_generated_rows(model, count=12, new=20)
    train_head(model, head, SequenceDataset(rows), _args(tmp_path, 10), num_anchors=4)
    prompt = torch.tensor([rows[0]["input_ids"][:5]])
    reference = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=30)
    with model.disable_adapter():
        without_lora = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=30)
    assert not torch.equal(reference, without_lora)  # the adapter matters, so the check below is meaningful
    out = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=30, custom_generate=jetspec_generate,
                         draft_head=head)
    assert_same_tokens(reference, out)
    # the assistant_model route: enable() on the PEFT wrapper enables the model whose generate() it calls (it
    # used to change only the wrapper's class, and generate() then told the user to call enable())
    wrapper_class = type(model)
    assert hf_jetspec.enable(model) is model and type(model) is wrapper_class
    out = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=30, assistant_model=head)
    assert_same_tokens(reference, out)


def test_frequent_tokens_rank_response_tokens():
    rows = [{"input_ids": [90, 91, 5, 5, 5, 6, 6, 7], "prompt_len": 2},  # prompt tokens 90, 91 are not counted
            {"input_ids": [92, 6, 8, 8, 8, 8], "prompt_len": 1}]
    # counts: 8 x4, 5 x3, 6 x3, 7 x1; ties by id; "always" ids (eos) first; filled up to 64 from unseen ids
    draft = frequent_tokens(rows, 64, always=[2], vocab_size=100)
    assert len(draft) == 64 and {2, 5, 6, 7, 8} <= set(draft) and 90 not in draft and draft == sorted(draft)
    assert frequent_tokens(rows, 64, always=[2]) == [2, 5, 6, 7, 8]  # no vocab size: only what occurs
    assert coverage(rows, [5, 6, 8]) == 10 / 11
    with pytest.raises(ValueError, match="draft vocabulary size"):
        frequent_tokens(rows, 3)


def test_more_data_files_keep_the_evaluation_set():
    """Evaluation rows come from the first file: adding a second file (more data, with a duplicate and a benchmark
    held-out conversation) keeps them, trains on the new rows and never moves a trained-on row into evaluation."""
    held_out_id = next(f"c{i}" for i in range(1000) if is_held_out(f"c{i}"))
    names = (f"r{i}" for i in range(1000) if not is_held_out(f"r{i}"))
    row = lambda token: {"id": next(names), "input_ids": [1, token, token], "prompt_len": 2}
    first = [row(i) for i in range(40)]
    train, evaluation = training_rows([first], 5, 3)
    assert len(train) == 35 and len(evaluation) == 5
    new = [row(100 + i) for i in range(30)]
    more = new + [dict(first[0], input_ids=[1, 99, 99]), {"id": held_out_id, "input_ids": [1, 98, 98], "prompt_len": 2}]
    train2, evaluation2 = training_rows([first, more], 5, 3)
    assert evaluation2 == evaluation
    assert {r["id"] for r in train2} == {r["id"] for r in train} | {r["id"] for r in new}
    assert len(train2) == 65 and not {tuple(p) for p in evaluation} & {tuple(r["input_ids"][:2]) for r in train2}
    assert training_rows([first], 5, 4)[1] != evaluation  # the seed picks the set


def test_vocab_cli_counts_the_rows_the_trainer_trains_on(tmp_path, capsys):
    """The vocabulary CLI leaves out what the trainer leaves out: benchmark held-out conversations and the
    --eval-count rows set aside for evaluation, so it reproduces the trainer's --draft-vocab."""

    held_out_id = next(f"c{i}" for i in range(1000) if is_held_out(f"c{i}"))
    rows = [{"id": f"r{i}", "input_ids": [1] + [10 + i] * 3, "prompt_len": 1} for i in range(70)]  # one token each
    rows.append({"id": held_out_id, "input_ids": [1, 5, 5, 5], "prompt_len": 1})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = make_target("llama", seed=0)
    head_dir = tmp_path / "head"
    JetSpecHead.for_target(target, block_size=4, num_hidden_layers=1).save_pretrained(head_dir)
    assert vocab.main(["--data", str(data), "--head", str(head_dir), "--size", "64", "--eval-count", "6"]) == 0
    kept, _ = training_rows([rows], 6, 0)
    saved = JetSpecHead.from_pretrained(head_dir).config.draft_vocab
    eos = target.config.eos_token_id
    assert saved == vocab.frequent_tokens(kept, 64, always=[eos], vocab_size=128) and eos in saved  # as the trainer
    assert 5 not in saved  # only the held-out conversation uses token 5
    set_aside = {r["input_ids"][1] for r in rows[:70]} - {r["input_ids"][1] for r in kept}
    assert len(set_aside) == 6 and not set_aside & set(saved)  # 64 kept rows fill the 64 slots: eval tokens stay out
    assert vocab.main(["--data", str(data), "--head", str(head_dir), "--size", "64", "--eval-count", "6",
                       "--eos"]) == 0  # no ids: nothing forced
    assert JetSpecHead.from_pretrained(head_dir).config.draft_vocab == vocab.frequent_tokens(kept, 64, vocab_size=128)
    assert "note:" not in capsys.readouterr().err
    old = JetSpecHead.for_target(target, block_size=4, num_hidden_layers=1)
    old.config.eos_token_id = None  # as heads saved before 6 December 2026
    old.save_pretrained(head_dir)
    assert vocab.main(["--data", str(data), "--head", str(head_dir), "--size", "64", "--eval-count", "6"]) == 0
    assert "names no eos_token_id" in capsys.readouterr().err  # said, not silently dropped
    assert vocab.main(["--data", str(data), "--head", str(head_dir), "--size", "64", "--eval-count", "6",
                       "--eos", str(eos)]) == 0
    assert "note:" not in capsys.readouterr().err and eos in JetSpecHead.from_pretrained(head_dir).config.draft_vocab


def test_acceptance_profile_by_hand():
    predicted = torch.tensor([[9, 1, 2, 3], [9, 1, 0, 3], [9, 0, 2, 3]])
    truth = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]).bool()  # the last anchor's slot 3 is past the end
    hits, chains, counts = diagnose.acceptance_profile(predicted, truth, valid)
    assert hits.tolist() == [2, 2, 2]  # the anchor slot (9 vs 0) is ignored
    assert chains.tolist() == [2, 1, 1]  # row 1 breaks at depth 2, row 2 at depth 1
    assert counts.tolist() == [3, 3, 2]


@pytest.mark.parametrize("family,causal", [("qwen3", True), ("llama", False)])
def test_depth_accuracy_counts_what_the_decoding_drafter_drafts(tmp_path, family, causal):
    """The teacher-forced profile equals one computed anchor by anchor through the decoding path (`HeadDrafter`,
    the target's greedy choice from a full forward), for causal and bidirectional heads, with a draft vocabulary,
    on text the (briefly trained) head has seen and on random text."""
    target = make_target(family, seed=5)
    seen = self_generated_rows(target, count=12, new=14, seed=2)
    torch.manual_seed(1)
    head = JetSpecHead.for_target(target, block_size=5, num_hidden_layers=1, causal=causal)
    train_head(target, head, SequenceDataset(seen), _args(tmp_path, 30), num_anchors=8, seed=0)
    head.config.draft_vocab = list(range(2, 100))
    rows = seen[:3] + [{"id": "x", "input_ids": torch.randint(3, 128, (19,)).tolist(), "prompt_len": 4}]
    got = diagnose.depth_accuracy(head, target, rows)
    hits, chains, count = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    for row in rows:
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            greedy = target(ids).logits[0].argmax(-1)
            features, _ = target_states(target, ids, None, head.config.target_layer_ids)
        for a in range(row["prompt_len"] - 1, ids.shape[1] - 1):
            drafter = HeadDrafter(head, target)
            drafter.observe(features[0, :a], None)
            drafted = drafter.propose(ids[:, : a + 1], depth=4).argmax(-1)
            run = True
            for k in range(1, 5):
                if a + k < ids.shape[1]:
                    right = bool(drafted[k - 1] == greedy[a + k - 1])
                    run = run and right
                    hits[k - 1] += right
                    chains[k - 1] += run
                    count[k - 1] += 1
    assert got["anchors"] == int(count[0]) == sum(len(r["input_ids"]) - r["prompt_len"] for r in rows)
    assert got["top1"] == pytest.approx((hits / count).tolist())
    assert got["chain"] == pytest.approx((chains / count).tolist())
    assert got["chain_tau"] == pytest.approx(1 + float((chains / count).sum()))
    assert 0 < got["chain"][0] < 1  # some drafts right, some wrong


def test_diagnose_cli_compares_held_out_and_training_rows(tmp_path, capsys):
    target = make_target("qwen3", seed=6)
    target.save_pretrained(tmp_path / "target")
    rows = self_generated_rows(target, count=7, new=10, seed=3)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = JetSpecHead.for_target(target, block_size=4, num_hidden_layers=1)
    head.save_pretrained(tmp_path / "head")
    common = ["--head", str(tmp_path / "head"), "--data", str(data), "--model", str(tmp_path / "target"),
              "--eval-count", "2", "--count", "3"]
    assert diagnose.main(common + ["--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["held_out"]["anchors"] == 2 * 10 and out["training"]["anchors"] == 3 * 10
    assert "held_out chain" in capsys.readouterr().out
    train, _ = training_rows([rows], 2, 0)  # what the trainer's store holds: its training rows
    store = build_feature_store(target, train, head.config.target_layer_ids, tmp_path / "store")
    # A trainer's store never holds the evaluation rows: their states are computed, the training rows are read.
    assert diagnose.main(common + ["--features", str(store), "--json", str(tmp_path / "stored.json")]) == 0
    printed = capsys.readouterr().out
    assert "held_out: the feature store lacks 2 of 2 rows" in printed and "training: the feature" not in printed
    stored = json.loads((tmp_path / "stored.json").read_text())
    assert stored["held_out"] == out["held_out"]
    assert stored["training"]["anchors"] == out["training"]["anchors"]


# ------------------------------------------------------------------------------------- regularisation / objective
def test_acceptance_loss_is_one_minus_the_sampling_acceptance():
    head, embed, lm_head, ids, lengths, features, teacher_logits = loss_setup("llama", 2, 4, [12, 9], masked=True)
    anchors = torch.tensor([[2, 7], [4, -1]])

    def loss(weight, temperature=1.0):
        return jetspec_loss(head, features, ids, lengths, anchors, lambda b, p: teacher_logits[b, p], embed, lm_head,
                            temperature=temperature, acceptance_weight=weight)

    # By hand: per supervised slot KL + lambda * (1 - sum min(p, q)), at temperature 1 for the acceptance part.
    kl, rejected = [], []
    for b in range(2):
        for a in anchors[b].tolist():
            if a < 0:
                continue
            logits = head.draft(HeadContext(), features[b, :a], int(ids[b, a]), embed, lm_head)
            for k in range(1, 4):
                if a + k < lengths[b]:
                    p, q = torch.softmax(teacher_logits[b, a + k - 1], -1), torch.softmax(logits[k - 1], -1)
                    rejected.append(1 - torch.minimum(p, q).sum())
    expected = loss(0.0) + 0.5 * torch.stack(rejected).mean()
    assert torch.allclose(loss(0.5), expected, atol=1e-5)
    # Tempered KL, untempered acceptance: the added term is the same at T = 2.
    assert torch.allclose(loss(0.5, 2.0) - loss(0.0, 2.0), expected - loss(0.0), atol=1e-5)
    # It trains: the term has a gradient through the head.
    head.zero_grad()
    (loss(1.0) - loss(0.0)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_dropout_acts_only_while_training():
    target = make_target("qwen3", seed=1)
    head = JetSpecHead.for_target(target, block_size=4, num_hidden_layers=2)
    ids = torch.randint(3, 128, (1, 12))
    features, _ = target_states(target, ids, None, head.config.target_layer_ids)
    anchors = torch.tensor([[3, 7]])
    embed = target.get_input_embeddings()
    plain = head_block_hidden(head, features, ids, anchors, embed)
    head.config.dropout = 0.3
    regular = JetSpecHead(head.config)
    regular.load_state_dict(head.state_dict())
    regular.eval()
    assert torch.equal(head_block_hidden(regular, features, ids, anchors, embed), plain)  # decoding: unchanged
    regular.train()
    assert not torch.allclose(head_block_hidden(regular, features, ids, anchors, embed), plain)
    with pytest.raises(ValueError, match="dropout"):
        head.config.dropout = 1.0
        head.config.validate_head()


def test_fixed_anchors_repeat_per_sequence_and_fresh_ones_do_not():
    items = [{"input_ids": torch.arange(40), "prompt_len": 4, "index": i} for i in (3, 8)]
    fixed = AnchorCollator(num_anchors=5, seed=1, fixed_anchors=True)
    first = fixed(items)["anchors"]
    assert torch.equal(fixed(items)["anchors"], first)  # the next epoch: the same anchors
    assert torch.equal(fixed(items[::-1])["anchors"], first.flip(0))  # per sequence, wherever it sits in a batch
    assert not torch.equal(first[0], first[1])
    fresh = AnchorCollator(num_anchors=5, seed=1)
    assert not torch.equal(fresh(items)["anchors"], fresh(items)["anchors"])


def test_cap_prompts_keeps_answers_and_the_prompt_tail():
    from hf_jetspec.training.features import cap_prompts

    rows = [{"id": "a", "input_ids": list(range(10)), "prompt_len": 6},
            {"id": "b", "input_ids": list(range(5)), "prompt_len": 2}]
    capped = cap_prompts(rows, 3)
    assert capped[0]["input_ids"] == [3, 4, 5, 6, 7, 8, 9] and capped[0]["prompt_len"] == 3
    assert capped[1] == rows[1] and cap_prompts(rows, None) is rows
    assert rows[0]["prompt_len"] == 6  # the caller's rows are not changed


def test_depth_accuracy_with_stored_states_and_anchor_stride():
    target = make_target("llama", seed=3)
    rows = self_generated_rows(target, count=3, new=20, seed=5)
    head = JetSpecHead.for_target(target, block_size=4, num_hidden_layers=1)
    online = diagnose.depth_accuracy(head, target, rows)
    stored = diagnose.with_target_states(target, rows, head.config.target_layer_ids)
    assert stored[0]["features"].dtype == torch.bfloat16 and "features" not in rows[0]
    assert diagnose.depth_accuracy(head, target, stored)["anchors"] == online["anchors"] == 3 * 20
    strided = diagnose.depth_accuracy(head, target, stored, anchor_stride=3)
    assert strided["anchors"] == 3 * 7  # positions 4, 7, ..., 22 of each response


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_init_from_target_copies_the_top_layers_and_passes_the_deepest_tap(family):
    target = make_target(family, seed=6, layers=4)
    torch.manual_seed(0)
    head = JetSpecHead.for_target(target, num_hidden_layers=2, block_size=4, target_layer_ids=[2, 0, 1])
    copied = init_from_target(head, target)
    assert copied["layers"] == [2, 3]
    decoder = target.get_decoder()
    for mine, theirs in zip(head.layers, decoder.layers[2:]):
        source = theirs.state_dict()
        for name, param in mine.named_parameters():
            if name in source:
                assert torch.equal(param, source[name]), name
    assert torch.equal(head.norm.weight, decoder.norm.weight)
    norms = [f"layers.{i}.self_attn.{n}_norm.weight" for i in range(2) for n in "qk"]
    assert copied["kept"] == ([] if family == "qwen3" else norms)  # Llama has no q/k norms: they stay ones
    features = torch.randn(1, 5, 3 * head.config.hidden_size)
    deepest = features[..., : head.config.hidden_size]  # tap 2 comes first in this head's taps
    assert torch.allclose(head.fuse(features), head.hidden_norm(deepest), atol=1e-6)
    prompt = torch.tensor([[5, 9, 4, 7]])
    assert_same_tokens(greedy_reference(target, prompt, max_new_tokens=24),
                       jetspec(target, prompt, draft_head=head, max_new_tokens=24))


def test_init_from_target_refuses_a_head_of_another_shape():
    target = make_target("llama", seed=6, layers=2)
    wide = JetSpecHead.for_target(target, num_hidden_layers=1, intermediate_size=96)
    before = {k: v.clone() for k, v in wide.state_dict().items()}
    with pytest.raises(ValueError, match=r"not sized for it.*mlp\.gate_proj\.weight: head \(96, 64\) != target \(128, 64\)"):
        init_from_target(wide, target)
    deep = JetSpecHead.for_target(target, num_hidden_layers=3)
    with pytest.raises(ValueError, match="the head has 3 layers; the target only 2"):
        init_from_target(deep, target)
    assert all(torch.equal(v, before[k]) for k, v in wide.state_dict().items())  # refused: nothing half-copied


@pytest.mark.parametrize("model_type,extra", [
    ("llama", dict()),
    ("gemma2", dict(head_dim=16, final_logit_softcapping=2.0)),  # soft-capping (Gemma 2 / 3 / 3n / 4)
    ("granite", dict(logits_scaling=8.0)),  # Granite divides its logits
    ("cohere", dict(logit_scale=0.25)),  # Cohere multiplies them
])
def test_teacher_is_the_targets_own_distribution(model_type, extra):
    """The teacher is built from the target's final hidden states (stored in feature stores); it was
    ``lm_head(final)``, which for these families is not the target's logits (Granite's are 8x flatter here), so a
    head learnt another distribution. `teacher_transform` adds their post-processing; `check_teacher` refuses a
    target whose logits it cannot reproduce."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_jetspec.training.features import check_teacher, teacher_transform

    config = AutoConfig.for_model(model_type, vocab_size=96, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                  initializer_range=0.5, **extra)
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = target(ids).logits
        _, final = target_states(target, ids, None, [0])
        raw = target.get_output_embeddings()(final)
    transform = teacher_transform(target)
    assert torch.allclose(transform(raw), logits, atol=1e-5)
    assert extra == {} or not torch.allclose(raw, logits, atol=1e-2)  # the families where this matters
    check_teacher(target, transform)
    with pytest.raises(ValueError, match="post-processes them"):
        check_teacher(target, lambda x: 3 * transform(x))


@pytest.mark.parametrize("module, argv, message", [
    ("features", ["--data", "x", "--out", "y", "--layers", "1", "-2"], "--layers must be target layer indices >= 0"),
    ("features", ["--data", "x", "--out", "y", "--layers", "1", "--max-prompt-tokens", "0"],
     "--max-prompt-tokens must be >= 1, got 0"),
    ("diagnose", ["--head", "h", "--data", "x", "--anchor-stride", "0"], "--anchor-stride must be >= 1, got 0"),
    ("diagnose", ["--head", "h", "--data", "x", "--count", "-1"], "--count must be >= 0, got -1"),
    ("vocab", ["--data", "x", "--head", "h", "--size", "0"], "--size must be >= 1, got 0"),
    ("calibrate", ["--out", "o", "--per-source", "0"], "--per-source must be >= 1, got 0"),
    ("sources", ["math", "--per-module", "0"], "--per-module must be >= 1, got 0"),
    ("sources", ["magpie", "--count", "4", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    ("sources", ["magpie", "--count", "4", "--top-p", "0"], "--top-p in (0, 1]"),
])
def test_training_tools_name_counts_out_of_range(module, argv, message, capsys):
    """The training tools' counts are checked by their parsers before anything loads (an anchor stride of 0 was
    `torch.arange`'s traceback after the target loaded)."""
    import importlib

    main = importlib.import_module(f"hf_jetspec.training.{module}").main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
