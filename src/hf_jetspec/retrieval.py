"""Retrieval drafting: continuations of text already written, as candidate tries for a merged tree.

`RetrievalDrafter` looks up the longest suffixes of the committed sequence in this call's own prompt + output
(`ContextIndex`, extended as tokens are committed) and, when given, a static datastore (`CorpusIndex`, e.g. the
target's own earlier answers shipped beside a head), and returns what followed them as one
`hf_jetspec.candidates.Candidates` trie with per-source counts. It needs no model and no training.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .calibration import CALIBRATION_FILE, Calibration
from .candidates import Candidates, merge_candidates
from .limits import check_range
from .suffix_index import DATASTORE_FILE, ContextIndex, CorpusIndex

DEFAULT_RETRIEVAL_DEPTH = 16


class RetrievalDrafter:
    """``corpus``: an optional `CorpusIndex`; ``depth``: the deepest continuation proposed; ``max_occurrences``:
    occurrences per lookup (the most recent in the context, evenly spread over the corpus's range)."""

    def __init__(self, corpus: CorpusIndex | None = None, depth: int = DEFAULT_RETRIEVAL_DEPTH, max_match: int = 32,
                 max_occurrences: int = 64) -> None:
        check_range("retrieval_depth", depth)
        check_range("max_match", max_match, maximum=2**31)
        check_range("max_occurrences", max_occurrences, maximum=2**31)
        self.corpus, self.depth = corpus, depth
        self.max_match, self.max_occurrences = max_match, max_occurrences
        self.start()

    def start(self) -> None:
        self.context = ContextIndex(max_match=self.max_match)

    def candidates(self, ids: torch.Tensor, depth: int) -> Candidates | None:
        """Continuations (up to ``min(depth, self.depth)`` tokens) of the committed ``ids [1, L]`` (its last token is
        the anchor, the trie's root); None when nothing matches."""
        new = ids[0, len(self.context):]
        if new.numel():
            self.context.extend(new.tolist())
        depth = min(depth, self.depth)
        if depth < 1:
            return None
        found = self.context.lookup(depth, self.max_occurrences)
        if self.corpus is not None:
            tail = ids[0, -self.max_match:].tolist()
            found = merge_candidates(found, self.corpus.lookup(tail, depth, self.max_occurrences))
        return found


def load_retrieval_assets(path: str | Path | None, **hub) -> tuple[CorpusIndex | None, Calibration | None]:
    """The datastore (``datastore.safetensors``) and calibration (``calibration.json``) stored in a head's folder or
    Hub repo, each None when absent. ``hub``: the ``from_pretrained`` options that say where the head's files are
    (``subfolder``, ``revision``, ``cache_dir``, ``token``, ``local_files_only``; others are ignored)."""
    if path is None:
        return None, None
    from transformers.utils import cached_file

    hub = {k: hub[k] for k in ("subfolder", "revision", "cache_dir", "token", "local_files_only") if hub.get(k)}
    folder = Path(path) / hub.get("subfolder", "")

    def find(name: str) -> str | None:
        local = folder / name
        if local.is_file():
            return str(local)
        if Path(path).is_dir():
            return None
        try:
            return cached_file(str(path), name, _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False, **hub)
        except (OSError, ValueError):
            return None

    datastore, calibration = find(DATASTORE_FILE), find(CALIBRATION_FILE)
    return (CorpusIndex.load(datastore) if datastore else None,
            Calibration.load(calibration) if calibration else None)


def resolve_retrieval(retrieval, draft_head, model, head_only: bool = False, depth: int = DEFAULT_RETRIEVAL_DEPTH
                      ) -> RetrievalDrafter | None:
    """The `RetrievalDrafter` a decoding call uses, or None (head only). ``retrieval``: None (on, with the head's
    datastore, unless ``head_only``: the rule or builder cannot merge), False, True, a `CorpusIndex` or a
    `RetrievalDrafter`. A datastore made for another vocabulary is refused."""
    if retrieval is False or (retrieval is None and head_only):
        return None
    if head_only:
        raise ValueError("retrieval cannot be combined with sampling_rule='rrs' (trees drawn from the head) or "
                         "tree_builder='chain': pass retrieval=False")
    if isinstance(retrieval, RetrievalDrafter):
        drafter = retrieval
    elif isinstance(retrieval, CorpusIndex):
        drafter = RetrievalDrafter(retrieval, depth=depth)
    elif retrieval is None or retrieval is True:
        drafter = RetrievalDrafter(getattr(draft_head, "datastore", None), depth=depth)
    else:
        raise TypeError(f"retrieval must be None, True, False, a CorpusIndex or a RetrievalDrafter, got "
                        f"{type(retrieval).__name__}")
    if drafter.corpus is not None:
        drafter.corpus.check(model.get_output_embeddings().weight.shape[0])
    return drafter
