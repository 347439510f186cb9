"""Two per-call adaptations of merged trees side by side in one process (docs/retrieval.md): ``OnlineCalibration``
(the calibration's intercepts follow the call's own verification outcomes) and ``DraftDepth`` (the head drafts as
deep as recent trees went, not the whole block).

    .venv/bin/python docs/adaptive_ab.py [--new-tokens 96] [--rounds 3] [--json FILE] [--variants LIST]
        [--calibration DIR]

SmolLM2-135M-Instruct with the shipped head, datastore and calibration; the chat prompts of docs/tree_size_ab.py,
the first and last two prompts of the bundled code/math set and every 20th MT-Bench first turn; one measured
`CostCurve` for every variant; interleaved rounds (the order alternates), every output asserted equal to plain
greedy. Variants: ``jetspec`` with neither adaptation (the library before 6 December 2026), ``+online``
(``online_calibration=True``), ``+depth``, ``+both``; ``suffix`` (no head: the head's datastore and the default
calibration, as `hf-jetspec bench --strategies suffix`) without and with online calibration. The library's defaults
since: ``jetspec+depth`` for the shipped head (its calibration is fitted, so ``online_calibration=None`` leaves it
as it is) and ``suffix+online`` (the default retrieval model is corrected). Prints
per-round totals, tau per variant, and the median speedup per variant over plain greedy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import hf_jetspec
from hf_jetspec.calibration import Calibration, measure_cost_curve
from hf_jetspec.cpu import tune_mkl
from hf_jetspec.decoding.adaptive import DraftDepth
from hf_jetspec.models import default_head, default_model
from hf_jetspec.prompts import code_math_prompts, mt_bench_prompts

CHAT = ["Explain in three sentences why the sky is blue.", "Give me five tips for a job interview.",
        "What is the difference between a list and a tuple in Python?"]
VARIANTS = {  # name: (head, online calibration, adaptive depth)
    "plain": None,
    "jetspec": (True, False, False), "jetspec+online": (True, True, False), "jetspec+depth": (True, False, True),
    "jetspec+both": (True, True, True), "suffix": (False, False, False), "suffix+online": (False, True, False),
}
ADAPTIVE_UPDATE = DraftDepth.update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the per-round times and taus here")
    parser.add_argument("--variants", help=f"comma list of the variants to run (default: all of {list(VARIANTS)})")
    parser.add_argument("--calibration", help="also run jetspec+depth+cal: jetspec+depth with this calibration.json")
    args = parser.parse_args()
    tune_mkl()  # as the hf-jetspec command does
    model, tokenizer = default_model()
    head = default_head(model)
    curve = measure_cost_curve(model, 32)
    other = Calibration.load(args.calibration) if args.calibration else None
    print("cost curve", [(t, round(c, 3)) for t, c in zip(curve.tokens, curve.cost)], flush=True)
    code_math = code_math_prompts()
    prompts = CHAT + [p.text for p in code_math[:2] + code_math[-2:]] + [p.text for p in mt_bench_prompts()[::20]]
    inputs = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True) for p in prompts]

    def run(name, x):
        start = time.perf_counter()
        if VARIANTS[name] is None:
            return model.generate(**x, max_new_tokens=args.new_tokens, do_sample=False)[0].tolist(), \
                time.perf_counter() - start, 1.0
        with_head, online, depth = VARIANTS[name]
        chosen = dict(calibration=other) if name.endswith("+cal") else {}
        DraftDepth.update = ADAPTIVE_UPDATE if depth else (lambda self, used: None)  # off: the whole block
        drafting = dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head) if with_head else \
            dict(custom_generate=hf_jetspec.suffix_generate, datastore=head.datastore)  # as `hf-jetspec bench`
        out = model.generate(**x, **drafting, **chosen, node_cost=curve, online_calibration=online,
                             max_new_tokens=args.new_tokens, do_sample=False, return_dict_in_generate=True)
        return out.sequences[0].tolist(), time.perf_counter() - start, out.stats.tau

    names = ["plain"] + [n for n in (args.variants.split(",") if args.variants else VARIANTS) if n != "plain"]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.calibration:
        VARIANTS["jetspec+depth+cal"] = (True, False, True)
        names.append("jetspec+depth+cal")
    for x in inputs[:2]:  # warm-up
        for name in names:
            run(name, x)
    totals = {k: [] for k in names}
    taus = {k: [] for k in names}
    for r in range(args.rounds):
        round_time = dict.fromkeys(names, 0.0)
        for i, x in enumerate(inputs):
            order = names if (r + i) % 2 == 0 else names[::-1]
            res = {k: run(k, x) for k in order}
            assert all(res[k][0] == res["plain"][0] for k in names), (r, i)
            for k in names:
                round_time[k] += res[k][1]
                if r == 0:
                    taus[k].append(res[k][2])
        for k in names:
            totals[k].append(round_time[k])
        print(f"round {r}: plain {round_time['plain']:.2f}s, " + ", ".join(
            f"{k} {round_time['plain'] / round_time[k]:.3f}x" for k in names[1:]), flush=True)
    summary = {}
    for k in names[1:]:
        summary[k] = {"tau_mean": statistics.mean(taus[k]),
                      "speedup_median": statistics.median(p / t for p, t in zip(totals["plain"], totals[k]))}
        print(f"{k:16} tau (mean over prompts) {summary[k]['tau_mean']:.3f}  median speedup "
              f"{summary[k]['speedup_median']:.3f}x   taus {[round(t, 2) for t in taus[k]]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": prompts, "new_tokens": args.new_tokens, "calibration": args.calibration,
                       "cost_curve": [curve.tokens, curve.cost],
                       "round_seconds": totals, "taus": taus, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
