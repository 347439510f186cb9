"""Second MT-Bench turns decoded with the shipped head, continuing from the first turn's returned cache versus
running the whole conversation again: the same tokens; tau and wall time of each (one process, interleaved).

    .venv/bin/python docs/continuation_tau.py --per-category 1 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import hf_jetspec
from hf_jetspec.cache import cache_kwarg
from hf_jetspec.outputs import OUTPUT_CACHE_FIELD
from hf_jetspec.prompts import limit_per_category, mt_bench_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = hf_jetspec.default_model()
    head = hf_jetspec.default_head(model)
    hf_jetspec.enable(model)
    key = cache_kwarg(model)
    first = limit_per_category(mt_bench_prompts(1), args.per_category)
    second = {p.id: p.text for p in mt_bench_prompts(2)}
    run = dict(do_sample=False, max_new_tokens=args.max_new_tokens, assistant_model=head, return_dict_in_generate=True)
    rows = []
    for prompt in first:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        turn1 = model.generate(ids, **run)
        # the next turn appended to the tokens as generated (what a chat loop that keeps its cache does)
        follow = tokenizer(f"<|im_end|>\n<|im_start|>user\n{second[prompt.id]}<|im_end|>\n<|im_start|>assistant\n",
                           return_tensors="pt", add_special_tokens=False)["input_ids"]
        ids2 = torch.cat((turn1.sequences, follow), dim=1)
        row = {"id": prompt.id, "category": prompt.category, "cached": turn1.sequences.shape[1] - 1,
               "turn2_prompt": ids2.shape[1]}
        outs = {}
        for name in ("fresh", "cached", "fresh", "cached"):
            extra = {key: copy.deepcopy(getattr(turn1, OUTPUT_CACHE_FIELD))} if name == "cached" else {}
            start = time.perf_counter()
            out = model.generate(ids2, **run, **extra)
            row.setdefault(f"{name}_s", []).append(time.perf_counter() - start)
            row[f"{name}_tau"] = out.stats.tau
            outs[name] = out.sequences
        row["same_tokens"] = bool(torch.equal(outs["fresh"], outs["cached"]))
        rows.append(row)
        print(json.dumps(row))
    summary = {k: statistics.mean(r[k] for r in rows) for k in ("fresh_tau", "cached_tau")}
    summary.update({k: statistics.median(min(r[k]) for r in rows) for k in ("fresh_s", "cached_s")})
    summary["all_same_tokens"] = all(r["same_tokens"] for r in rows)
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
