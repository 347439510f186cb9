"""Calibrated acceptance estimates for merged draft trees, and the marginal cost of verifying one more node.

A node of a merged tree (`hf_jetspec.tree.merged_tree`) is worth verifying in proportion to the probability that
the target accepts its token given that it accepted its parent's path (its **edge probability**). Two logistic
models estimate it from what the drafters know:

- head-only nodes (the head's top tokens of a depth, not proposed by retrieval): ``sigmoid(a + b * logit(p_head)
  + c * depth / 16)``; the default ``a = 0, b = 1, c = 0`` is the head's own probability;
- retrieval nodes (proposed by the suffix indexes, maybe also by the head): ``sigmoid(w . x)`` over the features
  `retrieval_features` names (head agreement, per source: proposed, count fraction, match length, occurrences;
  depth).

Both are fitted (`fit`) from verification records (``jetspec_generate(..., calibration_log=[])`` or
``hf-jetspec bench --calibration-log FILE``): for every verified node whose parent was accepted, its features and
whether it was accepted. A `Calibration` is saved as ``calibration.json`` beside a head / datastore.

The cost of verifying a tree of N nodes, in single-token target forwards: a `CostCurve` measured on the current
device (`measure_cost_curve`: forwards of 1 to 16, 32, 64, ... tokens, interpolated), or a stored / given number
``kappa`` (``1 + kappa * N``). The merged tree takes the size whose expected tokens per unit of cost is largest
among its best-first prefixes (`verify_cost`, `may_still_pay`). On a CPU or GPU a forward of a few tokens costs
about what one does, so the first nodes are nearly free and a linear ``kappa`` would overprice them.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .files import write_text_atomic

CALIBRATION_FILE = "calibration.json"
SOURCES = ("context", "corpus")
RETRIEVAL_FEATURES = ("bias", "head_logit", "has_head", "depth") + tuple(
    f"{s}_{name}" for s in SOURCES for name in ("proposed", "fraction_logit", "match", "log_count")
)
HEAD_FEATURES = ("bias", "head_logit", "depth")
LOGIT_CLIP = 9.0
DEFAULT_RETRIEVAL_WEIGHTS = {
    "bias": -1.5, "head_logit": 0.25, "has_head": 0.0, "depth": 0.0,
    "context_proposed": 0.5, "context_fraction_logit": 0.5, "context_match": 2.0, "context_log_count": 0.2,
    "corpus_proposed": 0.0, "corpus_fraction_logit": 0.5, "corpus_match": 2.0, "corpus_log_count": 0.2,
}
DEFAULT_HEAD_WEIGHTS = {"bias": 0.0, "head_logit": 1.0, "depth": 0.0}
DEFAULT_NODE_COST = 0.05


def clipped_logit(p: float, eps: float = 1e-4) -> float:
    p = min(max(p, eps), 1.0 - eps)
    return max(-LOGIT_CLIP, min(LOGIT_CLIP, math.log(p / (1.0 - p))))


def head_features(p_head: float, depth: int) -> list[float]:
    return [1.0, clipped_logit(p_head), depth / 16.0]


def retrieval_features(p_head: float | None, depth: int, sources: dict[str, tuple[float, int, int]]) -> list[float]:
    """Features of a retrieval node: ``p_head`` (the head's probability of this token at this depth, None without a
    head) and, per source that proposed it, ``(count fraction after the parent, match length, count)``."""
    x = [1.0, 0.0 if p_head is None else clipped_logit(p_head), 0.0 if p_head is None else 1.0, depth / 16.0]
    for source in SOURCES:
        if source in sources:
            fraction, match, count = sources[source]
            x += [1.0, clipped_logit(fraction, 0.01), min(match, 16) / 16.0, math.log1p(count)]
        else:
            x += [0.0, 0.0, 0.0, 0.0]
    return x


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -60 else 0.0


@dataclass
class Calibration:
    """Weights of the two edge models (by feature name) and the node cost ``kappa``; ``fitted_on``: how many
    records each model was fitted on (0: defaults)."""

    retrieval: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_RETRIEVAL_WEIGHTS))
    head: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_HEAD_WEIGHTS))
    node_cost: float | None = None
    fitted_on: dict[str, int] = field(default_factory=lambda: {"retrieval": 0, "head": 0})

    def __post_init__(self) -> None:
        for name, weights, expected in (("retrieval", self.retrieval, RETRIEVAL_FEATURES),
                                        ("head", self.head, HEAD_FEATURES)):
            if set(weights) != set(expected):
                raise ValueError(f"calibration {name!r} weights must name {list(expected)}, got {sorted(weights)}")
        if self.node_cost is not None and not self.node_cost >= 0:
            raise ValueError(f"node_cost must be >= 0, got {self.node_cost}")
        self._w_retrieval = [float(self.retrieval[n]) for n in RETRIEVAL_FEATURES]
        self._w_head = [float(self.head[n]) for n in HEAD_FEATURES]

    def head_edge(self, p_head: float, depth: int) -> float:
        return _sigmoid(self.edge_logit("head", head_features(p_head, depth)))

    def retrieval_edge(self, features: list[float]) -> float:
        return _sigmoid(self.edge_logit("retrieval", features))

    def edge_logit(self, kind: str, features: list[float]) -> float:
        """The logit of a ``kind`` ("head" / "retrieval") node's edge probability from its features."""
        return sum(w * x for w, x in zip(self._w_head if kind == "head" else self._w_retrieval, features))

    # ------------------------------------------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def save(self, directory: str | Path) -> Path:
        return write_text_atomic(Path(directory) / CALIBRATION_FILE, json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """From ``calibration.json`` or a folder holding it; a clear ``ValueError`` when it is not one."""
        path = Path(path)
        path = path / CALIBRATION_FILE if path.is_dir() else path
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except FileNotFoundError:
            raise
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: not a valid hf_jetspec calibration ({err})") from None


class OnlineCalibration:
    """A `Calibration` whose intercepts (of the edge models named in ``kinds``) follow one decoding call's own
    verification outcomes.

    A calibration is fitted offline on some text (the shipped one on prompts of its head's training sources); on
    other text its estimates can be far off (retrieval matches in a short prompt that the target never follows; a
    head on code it was not trained on), and an overconfident tree then verifies nodes that do not pay. After each
    verified merged tree (`observe`), every node whose parent was accepted is an outcome of its edge estimate; per
    kind ("head", "retrieval") the intercept shift ``delta`` maximises the likelihood of the latest ``window``
    outcomes under ``sigmoid(logit + delta)`` with a Gaussian prior of precision ``prior`` on ``delta`` (a few
    Newton steps), so with few outcomes the estimates stay the fitted ones. Draws nothing at random and times
    nothing: the trees stay a function of the tokens, and only their size and order change (never the output, which
    verification decides). Used by `merged_tree` as its ``calibration`` (`head_edge` / `retrieval_edge`).
    """

    def __init__(self, base: Calibration, kinds=("head", "retrieval"), window: int = 256, prior: float = 4.0,
                 max_shift: float = 6.0) -> None:
        if window < 1 or not prior > 0 or not max_shift >= 0 or not set(kinds) <= {"head", "retrieval"}:
            raise ValueError(f"OnlineCalibration needs kinds among 'head', 'retrieval', window >= 1, prior > 0, "
                             f"max_shift >= 0; got {tuple(kinds)}, {window}, {prior}, {max_shift}")
        self.base, self.prior, self.max_shift, self.window = base, float(prior), float(max_shift), window
        self.shift = {"head": 0.0, "retrieval": 0.0}
        # per adapted kind, a ring of the latest outcomes: [window, 2] (fitted logit, accepted), and how many came
        self.outcomes: dict[str, torch.Tensor] = {kind: torch.zeros(window, 2, dtype=torch.float64) for kind in kinds}
        self.seen = dict.fromkeys(kinds, 0)

    def head_edge(self, p_head: float, depth: int) -> float:
        return _sigmoid(self.base.edge_logit("head", head_features(p_head, depth)) + self.shift["head"])

    def retrieval_edge(self, features: list[float]) -> float:
        return _sigmoid(self.base.edge_logit("retrieval", features) + self.shift["retrieval"])

    def observe(self, outcomes) -> None:
        """Add ``(kind, features, accepted)`` outcomes (`reached_nodes`) and refit the shifts of the kinds seen (of
        the ``kinds`` adapted; the others keep the fitted estimates)."""
        new: dict[str, list] = {kind: [] for kind in self.outcomes}
        for kind, features, accepted in outcomes:
            if kind in new:
                z = max(-4 * LOGIT_CLIP, min(4 * LOGIT_CLIP, self.base.edge_logit(kind, features)))
                new[kind].append((z, 1.0 if accepted else 0.0))
        for kind, rows in new.items():
            if not rows:
                continue
            rows = rows[-self.window:]
            slots = torch.arange(self.seen[kind], self.seen[kind] + len(rows)) % self.window
            self.outcomes[kind][slots] = torch.tensor(rows, dtype=torch.float64)
            self.seen[kind] += len(rows)
            self.shift[kind] = self._fit(self.outcomes[kind][: min(self.seen[kind], self.window)], self.shift[kind])

    def _fit(self, outcomes: torch.Tensor, delta: float, steps: int = 4) -> float:
        """Newton steps on ``sum BCE(sigmoid(z + delta), y) + prior delta^2 / 2`` over ``outcomes [n, 2]`` (z, y)
        from ``delta`` (convex)."""
        z, y = outcomes[:, 0], outcomes[:, 1]
        for _ in range(steps):
            p = torch.sigmoid(z + delta)
            grad = float((p - y).sum()) + self.prior * delta
            hess = float((p * (1.0 - p)).sum()) + self.prior
            step = max(-self.max_shift, min(self.max_shift, delta - grad / hess)) - delta
            delta += step
            if abs(step) < 1e-3:  # from the last tree's shift one or two steps usually suffice
                break
        return delta


# ---------------------------------------------------------------------------------------------------- fitting


def _fit_logistic(x: torch.Tensor, y: torch.Tensor, start: list[float], l2: float = 1e-3) -> list[float]:
    """Logistic regression by L-BFGS (BCE + ``l2`` * |w - start|^2: with few records the fit stays near the
    defaults)."""
    w0 = torch.tensor(start, dtype=torch.float64)
    w = w0.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([w], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y) + l2 * ((w - w0) ** 2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach().tolist()


def fit(records: list[dict], base: Calibration | None = None, node_cost: float | None = None) -> Calibration:
    """A `Calibration` fitted on verification ``records`` (``{"kind": "head" | "retrieval", "x": [...],
    "accepted": bool}``); a model with no records keeps ``base``'s (default) weights."""
    base = base or Calibration()
    weights = {"head": dict(base.head), "retrieval": dict(base.retrieval)}
    fitted = dict(base.fitted_on)
    for kind, names in (("head", HEAD_FEATURES), ("retrieval", RETRIEVAL_FEATURES)):
        rows = [r for r in records if r["kind"] == kind]
        if len(rows) < 20 or len({bool(r["accepted"]) for r in rows}) < 2:
            continue
        x = torch.tensor([r["x"] for r in rows], dtype=torch.float64)
        y = torch.tensor([float(r["accepted"]) for r in rows], dtype=torch.float64)
        fitted_w = _fit_logistic(x, y, [weights[kind][n] for n in names])
        weights[kind] = dict(zip(names, fitted_w))
        fitted[kind] = len(rows)
    return Calibration(retrieval=weights["retrieval"], head=weights["head"],
                       node_cost=node_cost if node_cost is not None else base.node_cost, fitted_on=fitted)


# ---------------------------------------------------------------------------------------------------- node cost

_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class CostCurve:
    """Measured cost of a target forward over ``tokens[i]`` new tokens relative to a one-token forward
    (``cost[i]``; ``tokens[0] == 1``, ``cost[0] == 1``, non-decreasing, at most ``tokens[i]``: one forward never
    costs more than decoding its tokens one by one); linear in between, and beyond the last point with the last
    segment's slope."""

    tokens: tuple[int, ...]
    cost: tuple[float, ...]

    def __post_init__(self):
        if len(self.tokens) != len(self.cost) or not self.tokens or self.tokens[0] != 1 \
                or any(b <= a for a, b in zip(self.tokens, self.tokens[1:])):
            raise ValueError(f"a cost curve needs increasing token counts from 1, got {self.tokens}")
        # a forward over more tokens never takes less time, and noise on a shared machine only adds time: a point
        # above a later one was slowed down, and the later (faster) timing bounds it
        monotone = [min(float(c) for c in self.cost[i:]) for i in range(len(self.cost))]
        # a point above n one-token forwards is noise too (a stalled timing): capped, the curve stays monotone
        object.__setattr__(self, "cost", tuple(min(c / monotone[0], float(n)) for n, c in zip(self.tokens, monotone)))

    def __call__(self, n: int) -> float:
        """The relative cost of verifying ``n`` tokens."""
        t, c = self.tokens, self.cost
        if len(t) == 1:
            return c[0]
        i = min(max(bisect.bisect_left(t, n), 1), len(t) - 1)  # the segment [t[i-1], t[i]] holding n
        slope = (c[i] - c[i - 1]) / (t[i] - t[i - 1])
        return max(c[0], c[i - 1] + slope * (n - t[i - 1]))


def verify_cost(node_cost: "float | CostCurve", nodes: int) -> float:
    """``C(N)``: the cost of verifying a tree of ``nodes`` nodes in one-token forwards, from a `CostCurve` or, for a
    number ``kappa``, ``1 + kappa N``."""
    return node_cost(nodes) if isinstance(node_cost, CostCurve) else 1.0 + node_cost * nodes


@functools.lru_cache(maxsize=64)
def _cheapest_node_prices(curve: CostCurve, budget: int) -> tuple[float, ...]:
    """``s[n]`` for ``n < budget``: the least average cost of a node added to a tree of ``n`` nodes,
    ``min over n < m <= budget of (C(m) - C(n)) / (m - n)`` (a step in the curve followed by flat sizes is cheap
    on average though its first node is dear)."""
    cost = torch.tensor([curve(n) for n in range(budget + 1)], dtype=torch.float64)
    steps = torch.arange(1, budget + 1, dtype=torch.float64)
    return (0.0,) + tuple(float(((cost[n + 1:] - cost[n]) / steps[: budget - n]).min()) for n in range(1, budget))


def may_still_pay(gain: float, best_ratio: float, nodes: int, node_cost: "float | CostCurve", budget: int) -> bool:
    """Whether growing a tree of ``nodes`` nodes with nodes of gain at most ``gain`` (best-first: no later node has
    a larger one) can still beat ``best_ratio``, the best expected tokens per cost ``E(N) / C(N)`` of the sizes so
    far. For every ``m > nodes``: ``E(m) <= E(nodes) + gain (m - nodes)`` and ``E(nodes) <= best_ratio C(nodes)``,
    so no size up to ``budget`` beats it once ``gain <= best_ratio * s``, with ``s`` the cheapest average price
    of the nodes beyond (`_cheapest_node_prices`; ``kappa`` for a number). With a number this is the marginal rule
    ``gain > kappa E / (1 + kappa N)``; a curve with a step may pay several nodes past a node that alone does not."""
    if nodes >= budget:
        return False
    price = _cheapest_node_prices(node_cost, budget)[nodes] if isinstance(node_cost, CostCurve) else node_cost
    return gain > best_ratio * price


def timing_positions(model) -> int | None:
    """How many positions the timing forwards may use: the model's position table (``max_position_embeddings`` /
    ``n_positions``: GPT-2's absolute embeddings end there) and the first RoPE switch (dynamic NTK keeps state
    past it); None = no limit."""
    from .config import target_value
    from .rope import rope_switch

    config = getattr(model, "config", None)
    limits = [target_value(config.get_text_config(), "max_position_embeddings", "n_positions") if config else None]
    limits.append(switch.position if (switch := rope_switch(model)) is not None else None)
    limits = [int(v) for v in limits if isinstance(v, int) and v > 0]
    return min(limits) if limits else None


def _timer(model, prefix: int):
    """A function timing a forward of ``count`` new tokens after a cached ``prefix`` (the cache is cut back to the
    prefix after each timing, so the prefill runs once)."""
    from transformers import DynamicCache

    from .attention import sliding_window
    from .cache import cache_kwarg, full_layers, keep_positions
    from .devices import execution_device

    key = cache_kwarg(model)  # "cache" on transformers >= 5.24 ("past_key_values" warns there)
    device = execution_device(model)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, prefix + 64), generator=torch.Generator().manual_seed(0)).to(device)
    cache = full_layers(DynamicCache(config=model.config), sliding_window(model)[0])
    # position ids are explicit, so the model never consults state kept from an earlier call (Qwen2-VL's
    # rope_deltas, sized for that call's batch)
    model(input_ids=ids[:, :prefix], position_ids=torch.arange(prefix, device=device)[None], use_cache=True,
          **{key: cache})

    def forward(count: int) -> float:
        chunk = ids[:, prefix : prefix + count] if count <= 64 else \
            torch.randint(0, vocab, (1, count), generator=torch.Generator().manual_seed(1)).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        positions = torch.arange(prefix, prefix + count, device=device)[None]
        model(input_ids=chunk, position_ids=positions, use_cache=True, **{key: cache})
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        keep_positions(cache, prefix, [])  # back to the prefix
        return elapsed

    return forward


