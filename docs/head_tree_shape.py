"""Does the shape of a head-only tree limit head-only tau? The shipped head alone on MT-Bench first turns at a
fixed budget, its tree built four ways (docs/training.md, "The tree's shape is not the lever"):

- ``raw``: the library's head-only tree (`best_first_tree`: the budget most probable paths under the head's
  per-depth distributions);
- ``default``, ``shipped``, ``held-out fit``: a head-only `merged_tree` (no retrieval candidates) whose edges are
  the calibrated estimates of the default `Calibration` (the head's probability), of the head's shipped
  calibration, and of a head model fitted here on the records of head-only trees over held-out ShareGPT openings
  (never trained on, disjoint from MT-Bench).

    MKL_CBWR=AVX512 .venv/bin/python docs/head_tree_shape.py [--budget 8] [--fit-prompts 24]

Tau only (no timing): 2 prompts per MT-Bench category, 128 new tokens, greedy; ~3 min per variant here.
"""

from __future__ import annotations

import argparse

import torch

import hf_jetspec
from hf_jetspec.calibration import Calibration, fit
from hf_jetspec.models import default_head, default_model
from hf_jetspec.prompts import encode_prompt, limit_per_category, mt_bench_prompts, sharegpt_prompts
from hf_jetspec.retrieval import RetrievalDrafter


class NoCandidates(RetrievalDrafter):
    """Retrieval that never finds anything: `jetspec_generate` then builds a head-only merged tree."""

    def candidates(self, ids, depth):
        return None


def main(budget: int, fit_prompts: int) -> None:
    model, tokenizer = default_model()
    head = default_head(model)

    def tau(prompts, calibration=None, log=None) -> float:
        accepted = []
        for prompt in prompts:
            ids = encode_prompt(tokenizer, prompt.text)
            tree = dict(retrieval=False) if calibration is None else dict(
                retrieval=NoCandidates(None), calibration=calibration, node_cost=None, calibration_log=log)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), draft_head=head, tree_budget=budget,
                                 custom_generate=hf_jetspec.jetspec_generate, max_new_tokens=128, do_sample=False,
                                 return_dict_in_generate=True, **tree)
            accepted += out.stats.accept_lengths
        return sum(accepted) / len(accepted)

    records: list = []
    held_out = sharegpt_prompts()[:fit_prompts]
    fitted_on = tau(held_out, Calibration(), records)
    own = fit(records)
    print(f"fitted on {len(records)} records of {len(held_out)} held-out ShareGPT openings (tau there "
          f"{fitted_on:.3f}): head edge model {own.head}", flush=True)
    mt_bench = limit_per_category(mt_bench_prompts(), 2)
    for name, calibration in (("raw", None), ("default", Calibration()), ("shipped", head.calibration),
                              ("held-out fit", own)):
        print(f"{name}: MT-Bench head-only tau @{budget} = {tau(mt_bench, calibration):.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=8, help="tree nodes per step, root included")
    parser.add_argument("--fit-prompts", type=int, default=24, help="held-out ShareGPT openings to fit on")
    main(**vars(parser.parse_args()))
