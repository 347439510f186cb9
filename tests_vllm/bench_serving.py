"""Serving benchmark (`make bench-vllm`): vLLM's OpenAI-compatible server with SmolLM2-135M-Instruct, plain vs
`{"method": "ngram"}` vs the shipped JetSpec head exported to vLLM's DFlash layout; greedy, MT-Bench first turns
(2 per category = 16 prompts, the same token ids `hf-jetspec bench --prompts mt-bench --limit 2` feeds
`generate()`), at 1 and 16 concurrent requests. Reports aggregate output tokens/s, vLLM's mean acceptance length
(1 + accepted / drafts, from its /metrics counters; ngram proposes nothing when no n-gram matches, so its drafts
are few but long), tokens per decoding step (all steps, drafted or not) and whether each reply equals plain greedy's
(the first plain run's)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_common import (  # noqa: E402
    acceptance,
    exported_default_head,
    http,
    server_spec_counters,
    smollm2_folder,
    spec_config,
    vllm_server,
)


def request(base: str, ids: list[int], max_tokens: int) -> dict:
    body = json.loads(http(base + "/v1/completions", {"model": "target", "prompt": ids, "max_tokens": max_tokens,
                                                      "temperature": 0.0}))
    return {"text": body["choices"][0]["text"], "tokens": body["usage"]["completion_tokens"]}


def run_load(base: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    before = server_spec_counters(base)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda ids: request(base, ids, max_tokens), prompts))
    seconds = time.perf_counter() - start
    after = server_spec_counters(base)
    tokens = sum(r["tokens"] for r in replies)
    spec = acceptance({k: after[k] - before[k] for k in after})
    # every decoding step emits 1 + its accepted drafts (a request's first token comes from its prefill)
    steps = tokens - len(prompts) - spec["num_accepted_tokens"]
    return {"concurrency": concurrency, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "tokens_per_step": (tokens - len(prompts)) / steps, "texts": [r["text"] for r in replies], "spec": spec}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--methods", default="plain,ngram,dflash")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from hf_jetspec.prompts import limit_per_category, mt_bench_prompts

    target = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(target)
    chosen = limit_per_category(mt_bench_prompts(), args.per_category)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for p in chosen]
    head_dir = exported_default_head(Path(tempfile.mkdtemp(prefix="jetspec-vllm-head-")))
    results, reference = [], None
    for method in args.methods.split(","):
        spec = spec_config(method, head_dir, args.num_speculative_tokens)
        with tempfile.NamedTemporaryFile("w", prefix=f"vllm-{method}-", suffix=".log", delete=False) as log, \
                vllm_server(target, spec, max_num_seqs=16, log=log) as base:
            request(base, prompts[0], 8)  # warm-up
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                run = run_load(base, prompts, concurrency, args.max_tokens)
                if method == "plain" and reference is None:  # the first plain run (one request at a time)
                    reference = run["texts"]
                run["identical_to_plain"] = (None if reference is None
                                             else sum(a == b for a, b in zip(run["texts"], reference)))
                run["method"] = method
                results.append(run)
                tau = run["spec"]["mean_acceptance_length"]
                print(f"{method:7s} c={concurrency:2d}: {run['tokens_per_s']:6.1f} tok/s, {run['tokens']} tokens in "
                      f"{run['seconds']:.1f} s, acceptance length {'-' if tau is None else f'{tau:.2f}'}, "
                      f"identical to plain {run['identical_to_plain']}/{len(prompts)}", flush=True)
    print("\n| method | concurrent requests | output tok/s | mean acceptance length | tokens per step "
          "| replies = plain greedy |")
    print("|---|---:|---:|---:|---:|---|")
    for run in results:
        tau = run["spec"]["mean_acceptance_length"]
        print(f"| {run['method']} | {run['concurrency']} | {run['tokens_per_s']:.1f} | "
              f"{'-' if tau is None else f'{tau:.2f}'} | {run['tokens_per_step']:.2f} | "
              f"{run['identical_to_plain']}/{len(prompts)} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        settings = vars(args) | {"prompts": [p.id for p in chosen]}
        Path(args.json).write_text(json.dumps({"settings": settings, "runs": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
