"""What one target forward costs on this machine as a function of the tokens it processes (the cost side of
speculative decoding: a tree step verifies N nodes in one forward). Also times the draft head's round.

    .venv/bin/python docs/forward_cost.py            # embedded SmolLM2-135M-Instruct, float32, prefix 200
    .venv/bin/python docs/forward_cost.py --no-tune  # MKL's default code path (no MKL_CBWR, see hf_jetspec.cpu)

Prints milliseconds per call (median of 20 after warm-up) for: the target's LM-head matmul alone, a full target
forward of N new tokens on top of a 200-token KV cache (with the 4D tree mask tree steps pass), and one drafting
round of the shipped head.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from transformers import DynamicCache

from hf_jetspec.cache import cache_kwarg, keep_positions
from hf_jetspec.cpu import tune_mkl
from hf_jetspec.drafters import HeadDrafter
from hf_jetspec.head import HeadContext
from hf_jetspec.models import default_head, default_model

PREFIX = 200
SIZES = (1, 2, 4, 8, 16, 32, 64)


def median_ms(fn, repeats: int = 20) -> float:
    fn(), fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


@torch.no_grad()
def main() -> None:
    if "--no-tune" not in sys.argv[1:]:
        tune_mkl()  # what the hf-jetspec command does (before the first matrix product)
    model, _ = default_model()
    lm_head = model.get_output_embeddings()
    ids = torch.randint(0, lm_head.weight.shape[0], (1, PREFIX + max(SIZES)))
    cache = DynamicCache(config=model.config)
    key = cache_kwarg(model)
    model(input_ids=ids[:, :PREFIX], use_cache=True, **{key: cache})

    def forward(n: int) -> None:
        mask = torch.zeros(1, 1, n, PREFIX + n)
        positions = torch.arange(PREFIX, PREFIX + n)[None]
        model(input_ids=ids[:, PREFIX : PREFIX + n], position_ids=positions, attention_mask=mask, use_cache=True,
              **{key: cache})
        keep_positions(cache, PREFIX, [])  # drop the n new slots again

    hidden = torch.randn(1, max(SIZES), model.config.hidden_size)
    print(f"threads {torch.get_num_threads()}; MKL_CBWR={os.environ.get('MKL_CBWR') or '(unset)'}; "
          f"SmolLM2-135M float32; KV prefix {PREFIX}")
    print("| tokens | LM-head matmul (ms) | target forward (ms) | forward / 1-token forward |")
    print("|---:|---:|---:|---:|")
    base = None
    for n in SIZES:
        head_ms = median_ms(lambda: lm_head(hidden[:, :n]))
        fwd_ms = median_ms(lambda: forward(n))
        base = base or fwd_ms
        print(f"| {n} | {head_ms:.1f} | {fwd_ms:.1f} | {fwd_ms / base:.2f} |")

    head = default_head(model)
    if head is not None:
        drafter = HeadDrafter(head, model)
        features = torch.randn(PREFIX, len(drafter.layer_ids) * model.config.hidden_size)
        context, anchor = HeadContext(), 5  # the anchor: any token id
        head.draft(context, features, anchor, drafter.embed, drafter.lm_head)
        new = features[:2]

        def draft(depth: int | None) -> None:
            head.draft(HeadContext(kv=list(context.kv)), new, anchor, drafter.embed, drafter.lm_head, depth)

        block = head.config.block_size
        for depth in (block - 1, 7, 3):  # the whole block; what budgets 8 and 4 can use
            print(f"shipped head, one drafting round (2 new context positions, depths 1-{depth} of block {block}): "
                  f"{median_ms(lambda: draft(depth)):.1f} ms")


if __name__ == "__main__":
    main()
