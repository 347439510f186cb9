"""hf-jetspec: generate (streaming), bench (side by side), convert-gguf, export-vllm, train.

Arguments, prompt files and output paths are checked before torch and transformers are imported (that takes
seconds), so a mistake is one line at once; every user error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from contextlib import contextmanager

from . import __version__
from .limits import MAX_FORWARD_TOKENS
from .strategies import STRATEGIES

# Strategies `generate` can run (the oracle needs plain greedy's output: benchmark only).
GENERATE_STRATEGIES = tuple(name for name, spec in STRATEGIES.items() if "reference" not in spec.needs)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the keys of models.DTYPES (not imported here: it needs torch)
DEFAULT_REPEATS = 5  # timed repetitions of each side of --compare
WARMUP_TOKENS = 16


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


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
    parser = Parser(prog="hf-jetspec", description=__doc__.split("\n\n")[0],
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
    g.set_defaults(func=cmd_generate)

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
    b.set_defaults(func=cmd_bench)

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
    k.set_defaults(func=cmd_calibrate)

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
    c.set_defaults(func=cmd_convert)

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
    e.set_defaults(func=cmd_export_vllm)
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


@contextmanager
def quiet_libraries(verbose: bool):
    """Without --verbose: no transformers warnings (generation-flag notices, load reports), no library
    deprecation warnings and no "Loading weights" / download progress bars while the command runs; the command's
    own progress stays. The previous settings come back afterwards (``main`` may run inside a larger program)."""
    if verbose:
        yield
        return
    import huggingface_hub.utils
    from transformers.utils import logging

    verbosity, bars, hub_bars_off = (logging.get_verbosity(), logging.is_progress_bar_enabled(),
                                     huggingface_hub.utils.are_progress_bars_disabled())
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        if not hub_bars_off:
            huggingface_hub.utils.enable_progress_bars()


# ------------------------------------------------------------------------------------------------------- loading


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
    if "draft_model" in needs:
        resources.draft_model = load_draft(model, args.draft_model, args.draft_layers, args.dtype, args.device)
    return resources


# ------------------------------------------------------------------------------------------------------ generate


def sampling_kwargs(args) -> dict:
    """``generate()`` kwargs of --temperature / --top-p / --top-k (temperature 0: greedy)."""
    if args.temperature == 0:
        return {"do_sample": False}
    kwargs = {"do_sample": True, "temperature": args.temperature}
    if args.top_p is not None:
        kwargs["top_p"] = args.top_p
    if args.top_k is not None:
        kwargs["top_k"] = args.top_k
    return kwargs


def timed_generate(model, ids, kwargs: dict, seed: int | None) -> tuple:
    """(sequences [1, T], seconds, stats or None) of one ``model.generate(ids, **kwargs)``."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    seconds = time.perf_counter() - start
    return (out.sequences if hasattr(out, "sequences") else out), seconds, getattr(out, "stats", None)


def _progress(message: str, end: str = "\n") -> None:
    print(message, end=end, file=sys.stderr, flush=True)


def _median_spread(values: list[float]) -> tuple[float, float, float]:
    import statistics

    return statistics.median(values), min(values), max(values)


def busy_note() -> str | None:
    """A warning when other work already keeps this machine's CPUs busy (1-minute load average above half the
    core count): timings then depend on it, and torch's threads (one per core) wait on each other."""
    import os

    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    cores = os.cpu_count() or 1
    if load <= cores / 2:
        return None
    return (f"this machine is busy (load average {load:.1f} on {cores} cores): timings depend on the other work "
            "(the speedup below is a median of interleaved runs; OMP_NUM_THREADS=1 avoids torch's threads "
            "waiting on each other)")


