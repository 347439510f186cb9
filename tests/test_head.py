"""JetSpecHead: construction for a target, compatibility errors, save/load/push, the reference checkpoint layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import assert_same_tokens, greedy_reference, jetspec, make_target
from safetensors.torch import save_file
from transformers import AutoModel

import hf_jetspec
from hf_jetspec import JetSpecConfig, JetSpecHead
from hf_jetspec.head import HeadContext


def test_for_target_sizes_the_head(tiny_target):
    head = JetSpecHead.for_target(tiny_target, num_taps=2, num_hidden_layers=1, block_size=8)
    text = tiny_target.config
    assert head.config.hidden_size == text.hidden_size
    assert head.config.vocab_size == text.vocab_size
    assert head.config.target_num_layers == text.num_hidden_layers
    assert head.config.block_size == 8 and len(head.layers) == 1
    assert head.fc.in_features == len(head.config.target_layer_ids) * text.hidden_size
    names = {name.split(".")[0] for name, _ in head.named_parameters()}
    assert names == {"fc", "hidden_norm", "layers", "norm"}  # no embeddings, no LM head


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden=96, heads=4), "hidden size"),
        (dict(vocab=256), "vocabulary"),
        (dict(layers=6), "layers"),
    ],
)
def test_wrong_target_is_refused(change, message):
    head = JetSpecHead.for_target(make_target("qwen3"))
    other = make_target("qwen3", **change)
    with pytest.raises(ValueError, match=message):
        jetspec(other, torch.tensor([[5, 6, 7]]), draft_head=head, max_new_tokens=4)
    # The assistant_model route says the same (for another vocabulary generate()'s own check used to ask for a
    # second tokenizer first).
    with pytest.raises(ValueError, match=f"made for another target.*{message}"):
        hf_jetspec.enable(other).generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=4,
                                          assistant_model=head)


def test_model_type_mismatch_is_refused():
    head = JetSpecHead.for_target(make_target("qwen3"))
    with pytest.raises(ValueError, match="model type"):
        head.check_target(make_target("llama"))


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="target_layer_ids"):
        JetSpecConfig(target_layer_ids=[9], target_num_layers=4)
    with pytest.raises(ValueError, match="block_size"):
        JetSpecConfig(block_size=1)
    with pytest.raises(ValueError, match="mask_token_id"):
        JetSpecConfig(mask_token_id=500, vocab_size=100)


def test_save_load_round_trip(tmp_path, family):
    model = make_target(family)
    torch.manual_seed(3)
    head = JetSpecHead.for_target(model, block_size=6, tree_budget=12, base_model="tiny/target")
    head.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors", "README.md"}
    loaded = JetSpecHead.from_pretrained(tmp_path)
    for key in ("block_size", "target_layer_ids", "mask_token_id", "vocab_size", "target_model_type", "base_model"):
        assert getattr(loaded.config, key) == getattr(head.config, key), key
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert isinstance(AutoModel.from_pretrained(tmp_path), JetSpecHead)
    # Same drafts from the loaded head.
    features = torch.randn(5, head.fc.in_features)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    a = head.draft(HeadContext(), features, 7, embed, lm_head)
    b = loaded.draft(HeadContext(), features, 7, embed, lm_head)
    assert torch.equal(a, b)
    card = (tmp_path / "README.md").read_text()
    assert "base_model: tiny/target" in card and "library_name: hf-jetspec" in card
    assert loaded.config.tree_budget == 12


def test_corrupt_checkpoints_raise(tmp_path):
    head = JetSpecHead.for_target(make_target("qwen3"), num_hidden_layers=1)
    head.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in head.state_dict().items()}
    # A missing weight must not be silently re-initialised.
    save_file({k: v for k, v in state.items() if not k.startswith("norm")}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="does not match .*config.json: missing norm.weight"):
        JetSpecHead.from_pretrained(tmp_path)
    # A truncated file.
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(OSError, match="model.safetensors: not a complete safetensors file"):
        JetSpecHead.from_pretrained(tmp_path)


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_load_errors_are_one_line_and_name_the_file(tmp_path):
    """Each way a head folder can be wrong is one line naming the file and the problem; weights are never
    re-initialised (issue 19, item 3)."""
    head = JetSpecHead.for_target(make_target("llama"), num_hidden_layers=1)
    good = tmp_path / "good"
    head.save_pretrained(good)

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(good, folder)
        return folder

    with pytest.raises(FileNotFoundError) as err:  # not "Repo id must be in the form ..."
        JetSpecHead.from_pretrained(tmp_path / "missing")
    assert "no such folder" in _one_line(err) and "Repo id" not in str(err.value)
    with pytest.raises(NotADirectoryError, match="is a file"):
        JetSpecHead.from_pretrained(good / "config.json")

    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) - 10])
    with pytest.raises(OSError) as err:
        JetSpecHead.from_pretrained(truncated)
    assert f"{truncated / 'model.safetensors'}: not a complete safetensors file" in _one_line(err)

    mismatch = copy("mismatch")
    config = json.loads((mismatch / "config.json").read_text())
    config["intermediate_size"] += 8
    (mismatch / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        JetSpecHead.from_pretrained(mismatch)
    message = _one_line(err)
    assert "model.safetensors does not match" in message and "by the config" in message

    no_config = copy("no_config")
    (no_config / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        JetSpecHead.from_pretrained(no_config)
    bad_json = copy("bad_json")
    (bad_json / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        JetSpecHead.from_pretrained(bad_json)
    other = copy("other")
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ValueError, match="config.json: not a JetSpec head config .model_type 'llama'"):
        JetSpecHead.from_pretrained(other)
    invalid = copy("invalid")
    (invalid / "config.json").write_text(json.dumps(config | {"block_size": 1}))
    with pytest.raises(ValueError, match="config.json: Invalid JetSpecConfig: block_size must be >= 2"):
        JetSpecHead.from_pretrained(invalid)
    no_weights = copy("no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        JetSpecHead.from_pretrained(no_weights)
    assert isinstance(JetSpecHead.from_pretrained(good), JetSpecHead)


def test_push_to_hub_uploads_weights_config_and_card(tmp_path, monkeypatch):
    import huggingface_hub

    uploaded = {}

    class Repo:
        repo_id = "me/head"

    def fake_create_repo(self, repo_id, **kwargs):
        uploaded["create"] = repo_id
        return Repo()

    def fake_upload_folder(self, *, repo_id, folder_path, **kwargs):
        from pathlib import Path

        uploaded["files"] = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
        uploaded["repo"] = repo_id

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", fake_create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", fake_upload_folder)
    head = JetSpecHead.for_target(make_target("llama"), base_model="org/base",
                                  training_summary={"datasets": ["sharegpt"], "tau_mt_bench": 3.7})
    head.push_to_hub("me/head")
    assert uploaded["create"] == "me/head" and uploaded["repo"] == "me/head"
    assert set(uploaded["files"]) == {"config.json", "model.safetensors", "README.md"}
    card = uploaded["files"]["README.md"].decode()
    assert "base_model: org/base" in card and "- sharegpt" in card and "3.7" in card


def write_reference_checkpoint(path, target, *, causal: bool, layers=2, taps=(1, 2), block=8, seed=0):
    """A checkpoint in the reference JetSpec/DFlash layout: Qwen3Config fields + block_size + dflash_config, and
    DFlashDraftModel weight names (fc, hidden_norm, layers.*, norm)."""
    hidden, heads, kv_heads, head_dim, inter = target.config.hidden_size, 4, 2, 16, 96
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "vocab_size": target.config.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "block_size": block,
        "num_target_layers": target.config.num_hidden_layers,
        "dflash_config": {"mask_token_id": 3, "target_layer_ids": list(taps), "causal_head": causal},
    }
    gen = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.05

    state = {"fc.weight": w(hidden, len(taps) * hidden), "hidden_norm.weight": 1 + w(hidden), "norm.weight": 1 + w(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        state |= {
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": 1 + w(head_dim),
            p + "self_attn.k_norm.weight": 1 + w(head_dim),
            p + "input_layernorm.weight": 1 + w(hidden),
            p + "post_attention_layernorm.weight": 1 + w(hidden),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(state, path / "model.safetensors")
    return state


@pytest.mark.parametrize("causal", [True, False])
def test_reference_layout_checkpoint_loads_and_decodes(tmp_path, causal):
    target = make_target("qwen3")
    state = write_reference_checkpoint(tmp_path, target, causal=causal)
    head = JetSpecHead.from_pretrained(tmp_path)
    cfg = head.config
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.causal) == (8, 3, [1, 2], causal)
    assert (cfg.num_hidden_layers, cfg.head_dim, cfg.rope_theta, cfg.target_num_layers) == (2, 16, 1e6, 4)
    loaded = head.state_dict()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    prompt = torch.tensor([[5, 9, 17, 33]])
    assert_same_tokens(greedy_reference(target, prompt, max_new_tokens=24),
                       jetspec(target, prompt, draft_head=head, max_new_tokens=24))


def test_reference_layout_default_taps(tmp_path):
    target = make_target("qwen3", layers=8)
    write_reference_checkpoint(tmp_path, target, causal=True, layers=3, taps=(1, 3, 5))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["dflash_config"]["target_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    head = JetSpecHead.from_pretrained(tmp_path)
    assert head.config.target_layer_ids == [1, 3, 5]  # the reference rule for 8 target layers, 3 head layers


def test_causal_block_mask_makes_depth_independent_of_later_slots():
    """With causal in-block attention, depth d's logits do not depend on what sits in later block slots."""
    target = make_target("llama")
    torch.manual_seed(0)
    head = JetSpecHead.for_target(target, block_size=6)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    features = torch.randn(4, head.fc.in_features)
    base = head.draft(HeadContext(), features, 7, embed, lm_head)
    head.config.mask_token_id = 9  # changes every mask slot; depth 1 sees only anchor + its own mask slot
    changed = head.draft(HeadContext(), features, 7, embed, lm_head)
    assert not torch.allclose(base, changed)
    head.config.causal = False
    bidirectional = head.draft(HeadContext(), features, 7, embed, lm_head)
    assert not torch.allclose(changed, bidirectional)


