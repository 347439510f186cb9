"""Target states for training: tapped-layer features and the final hidden state (teacher logits = LM head of it).

Computed online per batch (`target_states`), or once for a whole data set and stored in safetensors shards
(`build_feature_store` / `FeatureStore`) so that several epochs pay for the target forward only once.
Stored: ``features [T, F]`` and ``final [T, H]`` in bfloat16, ``input_ids [T]`` in int32, per sequence.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from hf_jetspec.features import FeatureTap
from hf_jetspec.prompts import is_held_out

from .argcheck import require_at_least


def decoder_of(target):
    """The target's base decoder (returns post-norm ``last_hidden_state``), also through PEFT wrappers."""
    inner = target.get_base_model() if hasattr(target, "get_base_model") else target
    return inner.get_decoder()


@torch.no_grad()
def target_states(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, layer_ids: list[int]):
    """Teacher-forced target pass: ``input_ids [b, T]`` -> (features ``[b, T, F]``, final hidden ``[b, T, H]``)."""
    with FeatureTap(target, layer_ids) as tap:
        out = decoder_of(target)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return tap.features(), out.last_hidden_state


def teacher_transform(target):
    """``logits [..., V] -> logits``: what the target's forward applies to ``lm_head(final hidden state)``, so that
    the teacher built from stored final states is the target's own distribution: final logit soft-capping (Gemma
    2 / 3 / 3n / 4: ``c * tanh(x / c)``), Granite's ``logits_scaling`` (divides), Cohere's ``logit_scale``
    (multiplies); the identity elsewhere. `check_teacher` verifies it on the target itself."""
    config = target.config.get_text_config()
    softcap = getattr(config, "final_logit_softcapping", None)
    divide = getattr(config, "logits_scaling", None)
    multiply = getattr(config, "logit_scale", None)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if multiply is not None:
            logits = logits * multiply
        if divide is not None:
            logits = logits / divide
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    return transform


@torch.no_grad()
def check_teacher(target, transform) -> None:
    """Raise ``ValueError`` unless ``transform(lm_head(final hidden))`` reproduces the target's logits on a short
    sequence: a target with post-processing `teacher_transform` does not know would otherwise train the head towards
    another distribution than the target's."""
    lm_head = target.get_output_embeddings()
    vocab = lm_head.weight.shape[0]
    ids = (torch.arange(8) * 7919 % vocab)[None].to(lm_head.weight.device)
    logits = target(input_ids=ids, use_cache=False).logits.float()
    final = decoder_of(target)(input_ids=ids, use_cache=False).last_hidden_state
    teacher = transform(lm_head(final).float())
    error = (teacher - logits).norm() / logits.norm().clamp(min=1e-6)
    if not bool(error < 1e-2):
        raise ValueError(f"{type(target).__name__}'s logits are not its LM head applied to its last hidden state "
                         f"(relative difference {float(error):.3g}): it post-processes them in a way hf_jetspec's "
                         "trainer does not know, so a head would learn another distribution than the target's.")


def row_problem(row) -> str | None:
    """What keeps ``row`` from being a training row ``{"id", "input_ids": [int], "prompt_len": int}``, or None."""
    if not isinstance(row, dict):
        return f"a row is a JSON object with id, input_ids and prompt_len, got {type(row).__name__}"
    missing = [key for key in ("id", "input_ids", "prompt_len") if key not in row]
    if missing:
        return f"the row lacks {', '.join(missing)}"
    ids, prompt_len = row["input_ids"], row["prompt_len"]
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return "input_ids must be a list of token ids (integers)"
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 0 <= prompt_len <= len(ids):
        return f"prompt_len must be an integer in [0, {len(ids)}] (the row's length), got {prompt_len!r}"
    return None


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file of training rows; a ``ValueError`` naming the file and line of one that is not."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as err:
                    raise ValueError(f"{path}, line {number}: not JSON ({err})") from None
                if problem := row_problem(row):
                    raise ValueError(f"{path}, line {number}: {problem}")
                rows.append(row)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a JSONL file of token rows is expected)") from None
    return rows


