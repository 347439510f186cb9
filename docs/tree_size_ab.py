"""The adaptive tree size of merged JetSpec trees, two rules side by side in one process (docs/retrieval.md):
``best`` keeps the best-first prefix with the most expected tokens per verification cost (the library's rule);
``marginal`` stops at the first node that alone does not pay for its cost (the rule before 5 December 2026,
reproduced by pricing each size at the next size's marginal cost).

    MKL_CBWR=AVX512 .venv/bin/python docs/tree_size_ab.py [--new-tokens 96] [--rounds 3]

SmolLM2-135M-Instruct with the shipped head and datastore; 3 chat prompts and the first and last two prompts of the
bundled code/math set; one measured `CostCurve` for both rules; interleaved rounds (the order alternates), every
output asserted equal to plain greedy. Prints per-round totals, tau per prompt, and the median speedup per rule.
"""

from __future__ import annotations

import argparse
import statistics
import time

import hf_jetspec
import hf_jetspec.calibration as calibration
from hf_jetspec.models import default_head, default_model
from hf_jetspec.prompts import code_math_prompts

CHAT = ["Explain in three sentences why the sky is blue.", "Give me five tips for a job interview.",
        "What is the difference between a list and a tuple in Python?"]
BEST = calibration._cheapest_node_prices


def marginal_prices(curve, budget):
    """Each size priced at the next node's marginal cost: the search stops at the first node that does not pay."""
    return (0.0,) + tuple(curve(n + 1) - curve(n) for n in range(1, budget))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = default_model()
    head = default_head(model)
    curve = calibration.measure_cost_curve(model, 32)
    print("cost curve", [(t, round(c, 3)) for t, c in zip(curve.tokens, curve.cost)], flush=True)
    code_math = code_math_prompts()
    prompts = CHAT + [p.text for p in code_math[:2] + code_math[-2:]]
    inputs = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True) for p in prompts]

    def run(kind, x):
        start = time.perf_counter()
        if kind == "plain":
            return model.generate(**x, max_new_tokens=args.new_tokens, do_sample=False)[0].tolist(), \
                time.perf_counter() - start, None
        calibration._cheapest_node_prices = BEST if kind == "best" else marginal_prices
        out = model.generate(**x, custom_generate=hf_jetspec.jetspec_generate, draft_head=head, node_cost=curve,
                             max_new_tokens=args.new_tokens, do_sample=False, return_dict_in_generate=True)
        return out.sequences[0].tolist(), time.perf_counter() - start, out.stats.tau

    kinds = ("plain", "marginal", "best")
    for x in inputs[:2]:  # warm-up
        for kind in kinds:
            run(kind, x)
    totals = {k: [] for k in kinds}
    taus = {k: [] for k in kinds[1:]}
    for r in range(args.rounds):
        round_time = dict.fromkeys(kinds, 0.0)
        for i, x in enumerate(inputs):
            order = kinds if (r + i) % 2 == 0 else kinds[::-1]
            res = {k: run(k, x) for k in order}
            assert res["marginal"][0] == res["plain"][0] and res["best"][0] == res["plain"][0], (r, i)
            for k in kinds:
                round_time[k] += res[k][1]
            if r == 0:
                for k in taus:
                    taus[k].append(res[k][2])
        for k in kinds:
            totals[k].append(round_time[k])
        print(f"round {r}: plain {round_time['plain']:.2f}s, marginal "
              f"{round_time['plain'] / round_time['marginal']:.3f}x, best "
              f"{round_time['plain'] / round_time['best']:.3f}x", flush=True)
    for k in taus:
        print(f"tau {k}:", [round(t, 2) for t in taus[k]])
    for k in kinds[1:]:
        print(f"median speedup {k}: {statistics.median(p / t for p, t in zip(totals['plain'], totals[k])):.3f}x")


if __name__ == "__main__":
    main()
