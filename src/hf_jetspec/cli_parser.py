"""The hf-jetspec command line's arguments: the parser, its value types, and the checks that need no model (nor
torch), so that a mistake is one line at once, before the seconds torch and transformers take to import."""

from __future__ import annotations

import argparse
import math

from . import __version__
from .limits import MAX_FORWARD_TOKENS
from .strategies import STRATEGIES

# Strategies `generate` can run (the oracle needs plain greedy's output: benchmark only).
GENERATE_STRATEGIES = tuple(name for name, spec in STRATEGIES.items() if "reference" not in spec.needs)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the keys of models.DTYPES (not imported here: it needs torch)
DEFAULT_REPEATS = 5  # timed repetitions of each side of --compare
WARMUP_TOKENS = 16
DESCRIPTION = "hf-jetspec: generate (streaming), bench (side by side), calibrate, train, convert-gguf, export-vllm."


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


# ------------------------------------------------------------------------------------------------ argument types


def _integer(minimum: int, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _number(minimum: float, maximum: float | None = None, above: bool = False):
    """A finite float >= minimum (> minimum when ``above``) and <= maximum."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = value > minimum if above else value >= minimum
        if not math.isfinite(value) or not low_ok or (maximum is not None and value > maximum):
            low = f"> {minimum:g}" if above else f">= {minimum:g}"
            bound = f"{low} and <= {maximum:g}" if maximum is not None else low
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text!r}")
        return value

    return parse


MIN_TEMPERATURE = 1e-6  # below it float32 logits / T overflow to inf (and sampling is greedy in all but name)


def _temperature(text: str) -> float:
    """0 (greedy) or a number >= `MIN_TEMPERATURE`."""
    value = _number(0.0)(text)
    if 0 < value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g} (smaller temperatures "
                                         f"overflow the logits), got {text!r}")
    return value


def _comma_list(item):
    """A comma-separated list of ``item`` values (at least one)."""

    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",")]
        if not any(parts) or not all(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        try:
            return [item(part) for part in parts]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{err} (in {text!r})") from None

    return parse


def _strategy_name(text: str) -> str:
    if text not in STRATEGIES:
        raise argparse.ArgumentTypeError(f"Unknown strategy {text!r}; choose from {', '.join(STRATEGIES)}")
    return text


_budget = _integer(1, MAX_FORWARD_TOKENS)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``hf-jetspec: error: ... (see hf-jetspec CMD --help)``."""

    def error(self, message: str):
        self.exit(2, f"hf-jetspec: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hf-jetspec", description=DESCRIPTION,
                    epilog="Run `hf-jetspec COMMAND --help` for the options of a command.")
    parser.add_argument("--version", action="version", version=f"hf-jetspec {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_args(p):
        p.add_argument("--model", metavar="PATH",
                       help="HF model folder or Hub id (default: the embedded SmolLM2-135M-Instruct)")
        p.add_argument("--head", metavar="PATH",
                       help="JetSpec head folder or Hub id made for --model (default: the shipped head for the "
                            "default model, else an untrained one)")
        p.add_argument("--datastore", default=None, metavar="PATH",
                       help="retrieval datastore (datastore.safetensors or its folder; default: the head's)")
        p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                       help="weights' dtype (default: float32; bfloat16/float16 outputs may drift from plain "
                            "greedy, see docs/compatibility.md)")
        p.add_argument("--device", default=None, metavar="DEVICE",
                       help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
        p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                       help="apply the chat template when the tokenizer has one (default: on)")
        p.add_argument("--verbose", action="store_true",
                       help="show transformers' warnings and loading progress bars")

    def draft_args(p, used_by: str):
        p.add_argument("--draft-model", default=None, metavar="PATH",
                       help=f"draft model with the target's tokenizer (HF folder or Hub id) for {used_by}")
        p.add_argument("--draft-layers", type=_integer(1), default=None, metavar="K",
                       help="use the target's first K layers as the draft model (instead of --draft-model)")

    g = sub.add_parser("generate", help="stream a completion and report tau and tokens/s",
                       description="Stream one completion; with --compare also time plain generate().")
    model_args(g)
    g.add_argument("--strategy", choices=GENERATE_STRATEGIES, default="jetspec", metavar="NAME",
                   help=f"decoding strategy: {', '.join(GENERATE_STRATEGIES)} (default: jetspec; `hf-jetspec bench "
                        "--help` says what each does)")
    g.add_argument("--max-new-tokens", type=_integer(1), default=128, metavar="N",
                   help="most tokens to generate (default: 128)")
    g.add_argument("--budget", "--budgets", dest="budget", type=_budget, default=None, metavar="N",
                   help=f"tree budget: nodes verified per step, 1..{MAX_FORWARD_TOKENS} (default: the head's)")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                   help="0 = greedy (default; identical to plain greedy in float32), > 0 = sample")
    g.add_argument("--top-p", type=_number(0.0, 1.0, above=True), default=None, metavar="P",
                   help="nucleus sampling: keep the smallest top set of probability >= P (needs --temperature > 0)")
    g.add_argument("--top-k", type=_integer(0), default=None, metavar="K",
                   help="sample among the K most likely tokens, 0 = all (needs --temperature > 0)")
    g.add_argument("--seed", type=_integer(0, 2**63 - 1), default=None, metavar="S",
                   help="seed torch's generator before each run (sampling)")
    draft_args(g, "--strategy spec-jacobi / assisted")
    g.add_argument("--compare", action="store_true",
                   help="also time plain generate(): a warm-up, then --repeats interleaved runs of each; prints the "
                        "median speedup and its spread, and whether the outputs are identical")
    g.add_argument("--repeats", type=_integer(1, 100), default=DEFAULT_REPEATS, metavar="R",
                   help=f"timed runs of each side with --compare (default: {DEFAULT_REPEATS})")
    g.add_argument("prompt", help="the prompt (a user message when the chat template applies)")

    b = sub.add_parser("bench", help="benchmark strategies side by side on a prompt set",
                       description="Run every strategy on every prompt, interleaved, and compare with plain "
                                   "generate(). Strategies: " + "; ".join(f"{name}: {spec.description}"
                                                                          for name, spec in STRATEGIES.items()))
    model_args(b)
    b.add_argument("--prompts", default="mt-bench",
                   help="mt-bench | sharegpt | code-math | a JSONL file with one JSON object per line (default: "
                        "mt-bench)")
    b.add_argument("--field", default="prompt", help="JSONL field holding the prompt text (default: prompt)")
    b.add_argument("--category-field", default=None, help="JSONL field holding the category (default: none)")
    b.add_argument("--limit", type=_integer(1), default=None, metavar="N", help="prompts per category (default: all)")
    b.add_argument("--max-new-tokens", type=_integer(1), default=128, metavar="N",
                   help="tokens per answer (default: 128)")
    b.add_argument("--strategies", type=_comma_list(_strategy_name), default=["ar", "jetspec"], metavar="LIST",
                   help="comma list of: " + ", ".join(STRATEGIES) + " (default: ar,jetspec)")
    b.add_argument("--budgets", "--budget", dest="budgets", type=_comma_list(_budget), default=[32], metavar="LIST",
                   help=f"comma list of JetSpec tree budgets, each 1..{MAX_FORWARD_TOKENS} (default: 32)")
    b.add_argument("--temperatures", type=_comma_list(_temperature), default=[0.0], metavar="LIST",
                   help="comma list of temperatures: 0 = greedy (outputs checked against plain greedy), > 0 = every "
                        "strategy and the plain-generate baseline sample (names get a /T<t> suffix)")
    b.add_argument("--oracle-block", type=_integer(2, MAX_FORWARD_TOKENS), default=16, metavar="B",
                   help="block size of the oracle drafter (default: 16)")
    draft_args(b, "the 'assisted' and 'spec-jacobi' strategies")
    b.add_argument("--per-category", action="store_true", help="also print a table per category")
    b.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON to FILE")
    b.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots into the folder DIR")
    b.add_argument("--calibration-log", default=None, metavar="FILE",
                   help="write the merged trees' verification records (JSONL) to FILE, for `hf-jetspec calibrate`")

    k = sub.add_parser("calibrate", help="fit a merged tree's calibration from bench verification records",
                       description="Fit the acceptance estimates of merged (head + retrieval) trees from the records "
                                   "`hf-jetspec bench --calibration-log FILE` wrote, and save calibration.json into "
                                   "DIR (a head's folder: from_pretrained and generate() then use it).")
    k.add_argument("logs", nargs="+", metavar="LOG", help="JSONL files written by bench --calibration-log")
    k.add_argument("--out", required=True, metavar="DIR", help="folder that receives calibration.json")
    k.add_argument("--node-cost", default=None, metavar="KAPPA",
                   help="also store the node cost: a number >= 0, or 'measure' (timed on --model here); default: "
                        "keep DIR's, else measured at generation time")
    k.add_argument("--model", default=None, metavar="PATH", help="model for --node-cost measure (default: embedded)")

    sub.add_parser("train", add_help=False,
                   help="train a JetSpec head with the transformers Trainer (see `hf-jetspec train --help`)")

    c = sub.add_parser("convert-gguf", help="convert a GGUF file to an HF model folder (cached by file hash)",
                       description="Convert a GGUF file once into a Hugging Face folder. Files the conversion did "
                                   "not write are never deleted or overwritten.")
    c.add_argument("gguf", help="the .gguf file")
    c.add_argument("--out", default=None, metavar="DIR",
                   help="output folder: new, empty, or a previous conversion (default: the cache, "
                        "~/.cache/hf_jetspec/models/<hash>)")
    c.add_argument("--force", action="store_true",
                   help="convert again even if DIR already holds this conversion; also allows a non-empty DIR "
                        "that is not a conversion (the converted files are added, others are kept)")

    e = sub.add_parser("export-vllm", help="write a head in vLLM's DFlash layout (speculative method 'dflash')",
                       description="Write a JetSpec head in the layout vLLM and SGLang load DFlash drafters from "
                                   "(see docs/serving.md).")
    e.add_argument("head", help="JetSpec head folder or Hub id ('default': the shipped SmolLM2 head)")
    e.add_argument("out", help="output folder")
    e.add_argument("--target", default=None, metavar="MODEL",
                   help="target model folder or Hub id: needed for a head with a draft vocabulary (its LM-head rows "
                        "are written); default: the embedded SmolLM2 when the head was made for it")
    e.add_argument("--drop-draft-vocab", action="store_true",
                   help="export a draft-vocabulary head over the whole vocabulary instead (no target needed)")
    return parser


