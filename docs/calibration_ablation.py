"""Default vs fitted calibration of merged trees, in one process, interleaved per prompt.

For every prompt: plain greedy ``generate()``, then JetSpec (head + retrieval, the shipped head and datastore) with
each calibration in turn (the library's defaults, and the shipped head's fitted ``calibration.json``), alternating
which goes first. Every output is checked against plain greedy. Prints tau and the median per-prompt speedup.

    .venv/bin/python docs/calibration_ablation.py --prompts code-math --limit 6 --budget 8
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from hf_jetspec.bench import Strategy, run_strategy
from hf_jetspec.calibration import Calibration
from hf_jetspec.cpu import tune_mkl
from hf_jetspec.models import default_head, default_model
from hf_jetspec.prompts import encode_prompt, limit_per_category, load_prompts
from hf_jetspec.strategies import Resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="code-math")
    parser.add_argument("--limit", type=int, default=6, help="prompts per category")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tune_mkl()
    torch.manual_seed(0)
    model, tokenizer = default_model()
    head = default_head(model)
    calibrations = {"default": Calibration(), "fitted": head.calibration}
    resources = Resources(head=head, datastore=head.datastore)
    strategy = Strategy("jetspec", args.budget)
    prompts = limit_per_category(load_prompts(args.prompts), args.limit)
    warm = encode_prompt(tokenizer, "Warm up.")
    run_strategy(model, warm, Strategy("ar"), 8, resources)
    run_strategy(model, warm, strategy, 8, resources)
    rows = {name: [] for name in calibrations}
    for number, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        plain, seconds, _, _ = run_strategy(model, ids, Strategy("ar"), args.max_new_tokens, resources)
        new = plain.shape[1] - ids.shape[1]
        order = list(calibrations) if number % 2 == 0 else list(reversed(calibrations))
        for name in order:
            head.calibration = calibrations[name]
            out, t, forwards, _ = run_strategy(model, ids, strategy, args.max_new_tokens, resources)
            if not torch.equal(out, plain):
                raise SystemExit(f"{name} calibration: output differs from plain greedy on prompt {prompt.id}")
            rows[name].append({"prompt": prompt.id, "category": prompt.category, "tau": new / forwards,
                               "speedup": seconds / t, "tokens": new, "forwards": forwards})
        print(f"{prompt.id}: " + ", ".join(f"{n} tau {rows[n][-1]['tau']:.2f} {rows[n][-1]['speedup']:.2f}x"
                                            for n in calibrations), flush=True)
    head.calibration = calibrations["fitted"]
    print(f"\n{args.prompts}, {len(prompts)} prompts, budget {args.budget}, {args.max_new_tokens} new tokens")
    print("calibration   tau   median speedup")
    summary = {}
    for name, runs in rows.items():
        tau = sum(r["tokens"] for r in runs) / sum(r["forwards"] for r in runs)
        speedup = statistics.median(r["speedup"] for r in runs)
        summary[name] = {"tau": tau, "speedup": speedup}
        print(f"{name:<12} {tau:5.2f}  {speedup:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "summary": summary, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
