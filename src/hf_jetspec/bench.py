"""Side-by-side decoding benchmark: every strategy on the same prompts, interleaved, in one process.

Per prompt, plain greedy ``generate()`` runs first (it is both the baseline and the reference output), then every
other strategy. Target forwards are counted with a forward pre-hook on the target, so "tokens per target forward"
(tau) means the same thing for every strategy. A greedy strategy whose output differs from plain greedy's is a
mismatch; in float32 that is a bug and makes the command fail.

Sampling (``temperatures`` above 0): every strategy, the plain ``generate()`` baseline included, samples with that
temperature (seeded per prompt); outputs are not compared (``matches_greedy`` is None) and the strategies of each
temperature carry a ``/T<temperature>`` suffix (``ar/T0.7``, ``jetspec@32/T0.7``), each compared with its own
temperature's baseline.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from .calibration import measured_cost_curve
from .devices import execution_device
from .files import write_atomic, write_text_atomic
from .prompts import Prompt, encode_prompt
from .strategies import STRATEGIES, Resources, get_strategy

STRATEGY_KINDS = tuple(STRATEGIES)
HEAD_KINDS = tuple(name for name, spec in STRATEGIES.items() if "head" in spec.needs)  # draft with a JetSpec head


@dataclass(frozen=True)
class Strategy:
    """``kind``: a name in the strategy registry; ``budget``: tree budget of budgeted kinds; ``temperature``: 0 =
    greedy."""

    kind: str
    budget: int | None = None
    temperature: float = 0.0

    @property
    def name(self) -> str:
        name = f"{self.kind}@{self.budget}" if self.budget is not None else self.kind
        return f"{name}/T{self.temperature:g}" if self.temperature > 0 else name

    @property
    def baseline(self) -> str:
        """Name of the plain ``generate()`` run this strategy is compared with (same temperature)."""
        return Strategy("ar", temperature=self.temperature).name


def parse_strategies(text: str, budgets: list[int], temperatures: list[float] = (0.0,)) -> list[Strategy]:
    """``"ar,jetspec,prompt-lookup"`` -> strategies; JetSpec kinds expand over ``budgets``, everything over
    ``temperatures``. Each temperature's ``ar`` comes first in its group."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    specs = [get_strategy(k) for k in kinds]
    if any(t < 0 for t in temperatures):
        raise ValueError(f"Temperatures must be >= 0 (0 = greedy), got {list(temperatures)}")
    out = []
    for temperature in dict.fromkeys(float(t) for t in temperatures):
        out.append(Strategy("ar", temperature=temperature))
        for spec in specs:
            if spec.name == "ar":
                continue
            if spec.budgeted:
                out += [Strategy(spec.name, b, temperature) for b in budgets]
            else:
                out.append(Strategy(spec.name, temperature=temperature))
    return out


@dataclass
class Run:
    prompt_id: str
    category: str
    strategy: str
    new_tokens: int
    seconds: float
    target_forwards: int
    matches_greedy: bool | None = None  # None when sampling: outputs are not compared
    overhead_share: float | None = None
    baseline: str = "ar"

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tau(self) -> float:
        return self.new_tokens / max(1, self.target_forwards)


@contextmanager
def count_forwards(model):
    """Count calls of ``model.forward`` (each is one target forward pass)."""
    counter = [0]
    handle = model.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    try:
        yield counter
    finally:
        handle.remove()