# ---------------------------------------------------------------------------------- checks before heavy imports


def check_arguments(args) -> None:
    """Cross-argument checks, the prompt file and output paths: everything that needs no model (nor torch)."""
    if getattr(args, "draft_model", None) and getattr(args, "draft_layers", None):
        raise CLIError("give --draft-model or --draft-layers, not both")
    if args.command == "generate":
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (kept by Python as surrogates)
            raise CLIError("the prompt is not valid UTF-8 text") from None
        if args.temperature == 0 and (args.top_p is not None or args.top_k is not None):
            raise CLIError("--top-p / --top-k shape sampling: add --temperature > 0 (0 = greedy)")
        if "draft_model" in STRATEGIES[args.strategy].needs and not (args.draft_model or args.draft_layers):
            raise CLIError(f"--strategy {args.strategy} needs --draft-model (a model with the same tokenizer) or "
                           "--draft-layers K")
    elif args.command == "bench":
        from .files import check_file_path, check_folder_path
        from .prompts import limit_per_category, load_prompts

        drafted = [name for name in args.strategies if "draft_model" in STRATEGIES[name].needs]
        if drafted and not (args.draft_model or args.draft_layers):
            raise CLIError(f"strategies {', '.join(drafted)} need --draft-model or --draft-layers K")
        if args.json:
            check_file_path(args.json, "--json")
        if args.plots:
            check_folder_path(args.plots, "--plots")
        if args.calibration_log:
            check_file_path(args.calibration_log, "--calibration-log")
        prompts = load_prompts(args.prompts, field=args.field, category_field=args.category_field)
        args.prompt_list = limit_per_category(prompts, args.limit)
        if not args.prompt_list:
            raise CLIError(f"No prompts in {args.prompts}")
    elif args.command in ("calibrate", "export-vllm"):  # both write into a folder: a file there was "[Errno 17]"
        from .files import check_folder_path

        check_folder_path(args.out, "--out" if args.command == "calibrate" else "out")
