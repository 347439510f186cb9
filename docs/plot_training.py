"""Plot a training run's loss and held-out tau from a Trainer checkpoint's ``trainer_state.json``.

    python docs/plot_training.py runs/head/checkpoint-N/trainer_state.json docs/figures/training.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(state_path: str, out_path: str) -> None:
    history = json.load(open(state_path))["log_history"]
    loss = [(h["step"], h["loss"]) for h in history if "loss" in h]
    tau = [(h["step"], h["eval_tau"]) for h in history if "eval_tau" in h]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*zip(*loss), color="tab:blue")
    ax.set_xlabel("step")
    ax.set_ylabel("forward KL (train)", color="tab:blue")
    if tau:
        right = ax.twinx()
        right.plot(*zip(*tau), "o-", color="tab:red")
        right.set_ylabel("held-out tau", color="tab:red")
    ax.set_title("JetSpec head for SmolLM2-135M-Instruct (CPU, 2 cores)")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    plot(sys.argv[1], sys.argv[2])
