"""Every causal-LM family the installed transformers ships, as a tiny random model, through every hf_jetspec strategy.

    .venv/bin/python docs/family_sweep.py                       # all families, a Markdown table on stdout
    .venv/bin/python docs/family_sweep.py llama gemma4_text     # some families
    .venv/bin/python docs/family_sweep.py --json docs/results/family_sweep.json
    .venv/bin/python docs/family_sweep.py --prefill               # continuing from a filled cache, chunked prefill

A regression net for transformers upgrades (each release adds families). For each model type of
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: build it from its default config shrunk to a few layers of width 32 (a second
try keeps the default layer count and head size, which some configs tie to other fields), run plain greedy
``generate()`` for 16 tokens, then each strategy:

* ``tree``: JetSpec with a drafter that knows the greedy continuation but often ranks it second, so accepted paths
  leave the first branch (verifies positions, masks and cache compaction of branching trees);
* ``head``: JetSpec with an untrained head sized for the target by ``JetSpecHead.for_target`` (its taps, the merged
  tree and the cost-curve timing);
* ``suffix``, ``jacobi``: the training-free strategies.

With ``--prefill`` the strategies are ``tree`` and ``suffix`` on two other prefills, each against plain greedy with
the same setting: ``continue`` (a cache already holding the prompt's first 4 tokens, as a chat's earlier turns) and
``chunks`` (``prefill_chunk_size=3``); a setting plain ``generate()`` itself fails on is left out.

Outcomes per family: ``lossless`` (every strategy returned plain greedy's tokens), ``refused`` (every strategy
raised hf_jetspec's ValueError naming the problem), ``partly refused`` (some strategies lossless, the others
refused by name: a head cannot tap BERT-style layer stacks), ``not built`` (plain ``generate()`` itself failed on the shrunk
config: not a finding about hf_jetspec), ``drift`` (other tokens, from a model whose own one-token and multi-token
forwards differ far beyond float32 rounding: `forward_drift`), and the findings ``DIFF`` (other tokens) and
``CRASH`` (any other exception), which must not occur.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
import warnings

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hf_jetspec
from hf_jetspec import JetSpecHead
from hf_jetspec.attention import sliding_window
from hf_jetspec.cache import cache_kwarg, full_layers
from hf_jetspec.drafters import ScrambledOracleDrafter

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=256, moe_intermediate_size=32,
             num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
             first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
             v_head_dim=8, initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, n_embd=32,
             n_head=4, n_layer=2, n_positions=256, d_model=32, ffn_dim=64, n_inner=64,
             shared_expert_intermediate_size=32, tie_word_embeddings=False)
KEEP_DEPTH = ("num_hidden_layers", "n_layer", "head_dim")  # left at their defaults on the second try
DRIFT = 1e-3  # `forward_drift` beyond float32 rounding


class Timeout(Exception):
    pass


def build(model_type: str, shrink_depth: bool):
    defaults = AutoConfig.for_model(model_type).to_dict()
    small = {k: v for k, v in SMALL.items() if shrink_depth or k not in KEEP_DEPTH}
    kwargs = {k: v for k, v in small.items() if k in defaults}
    text = defaults.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in kwargs:
        kwargs["text_config"] = {**text, **{k: v for k, v in small.items() if k in text}}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    if model.config.is_encoder_decoder:
        raise RuntimeError("an encoder-decoder model")
    return model


def strategies(model, reference: torch.Tensor) -> dict:
    return {
        "tree": lambda: dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=10, retrieval=False,
                             drafter=ScrambledOracleDrafter(reference, VOCAB, block_size=6, seed=1)),
        "head": lambda: dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=8,
                             draft_head=JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)),
        "suffix": lambda: dict(custom_generate=hf_jetspec.suffix_generate, node_cost=0.05),
        "jacobi": lambda: dict(custom_generate=hf_jetspec.jacobi_generate),
    }


def prefill_cases(model, prompt: torch.Tensor) -> dict:
    """``name -> (make kwargs, plain greedy's tokens with the same prefill)`` for ``--prefill``."""
    key = cache_kwarg(model)

    def filled():
        cache = full_layers(DynamicCache(config=model.config), sliding_window(model)[0])
        with torch.no_grad():
            model(prompt[:, :4], use_cache=True, **{key: cache})
        return {key: cache}

    cases = {}
    for setting, extra in (("continue", filled), ("chunks", lambda: {"prefill_chunk_size": 3})):
        try:
            expected = model.generate(prompt, do_sample=False, max_new_tokens=16, **extra())
        except Timeout:
            raise
        except Exception:  # noqa: BLE001 (plain generate() fails on this prefill: nothing to compare with)
            continue
        for name in ("tree", "suffix"):
            make = strategies(model, expected)[name]
            cases[f"{setting}-{name}"] = (lambda make=make, extra=extra: {**make(), **extra()}, expected)
    return cases


@torch.no_grad()
def forward_drift(model, ids: torch.Tensor) -> float:
    """Largest difference between the last position's logits of one forward over ``ids [1, T]`` and of one-token
    forwards fed one after another (how plain ``generate()`` decodes), relative to the logits' spread. Last-bit
    rounding gives ~1e-6; a model whose layers amplify it (hard activation thresholds) gives far more, and then any
    speculative method, transformers' prompt lookup included, drifts from plain greedy in float32 as in bf16."""
    full = model(ids).logits[0, -1]
    cache = DynamicCache(config=model.config)
    for t in range(ids.shape[1]):
        step = model(ids[:, t : t + 1], use_cache=True, **{cache_kwarg(model): cache}).logits[0, -1]
    return float((step - full).abs().max() / full.std().clamp(min=1e-6))


def sweep_family(model_type: str, prefill: bool = False) -> dict:
    prompt = torch.randint(3, VOCAB - 6, (1, 7), generator=torch.Generator().manual_seed(1))
    errors = []
    for shrink_depth in (True, False):
        try:
            model = build(model_type, shrink_depth)
            reference = model.generate(prompt, do_sample=False, max_new_tokens=16)
            break
        except Timeout:
            raise
        except Exception as e:  # noqa: BLE001 (any failure of the shrunk config itself)
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:150]}")
    else:
        return {"outcome": "not built", "detail": errors[-1]}
    results = {}
    cases = prefill_cases(model, prompt) if prefill else \
        {name: (make, reference) for name, make in strategies(model, reference).items()}
    if not cases:
        return {"outcome": "not built", "detail": "plain generate() fails on both prefills"}
    for name, (kwargs, expected) in cases.items():
        try:
            out = model.generate(prompt, do_sample=False, max_new_tokens=16, **kwargs())
            results[name] = "OK" if torch.equal(out, expected) else "DIFF"
        except Timeout:
            raise
        except Exception as e:  # noqa: BLE001
            frame = traceback.extract_tb(e.__traceback__)[-1]
            ours = "hf_jetspec" in frame.filename and isinstance(e, ValueError)
            results[name] = f"{'REFUSED' if ours else 'CRASH'} {type(e).__name__}: {str(e)[:200]}" + (
                "" if ours else f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})")
    kinds = {v.split()[0] for v in results.values()}
    if "DIFF" in kinds and (drift := forward_drift(model, reference)) > DRIFT:
        return {"outcome": "drift", "class": type(model).__name__,
                "detail": f"the model's own one-token and multi-token forwards differ by {drift:.2g} of its logits' "
                          f"spread (float32); {json.dumps(results)}"}
    outcome = "lossless" if kinds == {"OK"} else "refused" if kinds == {"REFUSED"} else \
        "DIFF" if "DIFF" in kinds else "CRASH" if "CRASH" in kinds else "partly refused"
    if outcome == "refused":
        detail = next(iter(results.values())).split(" ", 1)[1]
    elif outcome == "partly refused":
        detail = "; ".join(f"{name}: {v.split(' ', 1)[1]}" for name, v in results.items() if v != "OK") + \
            " (lossless: " + ", ".join(name for name, v in results.items() if v == "OK") + ")"
    else:
        detail = "" if outcome == "lossless" else json.dumps(results)
    return {"outcome": outcome, "class": type(model).__name__, "detail": detail}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("families", nargs="*", help="model types (default: every causal-LM family)")
    p.add_argument("--timeout", type=int, default=90, help="seconds per family")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--prefill", action="store_true", help="continuing from a filled cache and chunked prefill instead")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Timeout()))
    families = args.families or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    results = {}
    for model_type in families:
        start = time.perf_counter()
        signal.alarm(args.timeout)
        try:
            results[model_type] = sweep_family(model_type, args.prefill)
        except Timeout:
            results[model_type] = {"outcome": "not built", "detail": f"over {args.timeout} s"}
        finally:
            signal.alarm(0)
        print(f"{model_type}: {results[model_type]['outcome']} ({time.perf_counter() - start:.0f} s)",
              file=sys.stderr, flush=True)
    signal.signal(signal.SIGALRM, previous)
    order = ["DIFF", "CRASH", "lossless", "drift", "partly refused", "refused", "not built"]
    print(f"transformers {transformers.__version__}, hf_jetspec {hf_jetspec.__version__}, {len(families)} families\n")
    print("| outcome | count | families |\n|---|---|---|")
    for outcome in order:
        names = [m for m, r in results.items() if r["outcome"] == outcome]
        if names:
            print(f"| {outcome} | {len(names)} | {', '.join(names)} |")
    print("\n| family | outcome | detail |\n|---|---|---|")
    for model_type, r in results.items():
        if r["outcome"] != "lossless":
            print(f"| {model_type} | {r['outcome']} | {r['detail'].replace('|', '/')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "results": results}, f, indent=1)
    return 1 if any(r["outcome"] in ("DIFF", "CRASH") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
