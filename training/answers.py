"""Compact, committed storage of generated answers: per source, immutable safetensors chunks of token ids.

Layout (one folder per prompt source)::

    data/answers/<source>/meta.json                  generation settings (model, dtype, max new tokens, ...) and
                                                     ``eval_pool``: how many leading rows evaluation draws from
    data/answers/<source>/chunk-00000.safetensors    rows, written once, atomically (temp file + rename)
    data/answers/<source>/pending.jsonl              rows not yet in a chunk (not committed; a restart resumes it)

A chunk holds ``tokens`` (the rows' prompts + answers concatenated; uint16 when the vocabulary fits, else int32),
``offsets`` (int64, ``n + 1``: row i is ``tokens[offsets[i]:offsets[i + 1]]``), ``prompt_len`` (int32) and
``finish`` (uint8, index into `FINISH`); its safetensors metadata holds the source name and the row ids (JSON).
About 2 bytes per token plus ~25 per row.

`read_answers` gives rows in the trainer's / feature store's format ``{"id", "input_ids", "prompt_len",
"finish"}``; `token_sequences` gives flat token arrays (a retrieval datastore's corpus).

Appending keeps evaluation splits: the trainer draws its evaluation rows from a seeded shuffle of its first data
source, so new chunks in that source would reshuffle it and could move rows a head was trained on into evaluation.
Before a chunk is added to a source that already holds chunks, its ``eval_pool`` is pinned to the rows it holds
(once); rows past the pool are read with ``"eval_candidate": False`` and `features.split_rows` only trains on them.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

FORMAT = "hf_jetspec.answers/1"
FINISH = ("eos", "length")
CHUNK_PATTERN = re.compile(r"^chunk-(\d{5,})\.safetensors$")
PENDING = "pending.jsonl"
META = "meta.json"
EVAL_POOL = "eval_pool"


class TornChunkError(ValueError):
    """A chunk file that cannot be read back whole (cut off, corrupted, or inconsistent)."""


def token_dtype(rows: Sequence[dict]) -> np.dtype:
    """uint16 when every token id fits (SmolLM2's 49,152 ids do), else int32."""
    top = max((max(r["input_ids"], default=0) for r in rows), default=0)
    return np.dtype(np.uint16) if top < 2**16 else np.dtype(np.int32)


def write_chunk(path: str | Path, rows: Sequence[dict], source: str) -> Path:
    """Write ``rows`` (``{"id", "input_ids", "prompt_len", "finish"}``) as one chunk, atomically: a temporary
    sibling file is renamed into place, so a reader never sees a half-written chunk."""
    path = Path(path)
    if not rows:
        raise ValueError("a chunk needs at least one row")
    lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int64)
    tensors = {
        "tokens": np.concatenate([np.asarray(r["input_ids"], dtype=token_dtype(rows)) for r in rows]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "prompt_len": np.array([r["prompt_len"] for r in rows], dtype=np.int32),
        "finish": np.array([FINISH.index(r["finish"]) for r in rows], dtype=np.uint8),
    }
    metadata = {"format": FORMAT, "source": source, "ids": json.dumps([str(r["id"]) for r in rows])}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def read_chunk(path: str | Path) -> tuple[str, list[dict]]:
    """``(source, rows)`` of one chunk; raises `TornChunkError` if the file is cut off or inconsistent."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path))
        ids = json.loads(metadata["ids"])
        tokens, offsets = tensors["tokens"], tensors["offsets"]
        prompt_len, finish = tensors["prompt_len"], tensors["finish"]
    except Exception as err:  # safetensors raises several types for a cut-off file
        raise TornChunkError(f"{path}: unreadable chunk ({type(err).__name__}: {err})") from None
    n = len(ids)
    lengths = np.diff(offsets)
    if (metadata.get("format") != FORMAT or len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(tokens)
            or (lengths < 0).any() or len(prompt_len) != n or len(finish) != n or (prompt_len > lengths).any()
            or (finish >= len(FINISH)).any()):
        raise TornChunkError(f"{path}: inconsistent chunk")
    tokens = tokens.astype(np.int64).tolist()
    rows = [{"id": ids[i], "input_ids": tokens[offsets[i]:offsets[i + 1]], "prompt_len": int(prompt_len[i]),
             "finish": FINISH[finish[i]]} for i in range(n)]
    return metadata.get("source", path.parent.name), rows


def chunk_paths(directory: str | Path) -> list[Path]:
    """A source folder's chunk files in number order."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if CHUNK_PATTERN.match(p.name)),
                  key=lambda p: int(CHUNK_PATTERN.match(p.name)[1]))


