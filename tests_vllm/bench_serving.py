"""Serving benchmark (`make bench-vllm`): vLLM's OpenAI-compatible server with SmolLM2-135M-Instruct, plain vs
`{"method": "ngram"}` vs the shipped JetSpec head exported to vLLM's DFlash layout; greedy, MT-Bench first turns
(2 per category = 16 prompts, the same token ids `hf-jetspec bench --prompts mt-bench --limit 2` feeds
`generate()`), at 1 and 16 concurrent requests. Reports aggregate output tokens/s, vLLM's mean acceptance length
(1 + accepted / drafts, from its /metrics counters; ngram proposes nothing when no n-gram matches, so its drafts
are few but long), tokens per decoding step (all steps, drafted or not) and whether each reply equals plain greedy's
(the first plain run's)."""

from __future__ import annotations

import argparse
import contextlib
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


def measure(servers: dict[str, str], prompts: list[list[int]], concurrency: int, max_tokens: int,
            rounds: int) -> dict[str, dict]:
    """Per method: output tokens, seconds and spec-decode counters over the same work, interleaved so that a
    shared machine's drifting load hits every method alike: one request at a time rotates the methods per prompt;
    concurrent load sends the whole prompt set to each method in turn, ``rounds`` times."""
    before = {m: server_spec_counters(base) for m, base in servers.items()}
    totals = {m: {"seconds": 0.0, "tokens": 0, "texts": [None] * len(prompts)} for m in servers}
    groups = [[i] for i in range(len(prompts))] if concurrency == 1 else [list(range(len(prompts)))] * rounds
    for number, group in enumerate(groups):
        methods = list(servers)
        methods = methods[number % len(methods):] + methods[: number % len(methods)]  # rotate who goes first
        for method in methods:
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                replies = list(pool.map(lambda i: request(servers[method], prompts[i], max_tokens), group))
            totals[method]["seconds"] += time.perf_counter() - start
            totals[method]["tokens"] += sum(r["tokens"] for r in replies)
            for i, reply in zip(group, replies):
                totals[method]["texts"][i] = reply["text"]
    for method, run in totals.items():
        after = server_spec_counters(servers[method])
        spec = acceptance({k: after[k] - before[method][k] for k in after})
        requests = len(groups) * len(groups[0])
        # every decoding step emits 1 + its accepted drafts (a request's first token comes from its prefill)
        steps = run["tokens"] - requests - spec["num_accepted_tokens"]
        run.update(method=method, concurrency=concurrency, rounds=1 if concurrency == 1 else rounds, spec=spec,
                   tokens_per_s=run["tokens"] / run["seconds"], tokens_per_step=(run["tokens"] - requests) / steps)
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--methods", default="plain,ngram,dflash")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="repeats of the concurrent load per method")
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
    methods = args.methods.split(",")
    results = []
    with contextlib.ExitStack() as stack:  # all servers at once, so their measurements can interleave
        servers = {}
        for method in methods:
            log = stack.enter_context(tempfile.NamedTemporaryFile("w", prefix=f"vllm-{method}-", suffix=".log",
                                                                  delete=False))
            spec = spec_config(method, head_dir, args.num_speculative_tokens)
            servers[method] = stack.enter_context(vllm_server(target, spec, max_num_seqs=16, log=log))
        for base in servers.values():
            request(base, prompts[0], 8)  # warm-up
        reference = None
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs = measure(servers, prompts, concurrency, args.max_tokens, args.rounds)
            if reference is None and "plain" in runs:  # plain greedy, one request at a time (the first concurrency)
                reference = runs["plain"]["texts"]
            for run in runs.values():
                run["identical_to_plain"] = (None if reference is None
                                             else sum(a == b for a, b in zip(run["texts"], reference)))
                results.append(run)
                tau = run["spec"]["mean_acceptance_length"]
                print(f"{run['method']:7s} c={concurrency:2d}: {run['tokens_per_s']:6.1f} tok/s, {run['tokens']} "
                      f"tokens in {run['seconds']:.1f} s, acceptance length {'-' if tau is None else f'{tau:.2f}'}, "
                      f"tokens/step {run['tokens_per_step']:.2f}, identical to plain {run['identical_to_plain']}"
                      f"/{len(prompts)}", flush=True)
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
