"""Where a head's drafts go wrong: teacher-forced acceptance per depth, on held-out and on training sequences.

For every anchor a in a sequence's response, the head drafts its block from the target's states before a (as in
training and decoding); depth k is *right* when its top token is the target's greedy choice at a + k - 1 (the
argmax of the target's logits there, teacher forced along the sequence). Per depth k this reports the top-1
accuracy and the chain acceptance (depths 1..k all right), and ``chain_tau = 1 + sum_k chain_k``: the tokens per
step a single full-block chain would reach. A held-out chain_tau far below the training one means the head
memorised its data: it needs more data (or fewer epochs), not more steps.

    python -m hf_jetspec.training.diagnose --head runs/head --data data/sharegpt.jsonl --features data/states
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_jetspec.drafters import HeadDrafter
from hf_jetspec.head import JetSpecHead

from .argcheck import require_at_least
from .features import FeatureStore, cap_prompts, read_rows, split_rows, target_states
from .loss import head_block_hidden


def acceptance_profile(predicted: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor):
    """``predicted, truth, valid [m, B]`` (slot 0 = the anchor, ignored) -> (hits ``[B-1]``, chain hits ``[B-1]``,
    counts ``[B-1]``): per depth k, anchors whose slot k is right, anchors whose slots 1..k are all right, and
    anchors whose slot k is valid (inside the sequence)."""
    right = (predicted == truth) & valid
    chain = torch.cumprod(right[:, 1:].long(), dim=1)
    return right[:, 1:].sum(0), chain.sum(0), valid[:, 1:].sum(0)


@torch.no_grad()
def depth_accuracy(head: JetSpecHead, target, sequences: list[dict], anchor_stride: int = 1) -> dict:
    """Teacher-forced acceptance of ``head`` over ``sequences``: dicts with ``input_ids [T]``, ``prompt_len`` and
    optionally the target's ``features [T, F]`` and ``final [T, H]`` (e.g. `FeatureStore` items, or
    `with_target_states`; else computed). Every ``anchor_stride``-th response position is an anchor (1: all).
    Returns ``{"anchors", "top1": [B-1], "chain": [B-1], "chain_tau"}``."""
    drafter = HeadDrafter(head, target)
    target_lm_head = target.get_output_embeddings()
    device = next(target.parameters()).device
    size = head.config.block_size
    hits, chains, counts = (torch.zeros(size - 1, dtype=torch.long) for _ in range(3))
    for seq in sequences:
        ids = torch.as_tensor(seq["input_ids"], device=device).long()[None]
        length, start = ids.shape[1], max(0, int(seq["prompt_len"]) - 1)
        if length - 1 <= start:
            continue
        if "features" in seq:
            features, final = seq["features"][None].to(device), seq["final"][None].to(device)
        else:
            features, final = target_states(target, ids, None, head.config.target_layer_ids)
        greedy = target_lm_head(final[0].to(target_lm_head.weight.dtype)).argmax(-1)  # [T]: choice after t
        anchors = torch.arange(start, length - 1, anchor_stride, device=device)[None]
        hidden = head_block_hidden(head, features, ids, anchors, drafter.embed)[0]  # [m, B, H]
        predicted = torch.cat([drafter.lm_head(part.to(drafter.lm_head.weight.dtype)).argmax(-1)  # [m, B]
                               for part in hidden.split(32)])  # bounds the [m, B, V] logits
        positions = anchors[0][:, None] + torch.arange(size, device=device)  # slot k predicts token a + k
        valid = positions < length
        truth = greedy[(positions - 1).clamp(max=length - 1)]
        for total, part in zip((hits, chains, counts), acceptance_profile(predicted, truth, valid)):
            total += part.cpu()
    top1 = (hits / counts.clamp(min=1)).tolist()
    chain = (chains / counts.clamp(min=1)).tolist()
    return {"anchors": int(counts[0]), "top1": top1, "chain": chain, "chain_tau": 1.0 + sum(chain)}


@torch.no_grad()
def with_target_states(target, rows: list[dict], layer_ids: list[int]) -> list[dict]:
    """``rows`` with the target's ``features`` and ``final`` states added (bfloat16, on the CPU): computed once, for
    evaluating several heads (or one head many times) on the same sequences."""
    device = next(target.parameters()).device
    out = []
    for row in rows:
        ids = torch.as_tensor(row["input_ids"], device=device).long()[None]
        features, final = target_states(target, ids, None, layer_ids)
        out.append({**row, "features": features[0].to("cpu", torch.bfloat16),
                    "final": final[0].to("cpu", torch.bfloat16)})
    return out


def _sequences(rows: list[dict], store: FeatureStore | None) -> list[dict]:
    """``rows`` with their stored states where ``store`` holds them. A trainer's store never holds its evaluation
    rows: `depth_accuracy` computes the states of rows without ``features``."""
    if store is None:
        return rows
    where = {str(entry["id"]): i for i, (_, entry) in enumerate(store.items)}
    return [store[where[str(r["id"])]] if str(r["id"]) in where else r for r in rows]


def main(argv=None) -> int:
    from hf_jetspec.models import load_target

    p = argparse.ArgumentParser(description="Teacher-forced acceptance per depth: held-out vs training rows")
    p.add_argument("--head", required=True, help="head folder (or Hub id)")
    p.add_argument("--data", required=True, nargs="+", help="the trainer's --data JSONL file(s)")
    p.add_argument("--features", default=None, nargs="+",
                   help="the trainer's feature store(s) (else the target states are computed)")
    p.add_argument("--model", default=None, help="target folder / Hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--count", type=int, default=8, help="training rows to compare with (the first in order)")
    p.add_argument("--eval-count", type=int, default=8, help="the trainer's --eval-count (the held-out rows)")
    p.add_argument("--seed", type=int, default=0, help="the trainer's --seed")
    p.add_argument("--depths", type=int, default=8, help="depths to print")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="the trainer's --max-prompt-tokens")
    p.add_argument("--anchor-stride", type=int, default=1, help="anchor at every n-th response position (1: all)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    require_at_least(p, args, count=0, eval_count=0, depths=1, max_prompt_tokens=1, anchor_stride=1)
    target, _ = load_target(args.model, "float32", None)
    head = JetSpecHead.from_pretrained(args.head).eval()
    train, held = split_rows([read_rows(path) for path in args.data], args.eval_count, args.seed)
    train, held = cap_prompts(train, args.max_prompt_tokens), cap_prompts(held, args.max_prompt_tokens)
    store = FeatureStore(*args.features) if args.features else None
    results = {}
    for name, rows in (("held_out", held), ("training", train[: args.count])):
        sequences = _sequences(rows, store)
        computed = sum("features" not in seq for seq in sequences)
        if store is not None and computed:
            print(f"{name}: the feature store lacks {computed} of {len(rows)} rows; their states are computed")
        results[name] = depth_accuracy(head, target, sequences, args.anchor_stride)
    shown = min(args.depths, head.config.block_size - 1)
    print(f"{'':22}" + "".join(f"{'d' + str(k + 1):>7}" for k in range(shown)) + f"{'chain tau':>11}")
    for name, r in results.items():
        for what in ("top1", "chain"):
            label = f"{name} {what} ({r['anchors']})" if what == "top1" else f"{name} {what}"
            tail = f"{r['chain_tau']:11.3f}" if what == "chain" else ""
            print(f"{label:22}" + "".join(f"{x:7.3f}" for x in r[what][:shown]) + tail)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
