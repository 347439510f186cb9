"""Shared test fixtures: tiny random targets of several families, and drafters with controllable quality."""

from __future__ import annotations

import os

import pytest
import torch

# No GPU here: run the Triton tree-attention kernel in Triton's interpreter. Triton fixes the mode when first
# imported (transformers imports it below), so this must come first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny models: one thread is fastest (OpenMP spin-waiting on 2 busy cores made them 30x slower).
torch.set_num_threads(1)

from helpers import TARGET_FAMILIES, make_target  # noqa: E402


@pytest.fixture(params=TARGET_FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture
def tiny_target(family):
    return make_target(family, seed=0)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's tokenizer (and chat template), saved as an HF folder (``model``), plus a
    head for it (``head``)."""
    from transformers import AutoTokenizer

    from hf_jetspec import JetSpecHead
    from hf_jetspec.models import convert_gguf, find_smollm2_gguf

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = AutoTokenizer.from_pretrained(convert_gguf(find_smollm2_gguf()))
    model = make_target("llama", vocab=len(tokenizer), hidden=32, layers=2, heads=2, kv_heads=1,
                        eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    torch.manual_seed(0)
    JetSpecHead.for_target(model, block_size=6).save_pretrained(folder / "head")
    return folder
