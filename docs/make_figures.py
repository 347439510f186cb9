"""Draw docs/figures/draft_tree.png: a small draft tree from a head's per-depth distributions and the tree
attention mask the target verifies it with. Run: python docs/make_figures.py"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from hf_jetspec import best_first_tree

WORDS = ["The", "sky", "is", "looks", "blue", "bright", "clear", "because", ","]


def draw(out: Path) -> None:
    # Per-depth draft distributions over a toy vocabulary (depth 1 .. 3).
    logits = torch.full((3, len(WORDS)), -8.0)
    logits[0, [2, 3]] = torch.tensor([2.0, 0.6])      # is | looks
    logits[1, [4, 5, 6]] = torch.tensor([2.2, 0.4, 0.2])  # blue | bright | clear
    logits[2, [7, 8]] = torch.tensor([1.2, 1.0])      # because | ,
    tree = best_first_tree(anchor=1, logits=logits, budget=8, width=3)
    tokens, parents, depths = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
    prefix = 3
    fig, (ax_tree, ax_mask) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [1.1, 1]})

    # Tree: x = depth, y spread per depth.
    rows: dict[int, int] = {}
    pos = {}
    for node, depth in enumerate(depths):
        pos[node] = (depth, -rows.get(depth, 0))
        rows[depth] = rows.get(depth, 0) + 1
    for node, parent in enumerate(parents):
        if parent >= 0:
            (x0, y0), (x1, y1) = pos[parent], pos[node]
            ax_tree.plot([x0, x1], [y0, y1], color="#888", zorder=1)
    for node, (x, y) in pos.items():
        color = "#ffd27f" if node == 0 else "#9fd3ff"
        ax_tree.scatter([x], [y], s=1500, color=color, edgecolor="black", zorder=2)
        ax_tree.text(x, y, f"{WORDS[tokens[node]]}\n#{node}", ha="center", va="center", fontsize=9, zorder=3)
    ax_tree.set_xticks(range(max(depths) + 1), ["anchor\n(depth 0)"] + [f"depth {d}" for d in range(1, max(depths) + 1)])
    ax_tree.set_yticks([])
    ax_tree.set_xlim(-0.6, max(depths) + 0.6)
    ax_tree.set_ylim(-max(rows.values()) + 0.4, 0.7)
    ax_tree.set_title(f"best-first draft tree, budget {len(tree)} nodes")
    for spine in ax_tree.spines.values():
        spine.set_visible(False)

    # Mask: rows = tree nodes (queries), columns = [KV prefix ; tree nodes].
    mask = tree.attention_mask(prefix, torch.float32)[0, 0] == 0
    ax_mask.imshow(mask.float(), cmap="Blues", vmin=0, vmax=1.3)
    labels = [f"p{i}" for i in range(prefix)] + [f"#{i}" for i in range(len(tree))]
    ax_mask.set_xticks(range(len(labels)), labels, fontsize=8)
    ax_mask.set_yticks(range(len(tree)), [f"#{i} {WORDS[t]}" for i, t in enumerate(tokens)], fontsize=8)
    ax_mask.axvline(prefix - 0.5, color="black", linewidth=1)
    ax_mask.set_title("tree attention mask (blue = visible)\nprefix | ancestors-or-self; position = prefix + depth")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    draw(Path(__file__).parent / "figures" / "draft_tree.png")
