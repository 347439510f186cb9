#!/usr/bin/env bash
# Full-scale JetSpec head training on a CUDA machine (minutes instead of CPU hours):
#   1. the target answers every ShareGPT prompt (all human turns), recording its states for training;
#   2. accelerate launch of the Trainer on all GPUs (bf16).
# Usage: MODEL=Qwen/Qwen3-8B OUT=runs/qwen3-8b bash training/gpu.sh     (MODEL empty = embedded SmolLM2-135M)
set -euo pipefail
MODEL=${MODEL:-}
OUT=${OUT:-runs/gpu}
EPOCHS=${EPOCHS:-6}
LAYERS=${LAYERS:-5}
mkdir -p "$OUT"
model_arg=()
[ -n "$MODEL" ] && model_arg=(--model "$MODEL")

python -m hf_jetspec.training.data "${model_arg[@]}" --device cuda --dtype bf16 --turns all \
    --out "$OUT/data.jsonl" --states-dir "$OUT/states" --batch-size 128 --max-new-tokens 1024

accelerate launch -m hf_jetspec.training "${model_arg[@]}" --target-dtype bfloat16 --bf16 \
    --data "$OUT/data.jsonl" --features "$OUT/states" --output-dir "$OUT/head" \
    --head-layers "$LAYERS" --taps "$LAYERS" --block-size 16 --num-anchors 512 --max-length 3072 \
    --lr 6e-4 --epochs "$EPOCHS" --batch-size 4 --warmup-ratio 0.04 --eval-count 32 --eval-train-count 32 --eval-steps 2000
