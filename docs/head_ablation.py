"""Heads side by side: teacher-forced chain tau on held-out and on training text, and head-only decoding tau.

For every head (``name=folder``; ``shipped`` = the default head), in one process:

* ``held-out chain tau``: `training.diagnose.depth_accuracy` (an anchor every ``--anchor-stride`` positions) on the trainer's evaluation rows (``--data``,
  ``--eval-count``, ``--seed`` as given to the trainer; never trained on by any head here);
* ``trained chain tau``: the same on the first ``--train-count`` rows of a feature store the runs trained on;
* ``open chain tau``: the same on ShareGPT openings the shipped head was trained on (``--open`` rows);
* ``MT-Bench tau @b``: greedy JetSpec decoding with the head alone (``retrieval=False``: no timing enters) on
  ``--mt-bench`` first-turn prompts per category, float32, for each ``--budgets`` b.

    .venv/bin/python docs/head_ablation.py --heads base=runs/base noise=runs/noise \\
        --data data/answers/sharegpt-turns data/answers/math data/answers/leetcode --eval-count 64 \\
        --store /work/feat/sub --open data/answers/sharegpt-open --json docs/results/head_ablation.json
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_jetspec.head import JetSpecHead
from hf_jetspec.models import default_head, load_target
from hf_jetspec.prompts import encode_prompt, limit_per_category, load_prompts
from hf_jetspec.training.diagnose import depth_accuracy, with_target_states
from hf_jetspec.training.features import FeatureStore, cap_prompts, read_rows, split_rows
from hf_jetspec.training.trainer import measure_tau


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", nargs="+", required=True, help="name=folder (shipped = the default head)")
    p.add_argument("--data", nargs="+", required=True, help="the trainer's --data")
    p.add_argument("--eval-count", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--store", nargs="*", default=[], help="feature store(s) the runs trained on")
    p.add_argument("--train-count", type=int, default=64)
    p.add_argument("--open", default=None, help="answer-store folder of the shipped head's training prompts")
    p.add_argument("--open-count", type=int, default=64)
    p.add_argument("--mt-bench", type=int, default=2, help="MT-Bench first turns per category")
    p.add_argument("--budgets", type=int, nargs="+", default=[4, 8])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--anchor-stride", type=int, default=4, help="anchor at every n-th response position")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    target16, _ = load_target(None, "bfloat16", None)
    target, tokenizer = load_target(None, "float32", None)
    heads = {}
    for spec in args.heads:
        name, _, folder = spec.partition("=")
        heads[name] = default_head(target) if folder in ("", "shipped") else JetSpecHead.from_pretrained(folder)
    _, held = split_rows([read_rows(path) for path in args.data], args.eval_count, args.seed)
    sets = {"held_out": cap_prompts(held, args.max_prompt_tokens)}
    if args.store:
        store = FeatureStore(*args.store)
        sets["trained"] = [store[i] for i in range(min(args.train_count, len(store)))]
    if args.open:
        sets["open"] = cap_prompts(list(read_rows(args.open))[: args.open_count], args.max_prompt_tokens)
    layers = next(iter(heads.values())).config.target_layer_ids
    sets = {kind: rows if kind == "trained" else with_target_states(target16, rows, layers)  # once for all heads
            for kind, rows in sets.items()}
    prompts = [encode_prompt(tokenizer, q.text)[0].tolist()
               for q in limit_per_category(load_prompts("mt-bench"), args.mt_bench)]
    results = {}
    for name, head in heads.items():
        head16 = JetSpecHead(head.config).to(torch.bfloat16).eval()
        head16.load_state_dict(head.state_dict())
        row = {f"{kind}_chain_tau": depth_accuracy(head16, target16, rows, args.anchor_stride)["chain_tau"] for kind, rows in sets.items()}
        for budget in args.budgets:
            row[f"mt_bench_tau@{budget}"] = measure_tau(target, head, prompts, args.max_new_tokens, budget)
        if "trained_chain_tau" in row:
            row["gap_trained"] = row["trained_chain_tau"] - row["held_out_chain_tau"]
        if "open_chain_tau" in row:
            row["gap_open"] = row["open_chain_tau"] - row["held_out_chain_tau"]
        results[name] = row
        print(name, " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    print("\n| head | " + " | ".join(next(iter(results.values()))) + " |")
    print("|---" * (1 + len(next(iter(results.values())))) + "|")
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in row.values()) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "prompts": len(prompts), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
