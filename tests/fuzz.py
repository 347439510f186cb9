"""Out-of-suite fuzzing: the suite's equivalence sweeps at case indices (and target seeds) the tests never run.

    python tests/fuzz.py greedy 1000 1400   # JetSpec (sweep_case of test_equivalence), Jacobi, speculative
                                            # Jacobi, suffix decoding: tokens == plain greedy generate()
    python tests/fuzz.py batch 0 80         # left-padded batches of 1-5 rows, every strategy of test_batches
    python tests/fuzz.py sample 0 60        # sampling: JetSpec "match" (oracle and head), suffix, Jacobi draw for
                                            # draw against plain sampling with the same seed and warpers
    python tests/fuzz.py continue 0 100     # continuing from a filled cache (test_continuation's sweep): every
                                            # strategy == plain greedy from the same cache
    python tests/fuzz.py shapes 0 160       # random config variants of 16 families (vocabulary, heads, KV heads,
                                            # head size, depth, tied embeddings, bias, RoPE scaling, windows):
                                            # JetSpec (oracle, untrained head), suffix, Jacobi == plain greedy
    python tests/fuzz.py real 0 30          # the embedded SmolLM2 and its shipped head on a stored prompt of
                                            # data/answers (a source per case): six greedy routes == plain greedy
                                            # (with a random processor), two sampling routes draw for draw

Prints every failing case with its settings and the count at the end (exit status 1 if any failed). Not collected
by pytest (too slow for the suite: ~4-15 s per case on 2 cores, ~1 min for `real`); the suite runs the same checks
at fixed indices.
"""

from __future__ import annotations

import functools
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_batches as tb  # noqa: E402
import test_continuation as tc  # noqa: E402
import test_equivalence as te  # noqa: E402
import test_jacobi as tj  # noqa: E402
import torch  # noqa: E402
from helpers import TARGET_FAMILIES, ScrambledOracle, assert_same_tokens, greedy_reference, make_target  # noqa: E402

import hf_jetspec  # noqa: E402
from hf_jetspec import JetSpecHead  # noqa: E402


def greedy(i: int) -> list[str]:
    problems = []
    case = te.sweep_case(i) | {"model_seed": 4 + i % 5}  # targets the suite never builds
    checks = [("jetspec", lambda: te.run_case(**case)), ("jacobi", lambda: tj.run_jacobi_case(**tj.sweep_case(i)))]
    if i % 4 == 0:
        checks.append(("spec-jacobi", lambda: tj.test_speculative_jacobi_matches_greedy(i)))
    rng = random.Random(i)
    model = te.cached_target(TARGET_FAMILIES[i % 3], 4 + i % 5)
    base = torch.randint(3, 128, (1, rng.choice([3, 8, 20])), generator=torch.Generator().manual_seed(i))
    prompt, new = base.repeat(1, rng.choice([1, 2, 4])), rng.choice([5, 30, 60])  # repetitive: retrieval drafts

    def suffix():
        out = model.generate(prompt, do_sample=False, max_new_tokens=new, custom_generate=hf_jetspec.suffix_generate,
                             tree_budget=rng.choice([1, 4, 16, 64]))
        assert_same_tokens(greedy_reference(model, prompt, max_new_tokens=new), out, f"suffix {i}")

    checks.append(("suffix", suffix))
    for name, check in checks:
        try:
            check()
        except Exception as e:  # noqa: BLE001 - report every failure, go on
            problems.append(f"{name} {case if name == 'jetspec' else ''} {type(e).__name__}: {str(e)[:600]}")
    return problems


BATCH_SETTINGS = [dict(), dict(min_length=25, eos_token_id=7), dict(min_new_tokens=12, eos_token_id=9,
                  repetition_penalty=1.3), dict(no_repeat_ngram_size=3), dict(eos_token_id=[4, 11]),
                  dict(suppress_tokens=[5, 6], eos_token_id=13)]


def batch(i: int) -> list[str]:
    rng, problems = random.Random(i), []
    family = TARGET_FAMILIES[i % 3]
    model = make_target(family, seed=10 + i % 7, layers=rng.choice([1, 2, 4]))
    lengths = [rng.randint(1, 20) for _ in range(rng.randint(1, 5))]
    ids, mask = tb.left_padded(lengths, seed=i)
    settings = rng.choice(BATCH_SETTINGS)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=rng.choice([1, 6, 20, 40]), pad_token_id=0,
                  **settings)
    reference = model.generate(ids, **kwargs)
    hf_jetspec.enable(model)
    for name, extra in tb.strategies(model, reference[:, ids.shape[1]:]).items():
        try:
            out = model.generate(ids, **kwargs, **extra)
            assert out.shape == reference.shape, (out.shape, reference.shape)
            for row in range(ids.shape[0]):
                assert_same_tokens(reference[row : row + 1], out[row : row + 1], f"row {row}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name} {family} {lengths} {settings} {type(e).__name__}: {str(e)[:500]}")
    return problems