@pytest.mark.parametrize("causal", [True, False])
def test_draft_depth_returns_the_first_depths_of_the_full_block(causal):
    """``depth=D`` returns the full block's first D rows (a causal head decodes only D + 1 slots, a bidirectional
    one the whole block); D = 0 still takes in the new context; D past the block is clipped."""
    target = make_target("qwen3")
    torch.manual_seed(2)
    head = JetSpecHead.for_target(target, block_size=7)
    head.config.causal = causal
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    features = torch.randn(10, head.fc.in_features)
    full = head.draft(HeadContext(), features, 3, embed, lm_head)
    assert full.shape[0] == 6
    for depth in (0, 1, 3, 6, 20):
        ctx = HeadContext()
        out = head.draft(ctx, features, 3, embed, lm_head, depth=depth)
        assert ctx.length == 10
        assert out.shape == (min(depth, 6), full.shape[1])
        assert torch.allclose(out, full[: out.shape[0]], atol=1e-5)


def test_incremental_context_equals_full_context():
    """Feeding the context in several rounds (the decode loop) equals feeding it at once."""
    target = make_target("qwen3")
    torch.manual_seed(1)
    head = JetSpecHead.for_target(target, block_size=5)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    features = torch.randn(9, head.fc.in_features)
    full = head.draft(HeadContext(), features, 11, embed, lm_head)
    ctx = HeadContext()
    for chunk in features.split([4, 1, 4]):
        out = head.draft(ctx, chunk, 11, embed, lm_head)
    assert torch.allclose(full, out, atol=1e-5)


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_bf16_head_drafts_for_a_float32_target(family, draft_vocab):
    """A head cast to bfloat16 (what `default_head` does on CPUs with fast bf16) keeps float32 RoPE frequencies,
    drafts close to its float32 self at far positions, projects in bf16 when it has a draft vocabulary, and the float32
    target's greedy output stays exact."""
    from hf_jetspec.drafters import HeadDrafter

    model = make_target(family, seed=6)
    vocab = None
    if draft_vocab:
        vocab = sorted(torch.randperm(128, generator=torch.Generator().manual_seed(3))[:96].tolist())
    torch.manual_seed(0)
    head = JetSpecHead.for_target(model, num_hidden_layers=2, block_size=6, draft_vocab=vocab)
    fp32 = HeadDrafter(head, model)
    features = torch.randn(300, fp32.head.fc.in_features)
    reference = head.draft(HeadContext(), features, 5, fp32.embed, fp32.lm_head).softmax(-1)
    head = head.to(torch.bfloat16)
    assert head.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(head.rotary.inv_freq, head.rotary.frequencies())
    drafter = HeadDrafter(head, model)
    if draft_vocab:
        assert drafter.lm_head.weight.dtype == torch.bfloat16
    probs = head.draft(HeadContext(), features, 5, drafter.embed, drafter.lm_head).float().softmax(-1)
    assert (probs - reference).abs().max() < 0.05
    gen = torch.Generator().manual_seed(4)
    for length, budget, new in [(2, 8, 30), (6, 32, 25), (3, 1, 10)]:
        prompt = torch.randint(3, 128, (1, length), generator=gen)
        assert_same_tokens(greedy_reference(model, prompt, max_new_tokens=new),
                           jetspec(model, prompt, draft_head=head, tree_budget=budget, max_new_tokens=new),
                           f"length={length} budget={budget}")


