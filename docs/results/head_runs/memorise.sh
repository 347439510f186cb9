#!/bin/bash
# The memorising regime at small scale (issue 21's regularisation question): fresh 3-layer heads of the shipped
# shape and loss, 800 steps of batch 4 at lr 6e-4 cosine, on 256 ShareGPT later turns (12.5 epochs) or on those plus
# 768 more (1,024 rows, 3.1 epochs); every 100 steps the teacher-forced chain tau of the 64 held-out rows and of 64
# trained rows (--eval-train-count), so log_history.json is the gap curve, and the shipped head's gap on the same rows
# (--eval-reference: it saw neither set), what the rows' composition alone makes. One option changed per run.
# Usage: bash memorise.sh [RUN ...]   (no names: every run whose head is missing)
set -e
cd "$(dirname "$0")/../../.."
py=.venv/bin/python
w=${WORK:-/tmp/mem}
mkdir -p $w
if [ ! -f $w/small.jsonl ]; then  # 320 rows (64 held out + 256 trained) and 768 more, drawn once from the store
  $py - "$w" <<'PY'
import json, random, sys
from hf_jetspec.training.features import read_rows
rows = [r for r in read_rows("data/answers/sharegpt-turns") if r.get("eval_candidate", True)]
random.Random(1).shuffle(rows)
for name, part in (("small", rows[:320]), ("more", rows[320:1088])):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps({k: r[k] for k in ("id", "input_ids", "prompt_len")}) + "\n" for r in part)
PY
fi
common="--max-prompt-tokens 256 --target-dtype bfloat16 --bf16 --logits-dtype bfloat16 --head-layers 3
  --block-size 16 --depth-decay 4 --sample-slots --num-anchors 24 --lr 6e-4 --warmup-ratio 0.02 --max-steps 800
  --batch-size 4 --eval-count 64 --eval-train-count 64 --eval-decode-count 0 --eval-steps 100 --save-steps 100000
  --logging-steps 50 --seed 0 --eval-reference src/hf_jetspec/assets/heads/smollm2-135m-instruct"
if [ ! -f $w/feat-more/done ]; then
  $py -m hf_jetspec.training.features --data $w/more.jsonl --out $w/feat-more --layers 1 14 27 --eval-count 0 \
    --max-prompt-tokens 256 --target-dtype bfloat16
  touch $w/feat-more/done
fi
ONLY="$*"
run() { name=$1; shift; [ -f $w/$name/model.safetensors ] && return
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  echo "== $name $(date +%T)"
  .venv/bin/hf-jetspec train $common --output-dir $w/$name "$@" > $w/$name.log 2>&1
  echo "== $name done $(date +%T): $(tail -1 $w/$name.log)"; }
run base --data $w/small.jsonl --features $w/feat-small  # the first run builds feat-small (its 256 trained rows)
run noise --data $w/small.jsonl --features $w/feat-small --feature-noise 0.1
run dropout --data $w/small.jsonl --features $w/feat-small --dropout 0.1
run rows1024 --data $w/small.jsonl $w/more.jsonl --features $w/feat-small $w/feat-more
# the rest of the issue's list in the same regime: anchors drawn once (not afresh each of the 12.7 epochs), an
# acceptance-targeted loss next to the KL, and 1 or 2 head layers instead of 3
run fixed --data $w/small.jsonl --features $w/feat-small --fixed-anchors
run layers1 --data $w/small.jsonl --features $w/feat-small --head-layers 1
run accept --data $w/small.jsonl --features $w/feat-small --acceptance-loss 1.0
run layers2 --data $w/small.jsonl --features $w/feat-small --head-layers 2
