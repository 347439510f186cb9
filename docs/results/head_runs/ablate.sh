#!/bin/bash
# Regularisation ablations: fine-tune the shipped head on a 512-row subset (ShareGPT later turns, math) for
# 2 epochs (256 steps), each variant alone; held-out chain tau every 128 steps.
cd /work/main
common="--data data/answers/sharegpt-turns data/answers/math data/answers/leetcode --features /work/feat/sub
  --max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 --depth-decay 4 --sample-slots
  --num-anchors 24 --lr 2e-4 --max-steps 256 --batch-size 4 --eval-count 64 --eval-decode-count 0 --eval-steps 128
  --save-steps 100000 --logging-steps 16 --seed 0"
run() { name=$1; shift; [ -f /work/runs/$name/model.safetensors ] && return
  echo "== $name $(date +%T)"; .venv/bin/hf-jetspec train $common --output-dir /work/runs/$name "$@" > /work/runs/$name.log 2>&1
  echo "== $name done $(date +%T): $(tail -1 /work/runs/$name.log)"; }
run base --init-head /work/runs/init-shipped
run noise --init-head /work/runs/init-shipped --feature-noise 0.1
run dropout --init-head /work/runs/init-shipped --dropout 0.1
run accept --init-head /work/runs/init-shipped --acceptance-loss 1.0
run fixed --init-head /work/runs/init-shipped --fixed-anchors
run layers2 --init-head /work/runs/init-2layer
