#!/bin/bash
# Random init vs the target's own top layers (--init-from-target), the same short from-scratch recipe: a fresh
# 3-layer head of the shipped shape and loss, 1,000 steps of batch 4 at lr 6e-4 cosine on the ShareGPT later turns
# of the answer store (2,688 training rows, prompts cut to 256 tokens), held-out chain tau on the ablation table's
# 64 evaluation rows every 250 steps. `RUNS=target LR=2e-4` repeats the second at a lower learning rate.
set -e
cd "$(dirname "$0")/../../.."
py=.venv/bin/python
store=/work/feat/turns
if [ ! -f $store/done ]; then
  $py -m hf_jetspec.training.features --data data/answers/sharegpt-turns --out $store --layers 1 14 27 \
    --eval-count 64 --seed 0 --max-prompt-tokens 256 --target-dtype bfloat16
  touch $store/done
fi
for run in ${RUNS:-random target}; do
  extra=""; [ $run = target ] && extra="--init-from-target"
  name=init-$run${LR:+-lr$LR}  # LR=2e-4 RUNS=target: the third run
  .venv/bin/hf-jetspec train --data data/answers/sharegpt-turns --features $store --output-dir /work/runs/$name \
    --max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 $extra \
    --head-layers 3 --block-size 16 --depth-decay 4 --sample-slots --num-anchors 24 \
    --lr ${LR:-6e-4} --warmup-ratio 0.02 --max-steps 1000 --batch-size 4 \
    --eval-count 64 --eval-decode-count 0 --eval-steps 250 --save-steps 1000 --logging-steps 50 --seed 0 \
    > /work/runs/$name.log 2>&1
  echo "$name done $(date +%T): $(tail -1 /work/runs/$name.log)"
done