def source_dirs(root: str | Path, sources: Iterable[str] | None = None) -> list[Path]:
    """The source folders under a store root (all, or the named ones that exist), sorted by name."""
    root = Path(root)
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if sources is None and root.is_dir() else sources
    return [root / name for name in (names or []) if (root / name).is_dir()]


def _pending_rows(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line: that row is generated again
                break
    return rows


def _replace_text(path: Path, text: str) -> None:
    """Write a small file atomically (a temporary sibling renamed into place)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def eval_pool(directory: str | Path) -> int | None:
    """The number of leading rows of a source folder that evaluation may draw from (None: all of them)."""
    meta = Path(directory) / META
    pool = json.loads(meta.read_text()).get(EVAL_POOL) if meta.exists() else None
    return None if pool is None else int(pool)


def read_answers(root: str | Path, sources: Iterable[str] | None = None, *,
                 include_pending: bool = False, mark_eval_pool: bool = False) -> Iterator[dict]:
    """Rows ``{"id", "input_ids", "prompt_len", "finish"}`` of a store (all sources, or the named ones), chunk by
    chunk. A torn chunk is skipped with a warning (the generator regenerates its rows). ``include_pending``: also
    the rows not yet in a chunk (uncommitted). ``mark_eval_pool``: rows past a source's pinned ``eval_pool``
    (appended after the pin) carry ``"eval_candidate": False`` (the trainer's reader, `features.read_rows`)."""
    for directory in source_dirs(root, sources):
        pool = eval_pool(directory) if mark_eval_pool else None
        for i, row in enumerate(_source_rows(directory, include_pending)):
            yield row if pool is None or i < pool else {**row, "eval_candidate": False}


def _source_rows(directory: Path, include_pending: bool) -> Iterator[dict]:
    for path in chunk_paths(directory):
        try:
            yield from read_chunk(path)[1]
        except TornChunkError as err:
            warnings.warn(f"skipping {err}", stacklevel=3)
    if include_pending:
        yield from _pending_rows(directory / PENDING)


def token_sequences(root: str | Path, sources: Iterable[str] | None = None, *, answers_only: bool = False,
                    exclude: frozenset[str] | set[str] = frozenset()) -> Iterator[np.ndarray]:
    """Flat int64 token sequences (prompt + answer, or the answer alone) of a store: a retrieval corpus; rows whose
    id is in ``exclude`` are left out."""
    for row in read_answers(root, sources):
        if row["id"] in exclude:
            continue
        ids = row["input_ids"][row["prompt_len"]:] if answers_only else row["input_ids"]
        yield np.asarray(ids, dtype=np.int64)


def folder_source(directory: str | Path) -> str:
    """The prompt source a store folder answers (its meta.json's ``source``; else the folder's name)."""
    meta = Path(directory) / META
    source = json.loads(meta.read_text()).get("source") if meta.exists() else None
    return source or Path(directory).name


def answered_ids(root: str | Path, source: str, *, skip: str | Path | None = None) -> set[str]:
    """Ids of ``source``'s prompts answered in any folder of the store but ``skip`` (chunks and pending rows): a
    folder made with other settings (``math-fp32`` next to ``math``) answers only prompts no other folder holds."""
    skip = None if skip is None else Path(skip).resolve()
    return {row["id"] for directory in source_dirs(root)
            if directory.resolve() != skip and folder_source(directory) == source
            for row in _source_rows(directory, include_pending=True)}


def store_summary(root: str | Path) -> dict[str, dict]:
    """Per source: chunks, rows, prompt and answer tokens, rows that ended with EOS, bytes on disk."""
    summary = {}
    for directory in source_dirs(root):
        paths = chunk_paths(directory)
        rows = [r for p in paths for r in read_chunk(p)[1]]
        summary[directory.name] = {
            "chunks": len(paths), "rows": len(rows), "prompt_tokens": sum(r["prompt_len"] for r in rows),
            "answer_tokens": sum(len(r["input_ids"]) - r["prompt_len"] for r in rows),
            "eos": sum(r["finish"] == "eos" for r in rows), "bytes": sum(p.stat().st_size for p in paths)}
    return summary


class AnswerStore:
    """Writer for one source's folder: rows go to ``pending.jsonl`` (flushed per batch) and every ``chunk_rows``
    rows become an immutable chunk. Resumable: `done` holds the ids in the chunks and the pending file; a torn
    chunk is moved aside (``*.torn``) so its rows are generated again, and a torn pending line is dropped.

    ``settings`` (model, dtype, max new tokens, ...) are recorded in ``meta.json``; reopening the folder with
    different settings is refused, so one folder never mixes answers made differently. ``folder`` (default: the
    source's name) holds answers of ``source`` made with other settings, e.g. ``math-fp32`` next to ``math``.
    """

    def __init__(self, root: str | Path, source: str, *, settings: dict | None = None, chunk_rows: int = 512,
                 folder: str | None = None) -> None:
        self.source, self.chunk_rows = source, chunk_rows
        self.directory = Path(root) / (folder or source)
        meta = self.directory / META
        if meta.exists() and (held := folder_source(self.directory)) != source:
            raise ValueError(f"{self.directory} holds answers of source {held!r}, not {source!r}")
        if settings is not None and meta.exists() and json.loads(meta.read_text())["settings"] != settings:
            raise ValueError(f"{self.directory} holds answers made with other settings: "
                             f"{json.loads(meta.read_text())['settings']} (now {settings})")
        self.settings = settings
        for stale in self.directory.glob(".chunk-*.tmp-*"):  # an interrupted write (never renamed into place)
            stale.unlink()
        self.done: set[str] = set()
        self.next_number = 0
        self.stored_rows = 0  # rows in the chunks
        for path in chunk_paths(self.directory):
            self.next_number = int(CHUNK_PATTERN.match(path.name)[1]) + 1
            try:
                rows = read_chunk(path)[1]
                self.done.update(r["id"] for r in rows)
                self.stored_rows += len(rows)
            except TornChunkError as err:
                warnings.warn(f"moving aside {err}", stacklevel=2)
                os.replace(path, path.with_name(path.name + ".torn"))
        pending = self.directory / PENDING
        self.pending = [r for r in _pending_rows(pending) if r["id"] not in self.done]
        if self.directory.is_dir():
            self._rewrite_pending()
        self.done.update(r["id"] for r in self.pending)

    def _open_folder(self) -> None:
        """Create the folder and its ``meta.json`` with the first row, so that opening a store for a source whose
        prompts are all answered elsewhere leaves no empty folder behind."""
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self.directory / META
        if self.settings is not None and not meta.exists():
            meta.write_text(json.dumps({"format": FORMAT, "source": self.source, "settings": self.settings},
                                       indent=1) + "\n")

    def _rewrite_pending(self) -> None:
        _replace_text(self.directory / PENDING, "".join(json.dumps(r) + "\n" for r in self.pending))

    def add(self, rows: Sequence[dict]) -> None:
        """Record finished rows (appended to the pending file at once); full chunks are written out."""
        rows = [{k: r[k] for k in ("id", "input_ids", "prompt_len", "finish")} for r in rows]
        if not rows:
            return
        self._open_folder()
        with open(self.directory / PENDING, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
            f.flush()
            os.fsync(f.fileno())
        self.pending += rows
        self.done.update(r["id"] for r in rows)
        while len(self.pending) >= self.chunk_rows:
            self._write(self.chunk_rows)

    def flush(self) -> None:
        """Write the pending rows (fewer than ``chunk_rows``) as a last chunk."""
        if self.pending:
            self._write(len(self.pending))

    def _pin_eval_pool(self) -> None:
        """Before the first append to a source that holds chunks: pin its evaluation pool to the rows it holds."""
        meta = self.directory / META
        if self.stored_rows and meta.exists():
            data = json.loads(meta.read_text())
            if EVAL_POOL not in data:
                _replace_text(meta, json.dumps({**data, EVAL_POOL: self.stored_rows}, indent=1) + "\n")

    def _write(self, count: int) -> None:
        self._pin_eval_pool()
        write_chunk(self.directory / f"chunk-{self.next_number:05d}.safetensors", self.pending[:count], self.source)
        self.next_number += 1
        self.stored_rows += count
        self.pending = self.pending[count:]
        self._rewrite_pending()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m hf_jetspec.training.answers data/answers [--flush] [--datastore DIR [--tokenizer MODEL]]``:
    per-source counts of a store, as a Markdown table; ``--datastore`` also indexes the answers (without their
    prompts) as a retrieval datastore (``DIR/datastore.safetensors``, e.g. a head's folder)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", type=Path, nargs="?", default=Path("data/answers"))
    parser.add_argument("--flush", action="store_true",
                        help="first write every source's pending rows as a chunk (only while no generator runs), so "
                             "that all finished rows can be committed")
    parser.add_argument("--datastore", type=Path, default=None, metavar="DIR",
                        help="write DIR/datastore.safetensors: a suffix index over every committed answer")
    parser.add_argument("--tokenizer", default=None, metavar="MODEL",
                        help="the tokenizer the answers were made with (default: the embedded SmolLM2's)")
    parser.add_argument("--with-prompts", action="store_true", help="index prompt + answer, not the answer alone")
    args = parser.parse_args(argv)
    if not source_dirs(args.root):
        parser.error(f"{args.root}: no answer store there (a folder of source folders with chunk files)")
    if args.datastore is not None and args.datastore.exists() and not args.datastore.is_dir():
        parser.error(f"--datastore {args.datastore}: a file; it names the folder datastore.safetensors goes into")
    if args.flush:
        for directory in source_dirs(args.root):
            AnswerStore(args.root, folder_source(directory), folder=directory.name).flush()
    summary = store_summary(args.root)
    total = {key: sum(s[key] for s in summary.values()) for key in next(iter(summary.values()), {})}
    print("| source | chunks | rows | ended (eos) | prompt tokens | answer tokens | bytes | bytes/token |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in list(summary.items()) + ([("total", total)] if total else []):
        tokens = s["prompt_tokens"] + s["answer_tokens"]
        print(f"| {name} | {s['chunks']} | {s['rows']:,} | {s['eos']:,} | {s['prompt_tokens']:,} | "
              f"{s['answer_tokens']:,} | {s['bytes']:,} | {s['bytes'] / max(tokens, 1):.2f} |")
    if args.datastore is not None:
        print(build_datastore(args.root, args.datastore, args.tokenizer, answers_only=not args.with_prompts))


def build_datastore(root: str | Path, out_dir: str | Path, tokenizer=None, *, answers_only: bool = True,
                    sources: Iterable[str] | None = None, exclude: frozenset[str] | set[str] = frozenset()) -> Path:
    """Index a store's committed answers as a retrieval datastore in ``out_dir`` (``datastore.safetensors``, with
    the tokenizer's fingerprint so that a target with another vocabulary refuses it). ``tokenizer``: a tokenizer,
    a model folder / Hub id, or None for the embedded SmolLM2's; ``sources`` / ``exclude``: as in
    `token_sequences`."""
    from hf_jetspec.suffix_index import CorpusIndex, tokenizer_fingerprint

    if tokenizer is None:
        from hf_jetspec.models import default_model

        tokenizer = default_model()[1]
    elif isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    index = CorpusIndex.build(token_sequences(root, sources, answers_only=answers_only, exclude=exclude),
                              len(tokenizer), tokenizer_fingerprint(tokenizer))
    return index.save(out_dir)


if __name__ == "__main__":
    main()
