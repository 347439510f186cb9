"""Export to vLLM's DFlash layout (`hf_jetspec.export_vllm`) and back: identical drafts after export -> load, the
config vLLM reads, the draft-vocabulary form (d2t + the target's LM-head rows), refusals. No vLLM needed."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_target
from safetensors.torch import load_file, save_file

from hf_jetspec import HeadDrafter, JetSpecHead
from hf_jetspec.cli import main
from hf_jetspec.export_vllm import ExportError, export_vllm

VARIANTS = {
    "causal": dict(),
    "bidirectional+bias": dict(causal=False, attention_bias=True),
    "unsorted-taps": dict(target_layer_ids=[3, 0, 2]),
    "draft-vocab": dict(draft_vocab=list(range(0, 128, 2))),
}


def random_head(target, seed=0, **overrides) -> JetSpecHead:
    torch.manual_seed(seed)
    fields = dict(num_taps=2, num_hidden_layers=2, block_size=6, mask_token_id=5) | overrides
    head = JetSpecHead.for_target(target, **fields).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a mixed-up weight would show
        for name, param in head.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return head


def aligned(head: JetSpecHead) -> JetSpecHead:
    """``head`` with its weights copied into fresh memory. from_pretrained memory-maps safetensors, whose tensors
    may start off a 64-byte boundary; CPU matmul kernels then take another path and differ in the last ulp (a
    save -> load round trip in this library's own layout shows the same), which is not what these tests compare."""
    for param in head.parameters():
        param.data = param.data.clone()
    return head


def drafts(head, target, features, taps, depth=None):
    """Logits of three drafting rounds (features for the head's own tap order, reordered from ``taps`` order)."""
    hidden = target.config.hidden_size
    blocks = features.split(hidden, dim=-1)
    features = torch.cat([blocks[taps.index(t)] for t in head.config.target_layer_ids], dim=-1)
    drafter = HeadDrafter(head, target)
    drafter.start()
    tokens, seen, out = torch.arange(7, 27)[None], 0, []
    depth = head.config.block_size - 1 if depth is None else depth
    for n in (4, 1, 2):  # prompt of 4 committed positions, then rounds committing 1 and 2 more
        ids = tokens[:, : seen + n + 1]  # the committed positions and the anchor
        drafter.observe(features[seen : seen + n], None)
        out.append(drafter.propose(ids, depth))
        seen += n
    return torch.cat(out)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_round_trip_drafts_identically(tmp_path, variant):
    target = make_target("llama")
    head = random_head(target, **VARIANTS[variant])
    export_vllm(head, tmp_path, target=target)
    loaded = aligned(JetSpecHead.from_pretrained(tmp_path))
    taps = head.config.target_layer_ids
    assert loaded.config.target_layer_ids == sorted(taps)
    for field in ("block_size", "mask_token_id", "causal", "draft_vocab", "tree_budget", "tree_width", "rope_theta",
                  "attention_bias", "num_hidden_layers", "head_dim", "target_num_layers", "vocab_size",
                  "bos_token_id", "eos_token_id", "pad_token_id"):  # the target's ids: pipelines compare them
        assert getattr(loaded.config, field) == getattr(head.config, field), field
    features = torch.randn(7, len(taps) * target.config.hidden_size)
    expected, got = drafts(head, target, features, taps), drafts(loaded, target, features, taps)
    if taps == sorted(taps):
        assert torch.equal(expected, got)
    else:  # the fc column blocks are permuted: the same sums in another order
        torch.testing.assert_close(expected, got, rtol=1e-5, atol=1e-5)
    # a causal head also drafts a shallower block identically (vLLM's num_speculative_tokens < block_size - 1)
    if head.config.causal and taps == sorted(taps):
        assert torch.equal(drafts(head, target, features, taps, depth=2), drafts(loaded, target, features, taps, 2))


def test_exported_config_and_weights_are_what_vllm_reads(tmp_path):
    target = make_target("llama")
    head = random_head(target, draft_vocab=[4, *range(1, 128, 2)], target_layer_ids=[2, 0])  # irregular d2t
    export_vllm(head, tmp_path, target=target)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"block_size": 6, "mask_token_id": 5, "target_layer_ids": [0, 2],
                                       "causal": True, "causal_head": True, "use_aux_hidden_state": True}
    assert config["num_target_layers"] == 4 and config["block_size"] == 6 and config["hidden_act"] == "silu"
    assert config["rope_parameters"]["rope_theta"] == head.config.rope_theta
    assert config["draft_vocab_size"] == len(head.config.draft_vocab) and config["vocab_size"] == 128
    state = load_file(tmp_path / "model.safetensors")
    ids = torch.tensor(head.config.draft_vocab)
    assert torch.equal(torch.arange(len(ids)) + state["d2t"], ids)  # vLLM: target id = draft index + d2t
    assert torch.equal(state["lm_head.weight"], target.lm_head.weight[ids])
    hidden = target.config.hidden_size
    assert torch.equal(state["fc.weight"][:, :hidden], head.fc.weight[:, hidden:])  # tap 0 first
    own = {k for k in state if k not in ("d2t", "lm_head.weight")}
    assert own == set(head.state_dict())  # the head's own names, unchanged (vLLM fuses q/k/v and gate/up itself)