def _eos_ids(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def cmd_generate(args) -> int:
    from .models import load_target
    from .prompts import encode_prompt
    from .streaming import TextPrinter

    model, tokenizer = load_target(args.model, args.dtype, args.device)
    ids = encode_prompt(tokenizer, args.prompt, chat=args.chat).to(model.device)
    spec = STRATEGIES[args.strategy]
    resources = load_resources(args, model, [args.strategy])
    sampling = sampling_kwargs(args)
    kwargs = {"max_new_tokens": args.max_new_tokens, **sampling, **spec.generate_kwargs(resources, args.budget)}
    plain = {"max_new_tokens": args.max_new_tokens, **sampling}
    compare = args.compare and args.strategy != "ar"
    if args.compare and not compare:
        _note("--compare with --strategy ar would compare plain generate with itself: skipped")
    if compare:  # neither timing may pay for first-call setup
        if (busy := busy_note()) is not None:
            _note(busy)
        _progress(f"[compare] warming up {args.strategy} and plain generate ...", end=" ")
        warm = time.perf_counter()
        timed_generate(model, ids, kwargs | {"max_new_tokens": min(WARMUP_TOKENS, args.max_new_tokens)}, args.seed)
        timed_generate(model, ids, plain | {"max_new_tokens": min(WARMUP_TOKENS, args.max_new_tokens)}, args.seed)
        _progress(f"done ({time.perf_counter() - warm:.1f} s)")

    printer = TextPrinter(tokenizer, skip_prompt=True, skip_special_tokens=True)
    stream_key = "token_streamer" if spec.entry is not None else "streamer"
    sequences, seconds, stats = timed_generate(model, ids, kwargs | {stream_key: printer}, args.seed)
    new = sequences.shape[1] - ids.shape[1]
    tau = stats.tau if stats is not None else 1.0
    print(f"[{args.strategy}] {new} tokens in {seconds:.2f} s: {new / seconds:.1f} tokens/s, "
          f"tau {tau:.2f} tokens per target forward", flush=True)
    if new >= args.max_new_tokens and int(sequences[0, -1]) not in _eos_ids(model):
        _note(f"the answer was cut at --max-new-tokens {args.max_new_tokens}; raise it for the rest")
    if compare:
        return report_comparison(args, model, ids, sequences, kwargs, plain)
    return 0


def report_comparison(args, model, ids, streamed, kwargs: dict, plain: dict) -> int:
    """--compare: ``args.repeats`` interleaved runs of the strategy and of plain generate (alternating which goes
    first); prints median tokens/s, the median per-pair speedup with its spread, and whether the outputs match.
    Returns 1 when a float32 greedy output differs from plain greedy's (a bug), else 0."""
    import torch

    prompt_len = ids.shape[1]
    pairs, outputs, reference = [], [streamed], None
    for i in range(args.repeats):
        _progress(f"\r[compare] timing run {i + 1}/{args.repeats} of each", end="")
        order = ("strategy", "plain") if i % 2 == 0 else ("plain", "strategy")
        speed = {}
        for side in order:
            sequences, seconds, _ = timed_generate(model, ids, kwargs if side == "strategy" else plain, args.seed)
            speed[side] = (sequences.shape[1] - prompt_len) / seconds
            if side == "strategy":
                outputs.append(sequences)
            else:
                reference = sequences
        pairs.append(speed)
    _progress("")
    strategy_speed, _, _ = _median_spread([p["strategy"] for p in pairs])
    plain_speed, _, _ = _median_spread([p["plain"] for p in pairs])
    speedup, low, high = _median_spread([p["strategy"] / p["plain"] for p in pairs])
    print(f"[compare] {args.strategy} {strategy_speed:.1f} tokens/s, plain generate {plain_speed:.1f} tokens/s "
          f"(medians of {args.repeats} interleaved runs each, after a warm-up)")
    if args.temperature > 0:
        verdict = "sampled: outputs are not compared (both draw from the target's distribution)"
    else:
        differing = [o for o in outputs if not torch.equal(o, reference)]
        if not differing:
            verdict = "output identical to plain greedy generate"
        else:
            from .bench import first_difference

            same = first_difference(differing[0][0, prompt_len:], reference[0, prompt_len:])
            if args.dtype == "float32":
                verdict = (f"output DIFFERENT from plain greedy generate after {same} identical tokens: a bug in "
                           "float32, please report it")
            else:
                verdict = (f"output differs from plain greedy generate after {same} identical tokens: expected "
                           f"reduced-precision drift in {args.dtype} (multi-token forwards round differently from "
                           "one-token steps; identical in float32, see docs/compatibility.md)")
    print(f"speedup {speedup:.2f}x (median of {args.repeats}; spread {low:.2f}x-{high:.2f}x), {verdict}")
    return 1 if verdict.startswith("output DIFFERENT") else 0


# --------------------------------------------------------------------------------------------------------- bench


def save_results(args, payload: dict, result) -> int:
    """Write --json and --plots (atomically); when a write fails anyway, save the JSON results to a fallback file
    and say where. Returns 0, or 2 after a failed write."""
    from . import bench
    from .files import fallback_file
    from .models import cache_root

    failed = []
    if args.json:
        try:
            bench.write_json(args.json, payload)
            print(f"wrote {args.json}")
        except OSError as err:
            failed.append(f"--json {args.json} ({err.strerror or err})")
    if args.plots:
        try:
            for path in bench.write_plots(args.plots, result):
                print(f"wrote {path}")
        except OSError as err:
            failed.append(f"--plots {args.plots} ({err.strerror or err})")
    if not failed:
        return 0
    fallback = fallback_file("bench.json", [cache_root() / "results", "."])
    bench.write_json(fallback, payload)
    print(f"hf-jetspec: error: could not write {'; '.join(failed)}; the results are saved in {fallback}",
          file=sys.stderr)
    return 2


def cmd_bench(args) -> int:
    from . import bench
    from .models import load_target

    strategies = bench.parse_strategies(",".join(args.strategies), args.budgets, args.temperatures)
    model, tokenizer = load_target(args.model, args.dtype, args.device)
    resources = load_resources(args, model, {s.kind for s in strategies})
    if args.calibration_log:
        resources.calibration_log = []
    exact = args.dtype == "float32"

    def report(prompt_id, name, position):
        tag = "MISMATCH" if exact else "drift (expected in reduced precision)"
        print(f"!!! {tag}: {name} differs from plain greedy on prompt {prompt_id} after {position} identical new "
              "tokens", file=sys.stderr)

    result = bench.benchmark(model, tokenizer, args.prompt_list, strategies, args.max_new_tokens, resources,
                             chat=args.chat, on_mismatch=report)
    print(bench.format_table(result.summary()))
    if args.per_category:
        for category, summary in result.per_category().items():
            print(f"\n[{category}]\n{bench.format_table(summary)}")
    settings = {k: ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, list) else v
                for k, v in vars(args).items() if k not in ("func", "prompt_list")}  # lists as typed: "ar,jetspec"
    payload = bench.results_payload(result, model, settings)
    curve = payload["machine"]["cost_curve"]
    if curve is not None:
        print("\ncost curve (a forward of N new tokens / one of 1) the adaptive trees were sized with: "
              + " ".join(f"{n}:{c:.2f}" for n, c in zip(curve["tokens"], curve["cost"])))
    kappa = getattr(getattr(resources.head, "calibration", None), "node_cost", None)
    if kappa is not None:  # "auto" takes the head's stored cost over the curve: say which priced its trees
        payload["machine"]["head_node_cost"] = kappa
        print(f"\nthe head's calibration prices a tree of N nodes at 1 + {kappa:g} N forwards: its merged trees "
              "were sized with that" + (" (suffix decoding's with the curve above)" if curve is not None else ""))
    status = save_results(args, payload, result)
    if args.calibration_log:
        from .calibration import write_records

        write_records(args.calibration_log, resources.calibration_log)
        print(f"wrote {args.calibration_log} ({len(resources.calibration_log):,} verification records)")
    if result.mismatches and exact:
        print(f"FAILED: {len(result.mismatches)} greedy outputs differ from plain greedy generate", file=sys.stderr)
        return 1
    return status


