"""``hf-jetspec``: generate (streaming), bench (side by side), convert-gguf, train."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .cpu import tune_mkl
from .models import DTYPES
from .strategies import STRATEGIES

# Strategies `generate` can run (the oracle needs plain greedy's output: benchmark only).
GENERATE_STRATEGIES = tuple(name for name, spec in STRATEGIES.items() if "reference" not in spec.needs)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def load_datastore(path, head_path, model, head):
    """The retrieval datastore: ``--datastore PATH``, else the head's (``--head`` or the shipped default head's)."""
    from .retrieval import load_retrieval_assets
    from .suffix_index import CorpusIndex

    if path is not None:
        return CorpusIndex.load(path)
    if head is not None:
        return head.datastore
    if head_path is None:
        from .models import default_head

        head = default_head(model)
        return None if head is None else head.datastore
    return load_retrieval_assets(head_path)[0]


def load_resources(args, model, names):
    """The `Resources` the strategies ``names`` need: the head (``--head`` or the shipped default) and the draft
    model (``--draft-model`` / ``--draft-layers``)."""
    from .models import load_draft, load_head
    from .strategies import Resources

    needs = {need for name in names for need in STRATEGIES[name].needs}
    resources = Resources(block_size=getattr(args, "oracle_block", 16))
    if "head" in needs:
        resources.head = load_head(args.head, model, on_untrained=_note)
    if "datastore" in needs:
        resources.datastore = load_datastore(args.datastore, args.head, model, resources.head)
    resources.draft_model = load_draft(model, args.draft_model, args.draft_layers, args.dtype, args.device)
    return resources


def cmd_generate(args) -> int:
    from transformers import TextStreamer

    from .models import load_target
    from .prompts import encode_prompt

    model, tokenizer = load_target(args.model, args.dtype, args.device)
    ids = encode_prompt(tokenizer, args.prompt, chat=args.chat).to(model.device)
    spec = STRATEGIES[args.strategy]
    if "draft_model" in spec.needs and not (args.draft_model or args.draft_layers):
        raise CLIError(f"--strategy {args.strategy} needs --draft-model (a model with the same tokenizer) or "
                       "--draft-layers K")
    resources = load_resources(args, model, [args.strategy])
    kwargs = dict(do_sample=False, max_new_tokens=args.max_new_tokens)
    kwargs |= spec.generate_kwargs(resources, args.budget)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    stream_key = "token_streamer" if spec.function is not None else "streamer"
    if args.compare:  # warm both paths up first, so neither timing pays for first-call setup
        model.generate(ids, **(kwargs | {"max_new_tokens": 4}))
        model.generate(ids, do_sample=False, max_new_tokens=4)
    start = time.perf_counter()
    out = model.generate(ids, **kwargs, **{stream_key: streamer})
    seconds = time.perf_counter() - start
    sequences = out.sequences if hasattr(out, "sequences") else out
    new = sequences.shape[1] - ids.shape[1]
    stats = getattr(out, "stats", None)
    tau = stats.tau if stats is not None else 1.0
    print(f"\n[{args.strategy}] {new} tokens in {seconds:.2f} s: {new / seconds:.1f} tokens/s, "
          f"tau {tau:.2f} tokens per target forward")
    if args.compare and args.strategy != "ar":
        start = time.perf_counter()
        plain = model.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens)
        base = time.perf_counter() - start
        same = torch.equal(plain, sequences)
        print(f"[plain generate] {plain.shape[1] - ids.shape[1]} tokens in {base:.2f} s: "
              f"{(plain.shape[1] - ids.shape[1]) / base:.1f} tokens/s")
        print(f"speedup {base / seconds * new / max(1, plain.shape[1] - ids.shape[1]):.2f}x, "
              f"output {'identical to' if same else 'DIFFERENT from'} plain greedy generate")
    return 0


def cmd_bench(args) -> int:
    from . import bench
    from .prompts import limit_per_category, load_prompts

    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        raise CLIError(f"--budgets must be comma-separated integers, got {args.budgets!r}") from None
    try:
        temperatures = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        raise CLIError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    strategies = bench.parse_strategies(args.strategies, budgets, temperatures)
    prompts = limit_per_category(
        load_prompts(args.prompts, field=args.field, category_field=args.category_field), args.limit
    )
    if not prompts:
        raise CLIError(f"No prompts in {args.prompts}")
    from .models import load_target

    model, tokenizer = load_target(args.model, args.dtype, args.device)
    resources = load_resources(args, model, {s.kind for s in strategies})
    exact = args.dtype == "float32"

    def report(prompt_id, name, position):
        tag = "MISMATCH" if exact else "drift (expected in reduced precision)"
        print(f"!!! {tag}: {name} differs from plain greedy on prompt {prompt_id} after {position} identical new "
              "tokens", file=sys.stderr)

    result = bench.benchmark(model, tokenizer, prompts, strategies, args.max_new_tokens, resources,
                             chat=args.chat, on_mismatch=report)
    print(bench.format_table(result.summary()))
    if args.per_category:
        for category, summary in result.per_category().items():
            print(f"\n[{category}]\n{bench.format_table(summary)}")
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    if args.json:
        bench.write_json(args.json, result, model, settings)
        print(f"wrote {args.json}")
    if args.plots:
        for path in bench.write_plots(args.plots, result):
            print(f"wrote {path}")
    if result.mismatches and exact:
        print(f"FAILED: {len(result.mismatches)} greedy outputs differ from plain greedy generate", file=sys.stderr)
        return 1
    return 0


def cmd_convert(args) -> int:
    from .models import convert_gguf

    print(convert_gguf(args.gguf, args.out, force=args.force))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-jetspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p):
        p.add_argument("--model", help="HF model folder or Hub id (default: embedded SmolLM2-135M-Instruct)")
        p.add_argument("--head", help="JetSpec head folder or Hub id (default: the shipped head)")
        p.add_argument("--datastore", default=None,
                       help="retrieval datastore (datastore.safetensors or its folder; default: the head's)")
        p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
        p.add_argument("--device", default=None)
        p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                       help="apply the chat template when the tokenizer has one (default: on)")

    g = sub.add_parser("generate", help="stream a completion and report tau and tokens/s")
    model_args(g)
    g.add_argument("--strategy", choices=GENERATE_STRATEGIES, default="jetspec")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--budget", type=int, default=None, help="tree budget (default: the head's)")
    g.add_argument("--draft-model", default=None, help="draft model (same tokenizer) for --strategy spec-jacobi")
    g.add_argument("--draft-layers", type=int, default=None,
                   help="use the target's first K layers as the draft model (instead of --draft-model)")
    g.add_argument("--compare", action="store_true", help="also run plain generate and print the speedup")
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="benchmark strategies side by side on a prompt set")
    model_args(b)
    b.add_argument("--prompts", default="mt-bench", help="mt-bench | sharegpt | code-math | path to a JSONL file")
    b.add_argument("--field", default="prompt", help="JSONL field holding the prompt text")
    b.add_argument("--category-field", default=None, help="JSONL field holding the category")
    b.add_argument("--limit", type=int, default=None, help="prompts per category")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--strategies", default="ar,jetspec", help="comma list of: " + ", ".join(STRATEGIES))
    b.add_argument("--budgets", default="32", help="comma list of JetSpec tree budgets")
    b.add_argument("--temperatures", default="0",
                   help="comma list of temperatures: 0 = greedy (outputs checked against plain greedy), > 0 = every "
                        "strategy and the plain-generate baseline sample (names get a /T<t> suffix)")
    b.add_argument("--oracle-block", type=int, default=16, help="block size of the oracle drafter")
    b.add_argument("--draft-model", default=None, help="draft model (HF folder) for the 'assisted' and 'spec-jacobi' strategies")
    b.add_argument("--draft-layers", type=int, default=None,
                   help="use the target's first K layers as the draft model (instead of --draft-model)")
    b.add_argument("--per-category", action="store_true", help="print a table per category")
    b.add_argument("--json", default=None, help="write results as JSON")
    b.add_argument("--plots", default=None, help="write PNG plots into this folder")
    b.set_defaults(func=cmd_bench)

    sub.add_parser("train", help="train a JetSpec head with the transformers Trainer (see `hf-jetspec train -h`)")

    c = sub.add_parser("convert-gguf", help="convert a GGUF file to an HF folder (cached by file hash)")
    c.add_argument("gguf")
    c.add_argument("--out", default=None)
    c.add_argument("--force", action="store_true")
    c.set_defaults(func=cmd_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line, a fresh process: tune MKL before its first matrix product
        tune_mkl()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # the trainer has its own argument parser
        from .training.trainer import main as train_main

        return train_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "draft_model", None) and getattr(args, "draft_layers", None):
            raise CLIError("give --draft-model or --draft-layers, not both")
        return args.func(args)
    except (CLIError, ValueError, FileNotFoundError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"hf-jetspec: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