def _fastest(model, sizes, prefix: int, repeats: int) -> tuple:
    """The fastest of ``repeats`` timings of a forward of each of ``sizes`` new tokens, after one warm-up each,
    interleaved (noise on a shared machine only ever adds time, so the minimum is the estimate a disturbed timing
    cannot inflate)."""
    forward = _timer(model, prefix)
    for size in sizes:
        forward(size)
    fastest = [float("inf")] * len(sizes)
    for _ in range(repeats):
        fastest = [min(best, forward(size)) for best, size in zip(fastest, sizes)]
    return tuple(fastest)


@torch.no_grad()
def measure_node_cost(model, nodes: int = 16, prefix: int = 64, repeats: int = 5) -> float:
    """``kappa``: the extra cost of one more verified token relative to a one-token forward, timed on ``model``'s
    device ((t(1 + nodes) - t(1)) / (nodes * t(1)), the fastest of ``repeats`` interleaved timings after a
    warm-up; at most 1: a token never costs more than its own forward): one number to store in a calibration
    (``hf-jetspec calibrate --node-cost measure``)."""
    one, many = _fastest(model, (1, 1 + nodes), prefix, repeats)
    return min(1.0, max(0.0, (many - one) / (nodes * one)))


EVERY_SIZE_UP_TO = 16


