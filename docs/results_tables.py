"""Render `hf-jetspec bench --json` files as the Markdown tables of docs/results.md.

    python docs/results_tables.py results/mtbench.json [more.json ...]   # prints Markdown to stdout
"""

from __future__ import annotations

import json
import sys


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def strategy_table(strategies: dict[str, dict], mismatches: list[dict] = ()) -> str:
    """One row per strategy; a greedy strategy that differs shows on how many prompts and, where the JSON records
    it, after how many identical new tokens each first differed."""
    lines = ["| strategy | tau | tokens/s | speedup (median) | speedup (mean) | target fwd/token | loop overhead | "
             "output |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, s in strategies.items():
        where = sorted(m["first_difference"] for m in mismatches if m["strategy"] == name and "first_difference" in m)
        after = f"; after {', '.join(map(str, where))} tokens" if where else ""
        same = {None: "sampled", True: "= greedy"}.get(s["matches_greedy"],
                                                       f"DIFFERS ({s['mismatched_prompts']}{after})")
        overhead = "-" if s["loop_overhead_share"] is None else f"{100 * s['loop_overhead_share']:.1f}%"
        lines.append(f"| {name} | {s['tau']:.2f} | {s['tokens_per_s']:.1f} | {_num(s['speedup'], '.2f')}x | "
                     f"{_num(s['speedup_mean'], '.2f')}x | {s['target_forwards_per_token']:.3f} | "
                     f"{overhead} | {same} |")
    return "\n".join(lines)


def category_table(per_category: dict[str, dict[str, dict]], strategies: list[str]) -> str:
    lines = ["| category | " + " | ".join(f"{s} tau / speedup" for s in strategies) + " |",
             "|---|" + "---:|" * len(strategies)]
    for category, summary in per_category.items():
        cells = [f"{summary[s]['tau']:.2f} / {_num(summary[s]['speedup'], '.2f')}x" if s in summary else "-"
                 for s in strategies]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(payload: dict) -> str:
    m, st = payload["machine"], payload["settings"]
    keys = ("prompts", "limit", "max_new_tokens", "dtype", "draft_layers", "temperatures")
    settings = ", ".join(f"{k}={st[k]}" for k in keys if st.get(k) is not None)
    out = [f"{m['cpu_threads']} CPU threads, {m['dtype']}; torch {m['torch']}, transformers {m['transformers']}; "
           f"{settings}", "", strategy_table(payload["strategies"], payload.get("mismatches", []))]
    names = [n for n in payload["strategies"] if not n.startswith("ar") and "oracle" not in n]
    if len(payload["per_category"]) > 1 and names:
        out += ["", category_table(payload["per_category"], names)]
    return "\n".join(out)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"<!-- {path} -->")
        print(render(json.load(open(path))))
        print()
