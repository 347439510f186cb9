"""Fixtures of the vLLM integration tests (own venv: `make test-vllm`; not collected by the main pytest run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_common import chat_prompts, exported_default_head, smollm2_folder  # noqa: E402

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
]
MAX_TOKENS = 64


@pytest.fixture(scope="session")
def target() -> Path:
    return smollm2_folder()


@pytest.fixture(scope="session")
def head_dir(tmp_path_factory) -> Path:
    return exported_default_head(tmp_path_factory.mktemp("vllm-head"))


@pytest.fixture(scope="session")
def prompts(target) -> list[str]:
    return chat_prompts(target, PROMPTS)