@torch.no_grad()
def measure_cost_curve(model, max_tokens: int = 32, prefix: int = 64, repeats: int = 5) -> CostCurve:
    """The `CostCurve` of ``model`` on its device: forwards of every size from 1 to `EVERY_SIZE_UP_TO` tokens, then
    of 32, 64, ... up to the first power of two >= ``max_tokens``, each the fastest of ``repeats`` interleaved
    timings (`_fastest`). Every small size, because matrix-product kernels are uneven there (with MKL on a CPU, 3, 7,
    11 and 15 rows cost more than 4, 8, 12 and 16: a tree filled to 4 nodes is cheaper than one stopped at 3, which
    the curve's decreasing-from-the-right bound then shows). Cached per model (measured again only for a larger
    ``max_tokens``)."""
    cached = _MEASURED.get(model)
    if cached is not None and cached.tokens[-1] >= max_tokens:
        return cached
    room = timing_positions(model)
    if room is not None:  # stay inside the positions the model embeds (and before any RoPE switch)
        prefix = max(1, min(prefix, room // 2))
    top = 1
    while top < max(1, max_tokens):
        top *= 2
    sizes = list(range(1, min(top, EVERY_SIZE_UP_TO) + 1))
    while sizes[-1] < top:
        sizes.append(sizes[-1] * 2)
    if room is not None:
        sizes = sorted({min(n, max(1, room - prefix)) for n in sizes})
    curve = CostCurve(tuple(sizes), _fastest(model, sizes, prefix, repeats))
    _MEASURED[model] = curve
    return curve


def measured_cost_curve(model) -> "CostCurve | None":
    """The `CostCurve` `measure_cost_curve` measured on ``model`` in this process (what adaptive trees used), or
    None if none was measured."""
    return _MEASURED.get(model)


def resolve_node_cost(node_cost, calibration: Calibration, model, budget: int = 32) -> "float | CostCurve | None":
    """The cost model of a decoding call: ``"auto"`` = the calibration's stored ``kappa``, else the `CostCurve`
    measured on ``model`` up to ``budget`` tokens; a number (``kappa``) or a `CostCurve`; None (or 0) = no
    adaptive stop."""
    if node_cost == "auto":
        return calibration.node_cost if calibration.node_cost is not None else measure_cost_curve(model, budget)
    if isinstance(node_cost, CostCurve):
        return node_cost
    if node_cost is None or node_cost == 0:
        return None
    if not isinstance(node_cost, (int, float)) or node_cost < 0:
        raise ValueError(f"node_cost must be 'auto', None, a CostCurve or a number >= 0, got {node_cost!r}")
    return float(node_cost)


def read_records(paths) -> list[dict]:
    """Calibration records from JSONL files (``hf-jetspec bench --calibration-log FILE``)."""
    records = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text (a JSONL file of calibration records is expected)") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not a calibration record (not JSON)") from None
            if problem := record_problem(row):
                raise ValueError(f"{path}:{number}: not a calibration record ({problem})")
            records.append(row)
    return records


def record_problem(row) -> str | None:
    """What keeps ``row`` from being a verification record ``{"kind", "x", "accepted"}``, or None."""
    if not isinstance(row, dict) or row.get("kind") not in ("head", "retrieval"):
        return "an object with kind 'head' or 'retrieval' is expected"
    width = len(HEAD_FEATURES if row["kind"] == "head" else RETRIEVAL_FEATURES)
    x = row.get("x")
    if not isinstance(x, list) or len(x) != width:
        return f"x must list the {width} {row['kind']} features"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x):
        return "x must hold finite numbers"
    if not isinstance(row.get("accepted"), bool):
        return "accepted must be true or false"
    return None


def write_records(path, records: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