# ---------------------------------------------------------------------------------------------------- calibrate


def cmd_calibrate(args) -> int:
    from pathlib import Path

    from .calibration import CALIBRATION_FILE, Calibration, fit, measure_node_cost, read_records

    for log in args.logs:
        if not Path(log).is_file():
            raise CLIError(f"calibration log {log}: no such file")
    records = read_records(args.logs)
    if not records and args.node_cost is None:
        raise CLIError(f"no calibration records in {', '.join(map(str, args.logs))} and no --node-cost: nothing to "
                       "fit (record some with `hf-jetspec bench --calibration-log FILE`)")
    existing = Path(args.out) / CALIBRATION_FILE
    base = Calibration.load(existing) if existing.is_file() else None
    node_cost = None
    if args.node_cost == "measure":
        from .models import load_target

        node_cost = measure_node_cost(load_target(args.model, "float32", None)[0])
    elif args.node_cost is not None:
        try:
            node_cost = float(args.node_cost)
        except ValueError:
            raise CLIError(f"--node-cost: a number >= 0 or 'measure', got {args.node_cost!r}") from None
    calibration = fit(records, base=base, node_cost=node_cost)
    path = calibration.save(args.out)
    kinds = {kind: sum(r["kind"] == kind for r in records) for kind in ("head", "retrieval")}
    print(f"wrote {path}: fitted on {calibration.fitted_on} records (logged: {kinds}); node cost "
          f"{calibration.node_cost if calibration.node_cost is not None else 'measured at generation time'}")
    return 0


# ------------------------------------------------------------------------------------------------- convert-gguf


def cmd_convert(args) -> int:
    from .models import convert_gguf

    print(convert_gguf(args.gguf, args.out, force=args.force))
    return 0


def cmd_export_vllm(args) -> int:
    from .export_vllm import cmd_export_vllm as export

    return export(args)


# ---------------------------------------------------------------------------------------------------------- main


def _error(message) -> int:
    from .checkpoints import one_line

    print(f"hf-jetspec: error: {one_line(message)}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    console = argv is None  # the command line, a fresh process: tune MKL before its first matrix product
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if console:
            from .cpu import tune_mkl

            tune_mkl()
        if argv[:1] == ["train"]:  # the trainer has its own argument parser
            from .training.trainer import main as train_main

            return train_main(argv[1:])
        args = build_parser().parse_args(argv)
        check_arguments(args)
        with quiet_libraries(getattr(args, "verbose", False)):
            return args.func(args)
    except SystemExit as done:  # --help, --version, or an argument error (already printed)
        return done.code if isinstance(done.code, int) else 0 if done.code is None else 2
    except (CLIError, ValueError, OSError) as err:
        return _error(err)
    except KeyError as err:
        return _error(err.args[0] if err.args else err)
    except KeyboardInterrupt:
        print("\nhf-jetspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