def read_rows(path: str | Path) -> list[dict]:
    """Rows ``{"id", "input_ids", "prompt_len", "finish"}`` of a JSONL file, of an answer store (a folder of source
    folders, e.g. ``data/answers``) or of one source folder of it (``data/answers/leetcode``); answers appended
    after a source's evaluation pool was pinned are marked ``"eval_candidate": False`` (see `split_rows`)."""
    from .answers import META, read_answers

    path = Path(path)
    if not path.is_dir():
        return read_jsonl(path)
    if (path / META).exists():
        return list(read_answers(path.parent, [path.name], mark_eval_pool=True))
    return list(read_answers(path, mark_eval_pool=True))


def split_rows(files: list[list[dict]], eval_count: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(training rows, evaluation rows) from the JSONL rows of one or more files (one row list per file): rows of
    the benchmark's held-out conversations dropped, duplicate ids dropped, ``eval_count`` random rows of the FIRST
    file set aside for evaluation. More data added later as further files therefore keeps the evaluation set and
    never moves a row already trained on into it. Rows marked ``"eval_candidate": False`` (answers appended to a
    store after its evaluation pool was pinned, see `answers`) are never drawn: appending to the first file keeps
    the set too."""
    first, *more = files
    pool = [r for r in first if r.get("eval_candidate", True)]
    rows = list({r["id"]: r for r in pool if not is_held_out(str(r["id"]))}.values())
    random.Random(seed).shuffle(rows)
    held, train = rows[:eval_count], rows[eval_count:]
    seen = {r["id"] for r in rows}
    late = [r for r in first if not r.get("eval_candidate", True)]
    extra = {r["id"]: r for part in [late, *more] for r in part
             if r["id"] not in seen and not is_held_out(str(r["id"]))}
    return train + list(extra.values()), held


def training_rows(files: list[list[dict]], eval_count: int, seed: int = 0) -> tuple[list[dict], list[list[int]]]:
    """(training rows, evaluation prompt token lists): `split_rows`, with the evaluation rows cut to their prompts."""
    train, held = split_rows(files, eval_count, seed)
    return train, [r["input_ids"][: r["prompt_len"]] for r in held]


def cap_prompts(rows: list[dict], max_prompt_tokens: int | None) -> list[dict]:
    """Rows with at most the last ``max_prompt_tokens`` prompt tokens (the answers whole): bounds the teacher-forced
    pass over long histories (ShareGPT later turns, LeetCode statements), whose prompt tokens never get a loss but
    cost as much as answer tokens. The head then sees the last part of a long prompt as its context."""
    if not max_prompt_tokens:
        return rows
    out = []
    for r in rows:
        cut = max(0, int(r["prompt_len"]) - max_prompt_tokens)
        out.append(r if cut == 0 else {**r, "input_ids": list(r["input_ids"][cut:]), "prompt_len": r["prompt_len"] - cut})
    return out


def build_feature_store(target, rows: list[dict], layer_ids: list[int], out_dir: str | Path,
                        shard_size: int = 256, batch_tokens: int = 4096) -> Path:
    """Compute and store target states for ``rows`` (``{"id", "input_ids", "prompt_len"}``) in shards of
    ``shard_size`` sequences. Resumable: finished shards are kept. Returns ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps({"layer_ids": layer_ids, "count": len(rows)}))
    shards = [rows[i : i + shard_size] for i in range(0, len(rows), shard_size)]
    for number, shard in enumerate(tqdm(shards, desc="feature shards", unit="shard")):
        path = out / f"shard_{number:05d}.safetensors"
        if path.exists():
            continue
        tensors, index = {}, []
        order = sorted(range(len(shard)), key=lambda i: len(shard[i]["input_ids"]))
        batch: list[int] = []
        for i in order + [None]:
            longest = len(shard[batch[-1]]["input_ids"]) if batch else 0
            if batch and (i is None or (len(batch) + 1) * max(longest, len(shard[i]["input_ids"])) > batch_tokens):
                _store_batch(target, [shard[j] for j in batch], layer_ids, tensors, index)
                batch = []
            if i is not None:
                batch.append(i)
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"index": json.dumps(index)})
        tmp.rename(path)
    return out


def _store_batch(target, rows, layer_ids, tensors: dict, index: list) -> None:
    device = next(target.parameters()).device
    lengths = [len(r["input_ids"]) for r in rows]
    ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : lengths[i]] = torch.tensor(r["input_ids"])
        mask[i, : lengths[i]] = 1
    features, final = target_states(target, ids.to(device), mask.to(device), layer_ids)
    for i, r in enumerate(rows):
        key = f"s{len(index)}"
        n = lengths[i]
        tensors[f"{key}.features"] = features[i, :n].to("cpu", torch.bfloat16).contiguous()
        tensors[f"{key}.final"] = final[i, :n].to("cpu", torch.bfloat16).contiguous()
        tensors[f"{key}.input_ids"] = ids[i, :n].to(torch.int32).contiguous()
        index.append({"key": key, "id": r["id"], "prompt_len": r["prompt_len"], "length": n})


