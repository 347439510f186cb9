"""Calibration prompts for merged (head + retrieval) trees, held out of the datastore they are measured with.

A calibration fitted on prompts whose answers sit in the datastore would learn that the corpus is always right (it
holds the exact continuation). So the prompts come from the answer store (training sources, never an evaluation
set) and the datastore used while recording is rebuilt WITHOUT their rows::

    python -m hf_jetspec.training.calibrate data/answers --per-source 6 --out /tmp/calibration
    hf-jetspec bench --prompts /tmp/calibration/prompts.jsonl --category-field source \\
        --datastore /tmp/calibration --strategies jetspec --budgets 8,16 --calibration-log /tmp/calibration/log.jsonl
    hf-jetspec calibrate /tmp/calibration/log.jsonl --out src/hf_jetspec/assets/heads/smollm2-135m-instruct

Only single-turn rows are used (their user text is recovered from the chat-rendered prompt, so bench renders the
same prompt again).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from .answers import build_datastore, read_answers, source_dirs
from .argcheck import require_at_least


def user_text(tokenizer, prompt_ids: Sequence[int]) -> str | None:
    """The single user turn of a chat-rendered prompt, or None when it holds another number of user turns."""
    text = tokenizer.decode(list(prompt_ids))
    turns = text.split("<|im_start|>user\n")
    if len(turns) != 2:
        return None
    return turns[1].split("<|im_end|>")[0]


def held_out_rows(root: str | Path, tokenizer, per_source: int, seed: int = 0,
                  sources: Sequence[str] | None = None) -> list[dict]:
    """``per_source`` single-turn rows of each source, chosen at random (``seed``): ``{"id", "source", "prompt"}``."""
    rng = random.Random(seed)
    chosen = []
    for directory in source_dirs(root, sources):
        rows = list(read_answers(root, [directory.name]))
        rng.shuffle(rows)
        picked = 0
        for row in rows:
            text = user_text(tokenizer, row["input_ids"][: row["prompt_len"]])
            if text is None or not text.strip():
                continue
            chosen.append({"id": row["id"], "source": directory.name, "prompt": text})
            picked += 1
            if picked == per_source:
                break
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    from hf_jetspec.models import default_model
    from hf_jetspec.suffix_index import CorpusIndex

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, nargs="?", default=Path("data/answers"))
    parser.add_argument("--per-source", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", default=None, help="comma list (default: every source in the store)")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for prompts.jsonl and datastore.safetensors (without the prompts' answers)")
    args = parser.parse_args(argv)
    require_at_least(parser, args, per_source=1)
    tokenizer = default_model()[1]
    sources = args.sources.split(",") if args.sources else None
    rows = held_out_rows(args.root, tokenizer, args.per_source, args.seed, sources)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = build_datastore(args.root, args.out, tokenizer, sources=sources, exclude={r["id"] for r in rows})
    print(f"{len(rows)} prompts -> {args.out / 'prompts.jsonl'}; datastore of {CorpusIndex.load(path).num_tokens:,} "
          f"tokens without their answers -> {path}")


if __name__ == "__main__":
    main()