def test_draft_vocab_needs_the_target_or_an_explicit_drop(tmp_path):
    target = make_target("llama")
    head = random_head(target, draft_vocab=list(range(64)))
    with pytest.raises(ExportError, match="reduced vocabulary.*--target"):
        export_vllm(head, tmp_path)
    export_vllm(head, tmp_path, drop_draft_vocab=True)
    assert "d2t" not in load_file(tmp_path / "model.safetensors")
    assert "draft_vocab_size" not in json.loads((tmp_path / "config.json").read_text())
    assert JetSpecHead.from_pretrained(tmp_path).config.draft_vocab is None
    with pytest.raises(ValueError, match="hidden size"):
        export_vllm(head, tmp_path, target=make_target("llama", hidden=96))


def test_checkpoints_jetspec_cannot_use_are_refused(tmp_path):
    target = make_target("llama")
    export_vllm(random_head(target), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file(state | {"lm_head.weight": target.lm_head.weight.detach().clone()}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="own lm_head"):
        JetSpecHead.from_pretrained(tmp_path)
    save_file(state | {"embed_tokens.weight": target.lm_head.weight.detach().clone()}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="embed_tokens"):
        JetSpecHead.from_pretrained(tmp_path)


def reshard(folder, parts: int = 2) -> None:
    """Split ``folder``'s model.safetensors into ``parts`` shards plus model.safetensors.index.json (the layout of
    ``save_pretrained(max_shard_size=...)`` and of large checkpoints on the Hub)."""
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    keys, weight_map = sorted(state), {}
    for i in range(parts):
        name = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        save_file({k: state[k] for k in keys[i::parts]}, folder / name, metadata={"format": "pt"})
        weight_map |= {k: name for k in keys[i::parts]}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("parts", [2, 3])
def test_a_sharded_checkpoint_keeps_its_draft_vocabulary(tmp_path, parts):
    """d2t and lm_head.weight read from the shards an index names: a sharded DFlash-layout head loaded before
    6 December without its draft vocabulary (drafting over the whole vocabulary it was not trained for)."""
    target = make_target("llama")
    head = random_head(target, draft_vocab=[4, *range(1, 128, 2)], target_layer_ids=[2, 0])
    export_vllm(head, tmp_path, target=target)
    single = JetSpecHead.from_pretrained(tmp_path)
    reshard(tmp_path, parts)
    sharded = JetSpecHead.from_pretrained(tmp_path)
    assert sharded.config.draft_vocab == single.config.draft_vocab == sorted(head.config.draft_vocab)
    for a, b in zip(single.state_dict().values(), sharded.state_dict().values()):
        assert torch.equal(a, b)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard = tmp_path / index["weight_map"].pop("d2t")  # a whole-vocabulary lm_head: the shards without d2t
    save_file({k: v for k, v in load_file(shard).items() if k != "d2t"}, shard, metadata={"format": "pt"})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="ships its own lm_head over the whole vocabulary"):
        JetSpecHead.from_pretrained(tmp_path)


def test_cli_export(tmp_path, capsys):
    target = make_target("qwen3")
    random_head(target).save_pretrained(tmp_path / "head")
    assert main(["export-vllm", str(tmp_path / "head"), str(tmp_path / "out")]) == 0
    assert '"method": "dflash"' in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    random_head(target, draft_vocab=list(range(64))).save_pretrained(tmp_path / "vocab")
    assert main(["export-vllm", str(tmp_path / "vocab"), str(tmp_path / "out2")]) == 2
    assert "--drop-draft-vocab" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_head_round_trip_on_smollm2(tmp_path):
    """The shipped SmolLM2 head (draft vocabulary of 16,384 tokens): exported with the target's LM-head rows, loaded
    back, it drafts identical logits and JetSpec accepts identically on a real prompt."""
    from hf_jetspec.bench import encode_prompt
    from hf_jetspec.decoding.jetspec import jetspec_generate
    from hf_jetspec.models import default_head, default_model

    model, tokenizer = default_model()
    head = aligned(default_head(model))
    assert main(["export-vllm", "default", str(tmp_path)]) == 0  # the CLI finds the embedded target itself
    loaded = aligned(JetSpecHead.from_pretrained(tmp_path).to(head.fc.weight.dtype))
    assert loaded.config.draft_vocab == head.config.draft_vocab
    state = load_file(tmp_path / "model.safetensors")
    assert torch.equal(state["lm_head.weight"], model.lm_head.weight[torch.tensor(head.config.draft_vocab)])
    features = torch.randn(9, 3 * 576)
    taps = head.config.target_layer_ids
    assert torch.equal(drafts(head, model, features, taps), drafts(loaded, model, features, taps))
    ids = encode_prompt(tokenizer, "Explain in two sentences why the sky is blue.")
    runs = [model.generate(ids, do_sample=False, max_new_tokens=32, custom_generate=jetspec_generate, draft_head=h,
                           retrieval=False, return_dict_in_generate=True) for h in (head, loaded)]  # the head alone
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].accept_lengths == runs[1].accept_lengths