def test_head_dtype_policy():
    """bf16 for a float32 target where bf16 matmuls are fast (this CPU: AVX-512), the target's dtype otherwise."""
    from hf_jetspec.models import head_dtype

    fast = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert head_dtype(torch.zeros(1)) == (torch.bfloat16 if fast else torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        assert head_dtype(torch.zeros(1, dtype=dtype)) == dtype
    # an offloaded target's parameters sit on meta; the policy follows the device it computes on
    meta = torch.zeros(1, device="meta")
    assert head_dtype(meta) == torch.float32
    assert head_dtype(meta, torch.device("cpu")) == head_dtype(torch.zeros(1))


def test_same_device_reads_the_default_index():
    from hf_jetspec.devices import same_device

    assert same_device(torch.device("cuda"), torch.device("cuda:0"))
    assert same_device(torch.device("cpu"), torch.device("cpu"))
    assert not same_device(torch.device("cuda:1"), torch.device("cuda"))
    assert not same_device(torch.device("cpu"), torch.device("cuda:0"))


def test_draft_vocabulary(tmp_path, family):
    """A head with a draft vocabulary projects onto those tokens only (its logits there equal the full
    projection's, -inf elsewhere), greedy outputs stay identical to plain generate, it survives save/load, and
    malformed vocabularies are refused."""
    from hf_jetspec.drafters import DraftVocabProjection

    model = make_target(family, seed=5)
    ids = sorted(torch.randperm(128, generator=torch.Generator().manual_seed(1))[:64].tolist())
    torch.manual_seed(0)
    head = JetSpecHead.for_target(model, num_hidden_layers=1, block_size=6, draft_vocab=ids)
    features = torch.randn(7, len(head.config.target_layer_ids) * model.config.hidden_size)
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    full = head.draft(HeadContext(), features, 5, embed, lm_head)
    restricted = head.draft(HeadContext(), features, 5, embed, DraftVocabProjection(lm_head, ids))
    inside = torch.zeros(128, dtype=torch.bool)
    inside[ids] = True
    assert torch.allclose(restricted[:, inside], full[:, inside], atol=1e-5)
    assert torch.isneginf(restricted[:, ~inside]).all()
    gen = torch.Generator().manual_seed(2)
    for length, budget, new in [(1, 8, 30), (4, 32, 25), (9, 64, 40), (3, 1, 12)]:
        prompt = torch.randint(3, 128, (1, length), generator=gen)
        assert_same_tokens(greedy_reference(model, prompt, max_new_tokens=new),
                           jetspec(model, prompt, draft_head=head, tree_budget=budget, max_new_tokens=new),
                           f"length={length} budget={budget}")
    head.save_pretrained(tmp_path)
    assert JetSpecHead.from_pretrained(tmp_path).config.draft_vocab == ids
    assert "64 most frequent tokens" in (tmp_path / "README.md").read_text()
    for bad in ([1, 2, 3], list(range(60)) + [500] * 4, [7] * 64):
        with pytest.raises(ValueError, match="draft_vocab"):
            JetSpecConfig(draft_vocab=bad, vocab_size=100)
