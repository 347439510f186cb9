#!/usr/bin/env bash
# Reproduces every table in docs/results.md: `bash docs/benchmarks.sh` after `make setup` (2-core CPU: ~90 min).
# Each command runs its strategies in one process, interleaved per prompt, after a warm-up; JSON -> docs/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=".venv/bin/hf-jetspec bench --prompts mt-bench --max-new-tokens 128"
OUT=docs/results
mkdir -p "$OUT"
# 1. The shipped head on MT-Bench first turns (2 per category), greedy, tree budgets 4-32, beside the oracle bound.
$BENCH --limit 2 --strategies ar,jetspec,jetspec-oracle --budgets 4,8,16,32 --per-category \
    --json $OUT/mtbench.json --plots docs/figures/mtbench
# 2. AR vs Jacobi vs speculative Jacobi vs JetSpec (and HF's prompt lookup / assisted generation), one prompt per
#    category; the draft for spec-jacobi / assisted is SmolLM2's own first 6 layers.
$BENCH --limit 1 --strategies ar,prompt-lookup,assisted,jacobi,jacobi-pad,jacobi-pool,spec-jacobi,jetspec \
    --draft-layers 6 --budgets 8 --json $OUT/methods.json
# 3. Sampling beside greedy: T = 0, 0.7, 1; the two tree sampling rules.
$BENCH --limit 1 --strategies ar,jetspec,jetspec-rrs --budgets 8 --temperatures 0,0.7,1 --json $OUT/sampling.json
# 4. bfloat16: speed and how far multi-token forwards drift from one-token greedy decoding.
$BENCH --limit 1 --dtype bfloat16 --strategies ar,prompt-lookup,jetspec --budgets 8 --json $OUT/bf16.json
# 8. Retrieval: suffix decoding and merged trees beside prompt lookup and the head alone, on the held-out code/math
#    set and on MT-Bench; what a suffix-index lookup costs; default vs fitted calibration (~45 min together).
.venv/bin/hf-jetspec bench --prompts code-math --limit 12 --max-new-tokens 128 \
    --strategies ar,prompt-lookup,suffix,jetspec-head,jetspec --budgets 8,16 --per-category \
    --json $OUT/retrieval_code_math.json --plots docs/figures/retrieval/code_math
$BENCH --limit 4 --strategies ar,prompt-lookup,suffix,jetspec-head,jetspec --budgets 8,16 --per-category \
    --json $OUT/retrieval_mt_bench.json --plots docs/figures/retrieval/mt_bench
.venv/bin/python docs/lookup_cost.py | tee $OUT/lookup_cost.txt
.venv/bin/python docs/calibration_ablation.py --prompts code-math --limit 6 --budget 8 \
    --json $OUT/calibration_ablation.json
# 5. What a target forward costs by tokens processed (the cost side of a tree step).
.venv/bin/python docs/forward_cost.py
.venv/bin/python docs/results_tables.py $OUT/mtbench.json $OUT/methods.json $OUT/sampling.json $OUT/bf16.json
