source docs/results/head_runs/gpu/setup.sh
BUDGET=${BUDGET:-330}
steps=${STEPS:-$(python3 -c "r=float(open('/tmp/w/runtime').read())/30; print(max(${MIN:-200}, int($BUDGET/r)//50*50))")}
evs=$(( steps/5 > 0 ? steps/5 : 1 )); echo "steps $steps eval every $evs"
rm -rf /tmp/run
A=/tmp/w/answers
for src in sharegpt-turns math leetcode sharegpt-open magpie; do
  [ -f $A/$src/meta.json ] || { echo "missing answers: $A/$src (carried by an earlier call? see README.md)"; exit 1; }
done
DATA="$A/sharegpt-turns $A/math $A/leetcode $A/sharegpt-open $A/magpie" \
  timeout $((BUDGET+150)) bash docs/results/head_runs/gpu/train.sh python3 /tmp/run $steps 32 $evs --early-stopping 3 > /tmp/w/c.log 2>&1; echo "train rc $?"
tail -n 300 /tmp/w/c.log > $OUT/train.log
src=/tmp/run; [ -f /tmp/run/model.safetensors ] || src=$(ls -d /tmp/run/checkpoint-* | sort -V | tail -1)
echo "head from $src"; cp $src/config.json $OUT/ ; for f in train_summary.json log_history.json README.md; do [ -f /tmp/run/$f ] && cp /tmp/run/$f $OUT/; done
[ -f $src/trainer_state.json ] && cp $src/trainer_state.json $OUT/
split -b 15000000 $src/model.safetensors $OUT/model.part-
ls -la $OUT; grep -o "eval_chain_tau': '[0-9.]*'" /tmp/w/c.log | tr '\n' ' '; tail -2 /tmp/w/c.log | cut -c1-400