WARPERS = [dict(), dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8, temperature=1.3), dict(min_p=0.05),
           dict(repetition_penalty=1.2, top_k=20), dict(typical_p=0.8)]


def sample(i: int) -> list[str]:
    rng, problems = random.Random(i), []
    family = TARGET_FAMILIES[i % 3]
    model = make_target(family, seed=20 + i % 5, layers=rng.choice([1, 2, 3]))
    prompt = torch.randint(3, 128, (1, rng.randint(1, 12)), generator=torch.Generator().manual_seed(i))
    new, warpers = rng.choice([1, 5, 25]), rng.choice(WARPERS)
    oracle = ScrambledOracle(greedy_reference(model, prompt, max_new_tokens=new), 128, 6, seed=i)
    runs = {
        "jetspec-match-oracle": dict(custom_generate=hf_jetspec.jetspec_generate, sampling_rule="match",
                                     drafter=oracle, tree_budget=rng.choice([2, 8, 24])),
        "jetspec-match-head": dict(custom_generate=hf_jetspec.jetspec_generate, sampling_rule="match",
                                   draft_head=JetSpecHead.for_target(model, block_size=5, num_hidden_layers=1)),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate),
    }
    for name, extra in runs.items():
        for seed in (1000 * i, 1000 * i + 1):
            torch.manual_seed(seed)
            plain = model.generate(prompt, max_new_tokens=new, do_sample=True, **warpers)
            torch.manual_seed(seed)
            try:
                out = model.generate(prompt, max_new_tokens=new, do_sample=True, **warpers, **extra)
                assert out.tolist() == plain.tolist(), f"plain {plain.tolist()} vs {out.tolist()}"
            except Exception as e:  # noqa: BLE001
                problems.append(f"{name} {family} {warpers} seed {seed} {type(e).__name__}: {str(e)[:400]}")
    return problems


def continuation(i: int) -> list[str]:
    try:
        tc.test_every_strategy_continues_a_filled_cache_like_plain_greedy(i)
    except Exception as e:  # noqa: BLE001
        return [f"{type(e).__name__}: {str(e)[:600]}"]
    return []


SHAPE_FAMILIES = ["llama", "qwen3", "qwen3_moe", "mistral", "qwen2", "gemma3_text", "olmo2", "phi3", "granite",
                  "gemma2", "smollm3", "glm4", "cohere2", "exaone4", "ministral", "olmo3"]
ROPES = [None, dict(rope_type="linear", factor=2.0), dict(rope_type="dynamic", factor=2.0),
         dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=512),
         dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)]


def shaped_target(i: int):
    """A random config variant of one of SHAPE_FAMILIES (vocabulary, width, heads, KV heads, head size, depth, tied
    embeddings, attention bias, RoPE scaling, sliding windows): the shapes a user's model may have and the suite's
    three fixed targets do not."""
    from transformers import AutoConfig, AutoModelForCausalLM

    rng = random.Random(i)
    family = SHAPE_FAMILIES[i % len(SHAPE_FAMILIES)]
    heads = rng.choice([2, 4, 8])
    head_dim = rng.choice([8, 16, 32])
    layers = rng.randint(1, 5)
    config = AutoConfig.for_model(family)
    kwargs = dict(vocab_size=rng.choice([64, 97, 128, 300]), hidden_size=heads * head_dim,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=rng.choice([h for h in (1, 2, heads) if heads % h == 0]),
                  intermediate_size=rng.choice([32, 96, 160]), max_position_embeddings=1024, initializer_range=0.2,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=rng.random() < 0.5)
    if hasattr(config, "head_dim"):
        kwargs["head_dim"] = head_dim
    if hasattr(config, "attention_bias"):
        kwargs["attention_bias"] = rng.random() < 0.5
    if family == "qwen3_moe":
        kwargs |= dict(moe_intermediate_size=rng.choice([16, 48]), num_experts=4, num_experts_per_tok=2,
                       decoder_sparse_step=1)
    rope = rng.choice(ROPES)
    if rope is not None and family not in ("gemma3_text", "cohere2", "exaone4", "gemma2"):
        kwargs["rope_parameters"] = rope | dict(rope_theta=rng.choice([10000.0, 500000.0]))
    window = rng.choice([None, None, 4, 16])
    if window is not None and hasattr(config, "sliding_window"):
        kwargs["sliding_window"] = window
        if hasattr(config, "use_sliding_window"):
            kwargs["use_sliding_window"] = True
        if hasattr(config, "layer_types"):
            kwargs["layer_types"] = [rng.choice(["sliding_attention", "full_attention"]) for _ in range(layers)]
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(i)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model, family, kwargs