def run_strategy(model, input_ids: torch.Tensor, strategy: Strategy, max_new_tokens: int, resources: Resources,
                 reference: torch.Tensor | None = None, seed: int = 0) -> tuple[torch.Tensor, float, int, float | None]:
    """Generate with ``strategy`` (greedily, or sampling at its temperature after ``torch.manual_seed(seed)``);
    return (sequence [1, T], seconds, target forwards, overhead share)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    spec = get_strategy(strategy.kind)
    kwargs = spec.generate_kwargs(resources, strategy.budget, reference, vocab)
    if resources.calibration_log is not None and spec.function is not None and \
            "calibration_log" in inspect.signature(spec.function).parameters:
        kwargs["calibration_log"] = resources.calibration_log
    if strategy.temperature > 0:
        kwargs |= {"do_sample": True, "temperature": strategy.temperature}
        torch.manual_seed(seed)
    else:
        kwargs["do_sample"] = False
    with count_forwards(model) as forwards:
        start = time.perf_counter()
        out = model.generate(input_ids, max_new_tokens=max_new_tokens, **kwargs)
        seconds = time.perf_counter() - start
    stats = getattr(out, "stats", None)
    sequences = out.sequences if hasattr(out, "sequences") else out
    return sequences, seconds, forwards[0], None if stats is None else stats.overhead_share


@dataclass
class BenchResult:
    runs: list[Run] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    mismatches: list[tuple[str, str, int]] = field(default_factory=list)  # (prompt, strategy, first_difference)

    def summary(self, runs: list[Run] | None = None) -> dict[str, dict]:
        """Per strategy: tau, tokens_per_s, speedup (median and mean of per-prompt ratios vs plain generate at the
        same temperature), target_forwards_per_token, matches_greedy (None when sampling), prompts."""
        runs = self.runs if runs is None else runs
        by_prompt = {(r.prompt_id, r.strategy): r for r in runs}
        out = {}
        for name in self.strategies:
            mine = [r for r in runs if r.strategy == name]
            if not mine:
                continue
            bases = [by_prompt.get((r.prompt_id, r.baseline)) for r in mine]
            ratios = [r.tokens_per_s / b.tokens_per_s for r, b in zip(mine, bases)
                      if b is not None and b.tokens_per_s > 0]
            sampled = all(r.matches_greedy is None for r in mine)
            tokens, seconds = sum(r.new_tokens for r in mine), sum(r.seconds for r in mine)
            forwards = sum(r.target_forwards for r in mine)
            overheads = [r.overhead_share for r in mine if r.overhead_share is not None]
            out[name] = {
                "prompts": len(mine),
                "tau": tokens / max(1, forwards),
                "tokens_per_s": tokens / seconds if seconds else 0.0,
                "speedup": statistics.median(ratios) if ratios else None,
                "speedup_mean": statistics.fmean(ratios) if ratios else None,
                "target_forwards_per_token": forwards / max(1, tokens),
                "matches_greedy": None if sampled else all(r.matches_greedy is not False for r in mine),
                "mismatched_prompts": sum(r.matches_greedy is False for r in mine),
                "loop_overhead_share": statistics.fmean(overheads) if overheads else None,
            }
        return out

    def per_category(self) -> dict[str, dict[str, dict]]:
        categories = sorted({r.category for r in self.runs})
        return {c: self.summary([r for r in self.runs if r.category == c]) for c in categories}


def first_difference(tokens: torch.Tensor, reference: torch.Tensor) -> int:
    """How many leading new tokens ``tokens [n]`` and ``reference [m]`` share: the index of the first difference
    (the shorter length when one is a prefix of the other)."""
    n = min(len(tokens), len(reference))
    differ = (tokens[:n] != reference[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


def encode_checked(tokenizer, prompt: Prompt, chat: bool) -> torch.Tensor:
    """`encode_prompt`, with the prompt's id in the error of a prompt that leaves no token."""
    try:
        return encode_prompt(tokenizer, prompt.text, chat)
    except ValueError as err:
        raise ValueError(f"prompt {prompt.id}: {err}") from None


def benchmark(model, tokenizer, prompts: list[Prompt], strategies: list[Strategy], max_new_tokens: int,
              resources: Resources, chat: bool = True, warmup: bool = True,
              on_mismatch: Callable[[str, str, int], None] | None = None) -> BenchResult:
    """Run every strategy on every prompt, interleaved, after one warm-up round. Per prompt and temperature plain
    ``generate()`` runs first: the baseline, and (greedy) the reference every other output must equal. A greedy
    output that differs is recorded (and passed to ``on_mismatch``) with its `first_difference`."""
    result = BenchResult(strategies=[s.name for s in strategies])
    encoded = [encode_checked(tokenizer, p, chat).to(model.device) for p in prompts]  # all, before any forward
    if warmup and encoded:
        reference = None
        for strategy in strategies:
            out, *_ = run_strategy(model, encoded[0], strategy, min(16, max_new_tokens), resources, reference)
            reference = out if strategy.kind == "ar" else reference
    bar = tqdm(total=len(prompts) * len(strategies), desc="benchmark", unit="run")
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        reference = None
        for strategy in strategies:
            out, seconds, forwards, overhead = run_strategy(model, ids, strategy, max_new_tokens, resources, reference,
                                                            seed=index)
            if strategy.kind == "ar":
                reference = out
            same = None if strategy.temperature > 0 else torch.equal(out, reference)
            result.runs.append(Run(prompt.id, prompt.category, strategy.name, out.shape[1] - ids.shape[1], seconds,
                                   forwards, same, overhead, strategy.baseline))
            if same is False:
                position = first_difference(out[0, ids.shape[1]:], reference[0, ids.shape[1]:])
                result.mismatches.append((prompt.id, strategy.name, position))
                if on_mismatch is not None:
                    on_mismatch(prompt.id, strategy.name, position)
            bar.update()
    bar.close()
    return result