class FeatureStore:
    """Read-only view of one or more stores written by `build_feature_store` (or the data generator's
    ``--states-dir``): ``len()`` sequences, ``store[i]`` a dict with input_ids ``[T]``, features ``[T, F]``, final
    ``[T, H]`` (bfloat16, memory-mapped), prompt_len. Several directories must share their tapped layers. A sequence
    id stored more than once (in two stores, or twice by a data generator restarted mid-batch) is read once, from
    the first directory / shard that holds it; ``duplicates`` counts the copies left out."""

    def __init__(self, *directories: str | Path) -> None:
        if not directories:
            raise ValueError("FeatureStore needs at least one directory")
        self.directories = [Path(d) for d in directories]
        self.layer_ids = None
        self.items: list[tuple[Path, dict]] = []
        self.duplicates = 0
        seen: set[str] = set()
        for directory in self.directories:
            layer_ids = json.loads((directory / "meta.json").read_text())["layer_ids"]
            if self.layer_ids is not None and layer_ids != self.layer_ids:
                raise ValueError(f"feature store {directory} taps layers {layer_ids}, {self.directories[0]} taps "
                                 f"{self.layer_ids}: stores for one head must tap the same layers")
            self.layer_ids = layer_ids
            for path in sorted(directory.glob("shard_*.safetensors")):
                with safe_open(str(path), framework="pt") as f:
                    for entry in json.loads(f.metadata()["index"]):
                        if str(entry["id"]) in seen:
                            self.duplicates += 1
                            continue
                        seen.add(str(entry["id"]))
                        self.items.append((path, entry))
        self._open: dict[Path, object] = {}

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ids(self) -> set[str]:
        """The ids of the stored sequences."""
        return {str(entry["id"]) for _, entry in self.items}

    def __getitem__(self, i: int) -> dict:
        path, entry = self.items[i]
        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt")
        f, key = self._open[path], entry["key"]
        return {
            "input_ids": f.get_tensor(f"{key}.input_ids").long(),
            "features": f.get_tensor(f"{key}.features"),
            "final": f.get_tensor(f"{key}.final"),
            "prompt_len": entry["prompt_len"],
        }


def main(argv=None) -> int:
    """Build the trainer's feature store ahead of training (the rows the trainer will train on: same ``--data``,
    ``--eval-count``, ``--seed``), so several training runs share one teacher-forced pass."""
    import argparse

    from hf_jetspec.models import load_target

    p = argparse.ArgumentParser(prog="python -m hf_jetspec.training.features",
                                description="Teacher-forced target states for the trainer's training rows")
    p.add_argument("--data", required=True, nargs="+", help="the trainer's --data (JSONL files / answer stores)")
    p.add_argument("--out", required=True, help="feature store folder (resumable)")
    p.add_argument("--layers", required=True, type=int, nargs="+", help="tapped target layers, e.g. 1 14 27")
    p.add_argument("--eval-count", type=int, default=8, help="the trainer's --eval-count (rows left out)")
    p.add_argument("--seed", type=int, default=0, help="the trainer's --seed")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="keep the last N prompt tokens of each row")
    p.add_argument("--model", default=None, help="target folder / Hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--target-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--skip-stored", nargs="+", default=[], metavar="STORE",
                   help="leave out rows whose states these feature stores already hold (e.g. recorded by the data "
                        "generator's --states-dir), so the trainer's --features can list them all")
    args = p.parse_args(argv)
    require_at_least(p, args, eval_count=0, max_prompt_tokens=1)
    if min(args.layers) < 0:
        p.error(f"--layers must be target layer indices >= 0, got {args.layers}")
    train, _ = split_rows([read_rows(path) for path in args.data], args.eval_count, args.seed)
    if args.skip_stored:
        stored = FeatureStore(*args.skip_stored).ids
        train = [r for r in train if str(r["id"]) not in stored]
    target, _ = load_target(args.model, args.target_dtype, None)
    build_feature_store(target, cap_prompts(train, args.max_prompt_tokens), args.layers, args.out)
    print(f"{len(train)} sequences in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