def shapes(i: int) -> list[str]:
    try:
        model, family, kwargs = shaped_target(i)
    except Exception as e:  # noqa: BLE001 - a config transformers itself rejects is not a finding
        print(f"shapes case {i}: skipped, the config does not build: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return []
    rng, problems = random.Random(-i), []
    vocab = model.config.vocab_size
    base = torch.randint(3, vocab, (1, rng.randint(1, 12)), generator=torch.Generator().manual_seed(i))
    prompt, new = base.repeat(1, rng.choice([1, 3])), rng.choice([5, 20, 40])
    reference = greedy_reference(model, prompt, max_new_tokens=new)
    runs = {
        "jetspec-oracle": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=rng.choice([2, 8, 24]),
                               drafter=ScrambledOracle(reference, vocab, 6, seed=i)),
        "jetspec-head": dict(custom_generate=hf_jetspec.jetspec_generate,
                             draft_head=JetSpecHead.for_target(model, block_size=5, num_hidden_layers=1)),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate),
    }
    for name, extra in runs.items():
        try:
            assert_same_tokens(reference, model.generate(prompt, do_sample=False, max_new_tokens=new, **extra))
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name} {family} {kwargs} {type(e).__name__}: {str(e)[:500]}")
    return problems


REAL_SOURCES = ["sharegpt-turns", "math", "leetcode", "magpie", "sharegpt-open"]


@functools.cache
def real_target():
    """SmolLM2-135M-Instruct (float32) enabled for assistant heads, its shipped head, and per source the stored
    prompts of at most 350 tokens (a real model, a trained head, text no test decodes from)."""
    from hf_jetspec.training.answers import read_answers

    model, _ = hf_jetspec.default_model()
    hf_jetspec.enable(model)
    pools = {source: [r["input_ids"][: r["prompt_len"]] for r in read_answers("data/answers", [source])
                      if r["prompt_len"] <= 350] for source in REAL_SOURCES}
    return model, hf_jetspec.default_head(model), pools


def real(i: int) -> list[str]:
    model, head, pools = real_target()
    rng, problems = random.Random(i), []
    source = REAL_SOURCES[i % len(REAL_SOURCES)]
    prompt = torch.tensor([rng.choice(pools[source])])
    new, processor = rng.choice([24, 64, 100]), rng.choice([{}, {}, dict(repetition_penalty=1.15),
                                                             dict(no_repeat_ngram_size=4)])
    reference = model.generate(prompt, do_sample=False, max_new_tokens=new, **processor)
    jetspec = dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head)
    greedy_runs = {"assistant": dict(assistant_model=head),
                   "jetspec": jetspec | dict(tree_budget=rng.choice([4, 16, 48])),
                   "head-only": jetspec | dict(retrieval=False, tree_budget=rng.choice([2, 8, 24])),
                   "chain": jetspec | dict(tree_builder="chain"),
                   "suffix": dict(custom_generate=hf_jetspec.suffix_generate),
                   "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate)}
    for name, extra in greedy_runs.items():
        try:
            assert_same_tokens(reference, model.generate(prompt, do_sample=False, max_new_tokens=new, **processor,
                                                         **extra))
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name} {source} {prompt.shape[1]} tokens {new} new {processor} {type(e).__name__}: "
                            f"{str(e)[:400]}")
    warpers = rng.choice(WARPERS)
    torch.manual_seed(i)
    plain = model.generate(prompt, do_sample=True, max_new_tokens=new, **warpers)
    for name, extra in {"assistant-sampling": dict(assistant_model=head),
                        "suffix-sampling": dict(custom_generate=hf_jetspec.suffix_generate)}.items():
        torch.manual_seed(i)
        try:
            out = model.generate(prompt, do_sample=True, max_new_tokens=new, **warpers, **extra)
            assert out.tolist() == plain.tolist(), "draws differ"
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name} {source} {warpers} {type(e).__name__}: {str(e)[:400]}")
    return problems


def main(argv: list[str]) -> int:
    mode, start, stop = argv[0], int(argv[1]), int(argv[2])
    check, failed, began = {"greedy": greedy, "batch": batch, "sample": sample, "continue": continuation,
                               "shapes": shapes, "real": real}[mode], 0, time.time()
    for i in range(start, stop):
        for problem in check(i):
            failed += 1
            print(f"FAIL {mode} case {i}: {problem}", flush=True)
        if (i - start) % 10 == 9:
            print(f"{mode}: cases {start}..{i} done, {failed} failed, {time.time() - began:.0f} s", flush=True)
    print(f"{mode}: {stop - start} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
