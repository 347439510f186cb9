"""One offline vLLM run (a subprocess of vllm_common.run_offline): reads {model, prompts, spec, max_tokens} as JSON
on stdin, prints `RESULT {json}` with token ids, texts, seconds and the spec-decode counters."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams

    from vllm_common import ENGINE_ARGS, SPEC_COUNTERS, acceptance

    request = json.loads(sys.stdin.read())
    llm = LLM(model=request["model"], speculative_config=request["spec"], disable_log_stats=False,
              max_num_seqs=len(request["prompts"]), **ENGINE_ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    llm.generate(request["prompts"][:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
    before = counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(request["prompts"], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = counters(llm)
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "seconds": seconds,
        "spec": acceptance({k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}),
    }
    print("RESULT " + json.dumps(result), flush=True)


def counters(llm) -> dict:
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_") and hasattr(metric, "value"):
            out[metric.name.removeprefix("vllm:spec_decode_")] = metric.value
    return out


if __name__ == "__main__":  # vLLM spawns worker processes that re-import this module
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    main()
