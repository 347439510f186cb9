"""``hf-jetspec``: generate (streaming), bench (side by side), convert-gguf, train, export-vllm."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .bench import STRATEGY_KINDS
from .cpu import tune_mkl

STRATEGIES = ("jetspec", "jacobi", "spec-jacobi", "ar")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def load_target(path: str | None, dtype: str, device: str | None):
    """(model, tokenizer): ``path`` (an HF folder or Hub id) or the embedded default SmolLM2-135M-Instruct."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import default_model

    if path is None:
        return default_model(DTYPES[dtype], device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation="sdpa")
    if device is not None:
        model = model.to(device)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def load_head(path: str | None, model, quiet: bool = False):
    """The head at ``path``; else the shipped default head for the default model; else an untrained head."""
    from .head import JetSpecHead
    from .models import default_head, head_dtype

    if path is not None:
        head = JetSpecHead.from_pretrained(path)
    else:
        head = default_head(model)
        if head is None:
            if not quiet:
                print("note: no trained head ships for this model: using an UNTRAINED head (tau ~ 1, no speedup)",
                      file=sys.stderr)
            torch.manual_seed(0)
            head = JetSpecHead.for_target(model)
    param = next(model.parameters())
    head = head.to(device=param.device, dtype=head_dtype(param))
    head.check_target(model)
    return head


def load_draft(args, model):
    """The draft model for spec-jacobi / assisted: ``--draft-model PATH`` or ``--draft-layers K`` (the target's own
    first K layers, `hf_jetspec.models.truncated_draft`); None when neither is given."""
    from .models import truncated_draft

    if args.draft_layers:
        return truncated_draft(model, args.draft_layers)
    return load_target(args.draft_model, args.dtype, args.device)[0] if args.draft_model else None


def cmd_generate(args) -> int:
    from transformers import TextStreamer

    from .bench import encode_prompt
    from .decoding.jacobi import jacobi_generate
    from .decoding.jetspec import jetspec_generate
    from .decoding.spec_jacobi import speculative_jacobi_generate

    model, tokenizer = load_target(args.model, args.dtype, args.device)
    ids = encode_prompt(tokenizer, args.prompt, chat=args.chat).to(model.device)
    kwargs = dict(do_sample=False, max_new_tokens=args.max_new_tokens)
    if args.strategy == "jetspec":
        head = load_head(args.head, model)
        kwargs |= dict(custom_generate=jetspec_generate, draft_head=head, tree_budget=args.budget,
                       return_dict_in_generate=True)
    elif args.strategy == "jacobi":
        kwargs |= dict(custom_generate=jacobi_generate, return_dict_in_generate=True)
    elif args.strategy == "spec-jacobi":
        draft = load_draft(args, model)
        if draft is None:
            raise CLIError("--strategy spec-jacobi needs --draft-model (a model with the same tokenizer) or "
                           "--draft-layers K")
        kwargs |= dict(custom_generate=speculative_jacobi_generate, draft_model=draft, return_dict_in_generate=True)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    stream_key = "streamer" if args.strategy == "ar" else "token_streamer"
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
    model, tokenizer = load_target(args.model, args.dtype, args.device)
    resources = bench.Resources(block_size=args.oracle_block)
    if any(s.kind in bench.HEAD_KINDS for s in strategies):
        resources.head = load_head(args.head, model)
    resources.draft_model = load_draft(args, model)
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
        p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
        p.add_argument("--device", default=None)
        p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                       help="apply the chat template when the tokenizer has one (default: on)")

    g = sub.add_parser("generate", help="stream a completion and report tau and tokens/s")
    model_args(g)
    g.add_argument("--strategy", choices=STRATEGIES, default="jetspec")
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
    b.add_argument("--prompts", default="mt-bench", help="mt-bench | sharegpt | path to a JSONL file")
    b.add_argument("--field", default="prompt", help="JSONL field holding the prompt text")
    b.add_argument("--category-field", default=None, help="JSONL field holding the category")
    b.add_argument("--limit", type=int, default=None, help="prompts per category")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--strategies", default="ar,jetspec", help="comma list of: " + ", ".join(STRATEGY_KINDS))
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

    from .export_vllm import add_export_command

    add_export_command(sub)  # export-vllm
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
