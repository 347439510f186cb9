"""hf-jetspec: generate (streaming), bench (side by side), calibrate, train, convert-gguf, export-vllm.

Arguments, prompt files and output paths are checked before torch and transformers are imported (that takes
seconds), so a mistake is one line at once; every user error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import contextmanager

from .cli_parser import WARMUP_TOKENS, CLIError, build_parser, check_arguments
from .strategies import STRATEGIES


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


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
    from .config import token_ids

    return set(token_ids(model.generation_config.eos_token_id))


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
        return report_comparison(args, model, ids, sequences, kwargs, plain, tau)
    return 0


def report_comparison(args, model, ids, streamed, kwargs: dict, plain: dict, tau: float | None = None) -> int:
    """--compare: ``args.repeats`` interleaved runs of the strategy and of plain generate (alternating which goes
    first); prints median tokens/s, the median per-pair speedup with its spread, and whether the outputs match;
    below 1x, a note on why (``tau``: the streamed run's tokens per target forward). Returns 1 when a float32 greedy
    output differs from plain greedy's (a bug), else 0."""
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
    if speedup < 1.0:
        _note(slower_note(tau))
    return 1 if verdict.startswith("output DIFFERENT") else 0


def slower_note(tau: float | None) -> str:
    """Why a --compare came out below plain generate()."""
    accepted = f" (tau {tau:.2f} tokens per target forward)" if tau is not None else ""
    return (f"below 1x here: a step's drafting and verification cost more than the tokens it accepted{accepted} "
            "save. Drafting pays on longer, more predictable answers (code, math, repeated text) and where a forward "
            "over a few tokens costs about what one token's does (a GPU; a CPU with AVX-512; not a CPU busy with "
            "other work): `hf-jetspec bench` compares strategies on MT-Bench; docs/results.md section 9 measures a "
            "CPU where short chat answers run below 1x.")


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


def command(name: str):
    """The function running subcommand ``name`` (looked up at each call)."""
    return {"generate": cmd_generate, "bench": cmd_bench, "calibrate": cmd_calibrate, "convert-gguf": cmd_convert,
            "export-vllm": cmd_export_vllm}[name]


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
            return command(args.command)(args)
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
