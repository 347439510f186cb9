"""Plot a training run's loss and held-out tau from Trainer checkpoints' ``trainer_state.json`` files or the
``log_history.json`` a finished run writes (decoding ``eval_tau`` and teacher-forced ``eval_chain_tau``).

    python docs/plot_training.py runs/head/checkpoint-N/trainer_state.json [runs/next/...json@N ...] \
        docs/figures/training.png [STEP:LABEL ...]

A state file given as ``PATH@N`` is a later run started from step N of the previous one (its steps are shifted by
N). Each optional ``STEP:LABEL`` draws a dashed line where the recipe changed (e.g. ``3500:"depth decay 4"``).

Several runs trained with ``--eval-train-count``, side by side: chain tau of their trained rows (solid) and of the
held-out rows (dashed), one colour per run, and next to it their memorisation (``eval_memorisation``, logged with
``--eval-reference``; for a run logged without it, give the reference head's held-out and trained chain tau on the
same rows as ``LABEL=PATH@HELD,TRAINED``):

    python docs/plot_training.py --gap base=runs/base/log_history.json noise=runs/noise/log_history.json@1.64,1.95 \
        docs/figures/memorisation.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(state_paths: list[str], out_path: str, marks: list[tuple[int, str]] = (),
         title: str = "JetSpec head for SmolLM2-135M-Instruct (CPU, 2 cores)") -> None:
    loss, tau, chain = [], [], []
    for spec in state_paths:
        path, _, offset = spec.partition("@")
        history = json.load(open(path))
        history = history["log_history"] if isinstance(history, dict) else history
        loss += [(int(offset or 0) + h["step"], h["loss"]) for h in history if "loss" in h]
        tau += [(int(offset or 0) + h["step"], h["eval_tau"]) for h in history if "eval_tau" in h]
        chain += [(int(offset or 0) + h["step"], h["eval_chain_tau"]) for h in history if "eval_chain_tau" in h]
    # A run with early stopping evaluates its best checkpoint once more at the last step: keep the first per step.
    tau, chain = list(dict(reversed(tau)).items())[::-1], list(dict(reversed(chain)).items())[::-1]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*zip(*loss), color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("forward KL (train)", color="tab:blue")
    if tau or chain:
        right = ax.twinx()
        if tau:
            right.plot(*zip(*tau), "o-", color="tab:red", label="decoding tau")
        if chain:
            right.plot(*zip(*chain), "s--", color="tab:green", label="chain tau (teacher forced)")
        right.set_ylabel("held-out tau", color="tab:red")
        right.legend(loc="center right", fontsize=8)
    for step, label in marks:
        ax.axvline(step, color="gray", linestyle="--", linewidth=1)
        ax.annotate(label, (step, 0), xycoords=("data", "axes fraction"), xytext=(3, 6),
                    textcoords="offset points", fontsize=8, color="gray")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


def plot_gap(runs: dict[str, str], out_path: str,
             title: str = "Trained vs held-out chain tau (teacher forced)") -> None:
    from hf_jetspec.training.trainer import memorisation

    fig, (ax, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (label, spec) in enumerate(runs.items()):
        path, _, given = spec.partition("@")
        history = json.load(open(path))
        history = history["log_history"] if isinstance(history, dict) else history
        points = {h["step"]: h for h in reversed(history) if "eval_train_chain_tau" in h}  # first per step
        steps = sorted(points)
        color = f"C{i}"
        ax.plot(steps, [points[s]["eval_train_chain_tau"] for s in steps], "o-", color=color, label=f"{label} trained")
        ax.plot(steps, [points[s]["eval_chain_tau"] for s in steps], "s--", color=color, label=f"{label} held-out")
        reference = tuple(map(float, given.split(","))) if given else None
        excess = [points[s].get("eval_memorisation") if reference is None else
                  memorisation(points[s]["eval_chain_tau"], points[s]["eval_train_chain_tau"], *reference)
                  for s in steps]
        if all(e is not None for e in excess):
            right.plot(steps, excess, "o-", color=color, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("chain tau")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title)
    right.axhline(0, color="grey", lw=0.8)
    right.set_xlabel("step")
    right.set_ylabel("trained chain tau above composition")
    right.set_title("Memorisation (against a reference head)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--gap":
        plot_gap(dict(a.split("=", 1) for a in args[1:-1]), args[-1])
        sys.exit(0)
    states = [a for a in args if a.partition("@")[0].endswith(".json")]
    out = next(a for a in args if a.endswith(".png"))
    marks = [(int(step), label) for step, _, label in (m.partition(":") for m in args if ":" in m and m not in states)]
    plot(states, out, marks)
