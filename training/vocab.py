"""Draft vocabularies: the most frequent response tokens of a training set (FR-Spec / EAGLE-3 style).

A head with ``config.draft_vocab`` projects its hidden states onto those tokens only (see
`hf_jetspec.drafters.DraftVocabProjection`); the target still verifies against its full vocabulary, so outputs
are unchanged and only drafting gets cheaper.

    python -m hf_jetspec.training.vocab --data data/sharegpt.jsonl --head runs/head --size 16384
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable

from hf_jetspec.config import MIN_DRAFT_VOCAB, token_ids

from .argcheck import require_at_least


def frequent_tokens(rows: Iterable[dict], size: int, always: Iterable[int] = (),
                    vocab_size: int | None = None) -> list[int]:
    """The ``size`` most frequent tokens of the rows' responses (``input_ids[prompt_len:]``), ties broken by
    token id, plus ``always`` (e.g. the eos ids); sorted ids. When fewer distinct tokens occur, the rest is filled
    with the lowest unseen ids below ``vocab_size`` (or, without it, fewer ids are returned)."""
    if size < MIN_DRAFT_VOCAB:
        raise ValueError(f"draft vocabulary size must be >= {MIN_DRAFT_VOCAB}, got {size}")
    counts = Counter()
    for row in rows:
        counts.update(row["input_ids"][row.get("prompt_len", 0):])
    always = list(dict.fromkeys(int(i) for i in always))
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if t not in always]
    chosen = always + ranked[: max(0, size - len(always))]
    if vocab_size is not None and len(chosen) < min(size, vocab_size):
        taken = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in taken][: min(size, vocab_size) - len(chosen)]
    return sorted(chosen)


def coverage(rows: Iterable[dict], vocab: Iterable[int]) -> float:
    """Share of the rows' response tokens inside ``vocab``."""
    keep, hit, total = set(vocab), 0, 0
    for row in rows:
        tokens = row["input_ids"][row.get("prompt_len", 0):]
        hit += sum(t in keep for t in tokens)
        total += len(tokens)
    return hit / max(1, total)


def kept_ids(head, given: list[int] | None) -> list[int]:
    """The ids a draft vocabulary always keeps: ``given``, else the head's own eos ids (heads made before 6 December
    2026 carry none)."""
    return given if given is not None else token_ids(head.config.eos_token_id)


def main(argv=None) -> int:
    from hf_jetspec.head import JetSpecHead

    from .features import read_rows, training_rows

    p = argparse.ArgumentParser(description="Give a saved head a draft vocabulary from training data")
    p.add_argument("--data", required=True, nargs="+", help="JSONL rows {id, input_ids, prompt_len}")
    p.add_argument("--head", required=True, help="head folder, updated in place")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--eos", type=int, nargs="*", default=None,
                   help="token ids always kept (default: the head's eos_token_id, copied from its target, as the "
                        "trainer's --draft-vocab keeps the target's eos ids; --eos with no ids: none)")
    p.add_argument("--eval-count", type=int, default=8,
                   help="rows the trainer set aside for evaluation (as its --eval-count; excluded here too)")
    p.add_argument("--seed", type=int, default=0, help="the trainer's --seed (which rows it set aside)")
    args = p.parse_args(argv)
    require_at_least(p, args, size=1, eval_count=0)
    rows, _ = training_rows([read_rows(path) for path in args.data], args.eval_count, args.seed)
    head = JetSpecHead.from_pretrained(args.head)
    always = kept_ids(head, args.eos)
    if args.eos is None and not always:
        print(f"note: {args.head} names no eos_token_id (heads saved before 6 December 2026 carry none), so no id is "
              "forced in (eos stays only if it is frequent enough): pass --eos ID (the target's eos ids) to keep "
              "them", file=sys.stderr)
    head.config.draft_vocab = frequent_tokens(rows, args.size, always, head.config.vocab_size)
    head.config.validate_head()
    head.save_pretrained(args.head)
    share = coverage(rows, head.config.draft_vocab)
    print(f"draft vocabulary: {len(head.config.draft_vocab)} tokens, {100 * share:.2f}% of the response tokens; "
          f"saved to {args.head}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