def machine_info(model) -> dict:
    import transformers

    from . import __version__

    device = execution_device(model)
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "mkl_cbwr": os.environ.get("MKL_CBWR") or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_jetspec": __version__,
        "device": str(device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    curve = measured_cost_curve(model)  # what the adaptive tree sizes were priced with (None: never measured)
    info["cost_curve"] = None if curve is None else {"tokens": list(curve.tokens),
                                                      "cost": [round(c, 4) for c in curve.cost]}
    return info


def results_payload(result: BenchResult, model, settings: dict) -> dict:
    """Everything `write_json` writes: machine, settings, summaries, mismatches and every run."""
    return {
        "machine": machine_info(model),
        "settings": settings,
        "strategies": result.summary(),
        "per_category": result.per_category(),
        "mismatches": [{"prompt": p, "strategy": s, "first_difference": d} for p, s, d in result.mismatches],
        "runs": [asdict(r) | {"tau": r.tau, "tokens_per_s": r.tokens_per_s} for r in result.runs],
    }


def write_json(path: str | Path, result: BenchResult | dict, model=None, settings: dict | None = None) -> dict:
    """Write `results_payload` (or an already built payload) to ``path`` atomically (a temporary sibling renamed
    into place: never half a file)."""
    payload = result if isinstance(result, dict) else results_payload(result, model, settings or {})
    write_text_atomic(path, json.dumps(payload, indent=2))
    return payload


def format_table(summary: dict[str, dict]) -> str:
    header = f"{'strategy':<22}{'tau':>7}{'tok/s':>9}{'speedup':>9}{'mean':>7}{'fwd/tok':>9}{'overhead':>10}  greedy"
    lines = [header, "-" * len(header)]
    for name, s in summary.items():
        speed = "-" if s["speedup"] is None else f"{s['speedup']:.2f}x"
        mean = "-" if s["speedup_mean"] is None else f"{s['speedup_mean']:.2f}"
        overhead = "-" if s["loop_overhead_share"] is None else f"{100 * s['loop_overhead_share']:.1f}%"
        same = {None: "sampled", True: "same"}.get(s["matches_greedy"], f"DIFFERS ({s['mismatched_prompts']})")
        lines.append(f"{name:<22}{s['tau']:>7.2f}{s['tokens_per_s']:>9.2f}{speed:>9}{mean:>7}"
                     f"{s['target_forwards_per_token']:>9.3f}{overhead:>10}  {same}")
    return "\n".join(lines)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    finally:
        plt.close(fig)


def write_plots(directory: str | Path, result: BenchResult) -> list[Path]:
    """PNG plots: speedup and tau per category per strategy, and tau vs budget for JetSpec kinds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    per_cat = result.per_category()
    categories = list(per_cat)
    names = [n for n in result.strategies if n.split("/")[0] != "ar"]
    paths = []
    for metric, label in (("speedup", "speedup over plain greedy (median)"), ("tau", "tokens per target forward")):
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories) * max(1, len(names)) / 2), 4))
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            values = [per_cat[c].get(name, {}).get(metric) or 0.0 for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=name)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], categories, rotation=30, ha="right")
        ax.set_ylabel(label)
        if metric == "speedup":
            ax.axhline(1.0, color="black", linewidth=0.8)
        if ax.get_legend_handles_labels()[0]:  # not for a benchmark of plain generate only
            ax.legend(fontsize="small")
        fig.tight_layout()
        path = directory / f"{metric}_per_category.png"
        _save(fig, path)
        paths.append(path)
    overall = result.summary()
    fig, ax = plt.subplots(figsize=(6, 4))
    curves = defaultdict(list)  # "kind" or "kind/T0.7" -> [(budget, tau)]
    for name, s in overall.items():
        if "@" in name:
            kind, _, rest = name.partition("@")
            budget, _, temperature = rest.partition("/")
            curves[f"{kind}/{temperature}" if temperature else kind].append((int(budget), s["tau"]))
    for label, points in sorted(curves.items()):
        points.sort()
        ax.plot([b for b, _ in points], [t for _, t in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tree budget (nodes verified per step)")
    ax.set_ylabel("tokens per target forward")
    if curves:
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = directory / "tau_vs_budget.png"
    _save(fig, path)
    paths.append(path)
    return paths
