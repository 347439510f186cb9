"""Suffix indexes for retrieval drafting: what followed the longest suffix of the current context, as a trie.

Two sources of continuations:

- ``ContextIndex``: this call's prompt + accepted tokens, extended as tokens are accepted. A lookup finds the
  longest suffix of the text (at most ``max_match`` tokens) that occurred earlier with a following token.
- ``CorpusIndex``: a static corpus of token-id documents as a suffix array (built once; saved and loaded as
  ``datastore.safetensors``, which can sit beside a head's ``model.safetensors``). A lookup binary-searches the
  longest suffix of a given context that occurs in a document with a following token.

Both return a `hf_jetspec.candidates.Candidates` trie rooted at the anchor (the context's last token) whose paths
are what followed the matched occurrences (never crossing the current end or a document end), with how many
occurrences support each node; `hf_jetspec.candidates.merge_candidates` merges the tries of several sources.

Token ids are integers in ``[0, vocab_size)``. Arrays are numpy (int64 in ``Candidates``); torch tensors are
accepted as inputs.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from pathlib import Path

import numpy as np

from .candidates import PAD, Candidates, trie_from_rows

DATASTORE_FILE = "datastore.safetensors"
FORMAT = "hf_jetspec.suffix_index"
FORMAT_VERSION = 1


def _as_ids(tokens) -> np.ndarray:
    """Any sequence of token ids (list, numpy, torch; a ``[1, n]`` batch row too) as int64 numpy ``[n]``."""
    if hasattr(tokens, "detach"):
        tokens = tokens.detach().cpu().numpy()
    return np.asarray(tokens, dtype=np.int64).reshape(-1)


def _tail_ids(tokens, count: int) -> np.ndarray:
    """The last ``count`` ids of ``tokens`` (as ``_as_ids``) without converting the rest."""
    if hasattr(tokens, "reshape"):
        return _as_ids(tokens.reshape(-1)[-count:])
    return _as_ids(list(tokens[-count:]))


# ----------------------------------------------------------------------------------------------------------------
# ContextIndex: this call's prompt + accepted tokens
# ----------------------------------------------------------------------------------------------------------------


class ContextIndex:
    """The growing text of one call (prompt, then accepted tokens). ``extend`` appends (amortised O(new tokens));
    ``lookup`` finds the longest suffix of the text (<= ``max_match`` tokens) that occurred earlier with a following
    token and returns what followed its most recent occurrences.

    The lookup is vectorised (see ``match``): one numpy scan of the text for the last token, then the match grown
    backwards over the candidates still matching. Tens of microseconds for texts of thousands of tokens; about a
    millisecond for 32k tokens of one repeated token (the worst case).
    """

    BLOCK = 8  # offsets compared per gather once few candidates remain
    DENSE = 16  # compare whole shifted slices while more than 1/DENSE of the positions still match

    def __init__(self, tokens=None, max_match: int = 32, source: str = "context"):
        if max_match < 1:
            raise ValueError(f"max_match must be >= 1, got {max_match}")
        self.max_match, self.source = max_match, source
        self._buffer = np.empty(256, dtype=np.int64)
        self._size = 0
        if tokens is not None:
            self.extend(tokens)

    def __len__(self) -> int:
        return self._size

    @property
    def tokens(self) -> np.ndarray:
        """int64 ``[n]``: the text so far (a view; do not modify)."""
        return self._buffer[: self._size]

    def extend(self, tokens) -> None:
        """Append accepted tokens (the prompt first)."""
        new = _as_ids(tokens)
        end = self._size + new.size
        if end > self._buffer.size:
            grown = np.empty(max(end, 2 * self._buffer.size), dtype=np.int64)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        self._buffer[self._size : end] = new
        self._size = end

    def match(self) -> tuple[int, np.ndarray]:
        """(longest match length L, int64 ``[m]`` end positions of its earlier occurrences, ascending); (0, [])
        when the last token never occurred earlier. An earlier occurrence ends at j <= n - 2, so t[j + 1] follows.

        The set of earlier ends matching the last L tokens shrinks as L grows. While it holds more than 1/DENSE of
        the text (repetitive text), each step compares whole shifted slices (contiguous, no gathers); then the
        few survivors are compared in blocks of BLOCK offsets by gathering."""
        text, n = self.tokens, self._size
        if n < 2:
            return 0, np.zeros(0, dtype=np.int64)
        limit = min(self.max_match, n - 1)
        hits = text[:-1] == text[-1]  # [n - 1]: hits[j] iff the last `length` tokens also end at j
        count, length = int(np.count_nonzero(hits)), 1
        if not count:
            return 0, np.zeros(0, dtype=np.int64)
        while length < limit and count * self.DENSE > n:
            longer = np.zeros_like(hits)
            np.logical_and(hits[length:], text[: n - 1 - length] == text[n - 1 - length], out=longer[length:])
            found = int(np.count_nonzero(longer))
            if not found:
                return length, np.flatnonzero(hits)
            hits, count, length = longer, found, length + 1
        ends = np.flatnonzero(hits)
        while length < limit:
            offsets = np.arange(length, min(length + self.BLOCK, limit))
            back = ends[:, None] - offsets  # [m, b] positions compared with text[n - 1 - offsets]
            same = (text[np.maximum(back, 0)] == text[n - 1 - offsets]) & (back >= 0)
            run = np.logical_and.accumulate(same, axis=1).sum(axis=1)
            best = int(run.max())
            ends, length = ends[run == best], length + best
            if best < offsets.size:
                break
        return length, ends

    def lookup(self, max_depth: int, max_occurrences: int = 64, min_match: int = 1) -> Candidates | None:
        """Candidates from the ``max_occurrences`` most recent earlier occurrences of the longest matching suffix
        (continuations up to ``max_depth`` tokens, stopping at the current end), or ``None`` when no suffix of at
        least ``min_match`` tokens occurred earlier."""
        length, ends = self.match()
        if length < max(min_match, 1) or max_depth < 1 or max_occurrences < 1:
            return None
        used = ends[-max_occurrences:]
        depth = min(max_depth, self._size - 1 - int(used[0]))
        index = used[:, None] + 1 + np.arange(depth)
        rows = np.where(index < self._size, self._buffer[np.minimum(index, self._size - 1)], PAD)
        return trie_from_rows(int(self._buffer[self._size - 1]), rows, self.source, length, ends.size)


# ----------------------------------------------------------------------------------------------------------------
# CorpusIndex: a static corpus as a suffix array
# ----------------------------------------------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    """Storage dtype of a corpus: uint16 when the ids and the separator (the dtype's max) fit, else uint32."""
    if vocab_size < 1 or vocab_size >= 2**32 - 1:
        raise ValueError(f"vocab_size must be in [1, 2**32 - 2], got {vocab_size}")
    return np.dtype(np.uint16 if vocab_size <= 2**16 - 1 else np.uint32)


def suffix_array_numpy(tokens: np.ndarray, depth: int) -> np.ndarray:
    """int64 ``[T]``: positions 0..T-1 sorted by their first ``2**ceil(log2(depth))`` (>= ``depth``) tokens, ties
    by position; running past the end sorts first. Prefix doubling: ceil(log2(depth)) rounds of a stable argsort,
    stopping early once all ranks differ. A bounded depth bounds the rounds even when the corpus repeats long
    passages (a full suffix array would need log2(longest repeat) rounds)."""
    n = tokens.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(tokens, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    ordered = tokens[order]
    rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
    span = 1
    while span < depth and rank[order[-1]] < n - 1:
        second = np.zeros(n, dtype=np.int64)
        second[: n - span] = rank[span:] + 1  # 0: past the end
        key = rank * (n + 1) + second
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        span *= 2
    return order


def suffix_array_divsufsort(tokens: np.ndarray) -> np.ndarray:
    """int64 ``[T]``: the full suffix array by libdivsufsort (``pydivsufsort``), several times faster to build."""
    import pydivsufsort

    if tokens.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(pydivsufsort.divsufsort(np.ascontiguousarray(tokens)), dtype=np.int64)


def corpus_suffix_array(tokens: np.ndarray, max_match: int, backend: str = "auto") -> np.ndarray:
    """``[T - D]`` (uint32, or int64 past 2**32 tokens): the non-separator positions of a corpus ``tokens`` array,
    sorted by at least their first ``max_match + 1`` tokens. ``backend``: "numpy", "divsufsort" or "auto"."""
    if backend == "auto":
        backend = "divsufsort" if _divsufsort_available() else "numpy"
    if backend == "numpy":
        order = suffix_array_numpy(tokens, max_match + 1)
    elif backend == "divsufsort":
        order = suffix_array_divsufsort(tokens)
    else:
        raise ValueError(f"unknown suffix array backend {backend!r} (numpy, divsufsort, auto)")
    order = order[tokens[order] != np.iinfo(tokens.dtype).max]
    return order.astype(np.uint32 if tokens.size < 2**32 else np.int64)


def _divsufsort_available() -> bool:
    try:
        import pydivsufsort  # noqa: F401
    except ImportError:
        return False
    return True


class CorpusIndex:
    """A static corpus of token-id documents with a suffix array over it.

    tokens: ``[T]`` uint16/uint32 (``token_dtype``), the documents concatenated, each followed by the separator
    ``SEP`` (the dtype's max, above every id). suffix_array: ``[T - D]`` (uint32, or int64 past 2**32 tokens), the
    positions of all non-separator tokens sorted lexicographically by at least their first ``max_match + 1`` tokens.
    doc_offsets: int64 ``[D + 1]``, where each document starts in ``tokens`` (the last entry = T).
    A match never crosses a separator because no context token equals it; continuations stop there.
    """

    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, doc_offsets: np.ndarray, vocab_size: int,
                 tokenizer_fingerprint: str = "", max_match: int = 32, source: str = "corpus", path: str | None = None):
        self.tokens, self.suffix_array, self.doc_offsets = tokens, suffix_array, doc_offsets
        self.vocab_size, self.tokenizer_fingerprint, self.max_match = int(vocab_size), tokenizer_fingerprint, max_match
        self.source, self.path = source, path
        self._derive()

    def _derive(self) -> None:
        """The lookup's views of the arrays (rebuilt after unpickling and deep copies: a memoryview cannot be
        pickled, and a copied head must still find its matches)."""
        self.sep = int(np.iinfo(self.tokens.dtype).max)
        self._width = self.tokens.dtype.itemsize
        # A big-endian copy of the tokens: bytes order = token order, so bisect compares slices in C.
        self._bytes = self.tokens.astype(self.tokens.dtype.newbyteorder(">")).tobytes()
        self._sa_view = memoryview(np.ascontiguousarray(self.suffix_array))

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_bytes", "_sa_view")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._derive()

    # -- building ------------------------------------------------------------------------------------------------

    @classmethod
    def build(cls, sequences, vocab_size: int, tokenizer_fingerprint: str = "", max_match: int = 32,
              backend: str = "auto") -> CorpusIndex:
        """Index ``sequences`` (an iterable of token-id sequences, one per document). ``backend``: "numpy"
        (prefix doubling to ``max_match + 1`` tokens), "divsufsort" (the optional ``pydivsufsort`` package: a full
        suffix array, faster) or "auto" (divsufsort when installed)."""
        if max_match < 1:
            raise ValueError(f"max_match must be >= 1, got {max_match}")
        dtype = token_dtype(vocab_size)
        docs = [_as_ids(s) for s in sequences]
        for number, doc in enumerate(docs):
            if doc.size and (doc.min() < 0 or doc.max() >= vocab_size):
                raise ValueError(f"document {number} has token ids outside [0, {vocab_size})")
        lengths = np.array([doc.size + 1 for doc in docs], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        tokens = np.full(int(offsets[-1]), np.iinfo(dtype).max, dtype=dtype)
        if docs:
            body = np.ones(tokens.size, dtype=bool)
            body[offsets[1:] - 1] = False
            tokens[body] = np.concatenate(docs).astype(dtype)
        return cls(tokens, corpus_suffix_array(tokens, max_match, backend), offsets, vocab_size,
                   tokenizer_fingerprint, max_match)

    # -- facts ---------------------------------------------------------------------------------------------------

    @property
    def num_documents(self) -> int:
        return self.doc_offsets.size - 1

    @property
    def num_tokens(self) -> int:
        """Corpus tokens, separators excluded."""
        return self.suffix_array.size

    def document(self, number: int) -> np.ndarray:
        return self.tokens[self.doc_offsets[number] : self.doc_offsets[number + 1] - 1].astype(np.int64)

    def __repr__(self) -> str:
        return (f"CorpusIndex({self.num_documents} documents, {self.num_tokens} tokens, vocab_size={self.vocab_size}, "
                f"max_match={self.max_match})")

    # -- lookup --------------------------------------------------------------------------------------------------

    def _query(self, context) -> np.ndarray:
        """The context's last <= max_match tokens after its last id outside the vocabulary (those never match)."""
        query = _tail_ids(context, self.max_match)
        outside = np.flatnonzero((query < 0) | (query >= self.vocab_size))
        return query[outside[-1] + 1 :] if outside.size else query

    def match(self, context) -> tuple[int, int, int]:
        """(L, lo, hi): the longest suffix of ``context`` (<= max_match tokens) that occurs in a document with a
        following token, and the suffix-array range ``[lo, hi)`` of its occurrences that have one; (0, 0, 0) if
        none. Binary search over L (matches are monotone in L), each a bisection of the suffix array with keys
        compared as big-endian bytes: O(log max_match * log T) cheap steps."""
        query = self._query(context)
        if query.size == 0 or self.suffix_array.size == 0:
            return 0, 0, 0
        width, text, sa = self._width, self._bytes, self._sa_view
        qbytes = query.astype(self.tokens.dtype.newbyteorder(">")).tobytes()
        sep = np.array([self.sep], dtype=self.tokens.dtype.newbyteorder(">")).tobytes()

        def first(length: int) -> int | None:
            """Lower bound of the last ``length`` query tokens if some occurrence has a following token (those
            followed by a separator sort last in the range, so the first one decides)."""
            pattern, span = qbytes[-length * width :], length * width
            lo = bisect.bisect_left(sa, pattern, key=lambda p: text[p * width : p * width + span])
            if lo == len(sa):
                return None
            head = text[sa[lo] * width : sa[lo] * width + span + width]
            return lo if head[:span] == pattern and head[span:] != sep else None

        shortest, longest, lo = 0, query.size, 0
        while shortest < longest:
            length = (shortest + longest + 1) // 2
            found = first(length)
            if found is None:
                longest = length - 1
            else:
                shortest, lo = length, found
        if shortest == 0:
            return 0, 0, 0
        span = (shortest + 1) * width
        hi = bisect.bisect_left(sa, qbytes[-shortest * width :] + sep, lo=lo,
                                key=lambda p: text[p * width : p * width + span])
        return shortest, lo, hi

    def lookup(self, context, max_depth: int, max_occurrences: int = 64, min_match: int = 1) -> Candidates | None:
        """Candidates for ``context`` (token ids; its last token is the anchor) from up to ``max_occurrences``
        occurrences of its longest matching suffix, evenly spaced over the suffix-array range (which is sorted by
        continuation, so the counts stay proportional to the full range; ``total`` = the range size), continuations
        up to ``max_depth`` tokens within their document. ``None`` when no suffix of >= ``min_match`` tokens
        occurs."""
        context = _tail_ids(context, self.max_match)
        length, lo, hi = self.match(context)
        if length < max(min_match, 1) or max_depth < 1 or max_occurrences < 1:
            return None
        total = hi - lo
        used = min(max_occurrences, total)
        picks = lo + (np.arange(used, dtype=np.int64) * total) // used
        starts = self.suffix_array[picks].astype(np.int64) + length
        index = np.minimum(starts[:, None] + np.arange(max_depth), self.tokens.size - 1)  # the last token is SEP
        rows = self.tokens[index].astype(np.int64)
        inside = np.logical_and.accumulate(rows != self.sep, axis=1)
        rows[~inside] = PAD
        rows = rows[:, : int(inside.sum(axis=1).max())]
        return trie_from_rows(int(context[-1]), rows, self.source, length, total)

    # -- compatibility -------------------------------------------------------------------------------------------

    def check(self, tokenizer_or_vocab_size) -> None:
        """Raise ``ValueError`` unless this datastore fits: an int is compared with ``vocab_size``, a tokenizer's
        ``tokenizer_fingerprint`` with the stored one."""
        where = f"datastore {self.path}" if self.path else "datastore"
        if isinstance(tokenizer_or_vocab_size, (int, np.integer)):
            if int(tokenizer_or_vocab_size) != self.vocab_size:
                wanted = int(tokenizer_or_vocab_size)
                raise ValueError(f"{where} was built for vocab size {self.vocab_size}, not {wanted}")
            return
        found = tokenizer_fingerprint(tokenizer_or_vocab_size)
        if found != self.tokenizer_fingerprint:
            stored = self.tokenizer_fingerprint or "no recorded tokenizer"
            raise ValueError(f"{where} was built for tokenizer {stored}, not this tokenizer ({found})")

    # -- persistence ---------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike, suffix_array: bool = True) -> Path:
        """Write ``path`` (a ``.safetensors`` file, or a folder that gets ``DATASTORE_FILE``); returns the file.
        ``suffix_array=False`` stores only tokens and document offsets (a third of the size: 2 instead of 6 bytes
        per token below 65,535 ids) and ``load`` rebuilds the suffix array (~0.1-1 s per million tokens)."""
        from safetensors.numpy import save_file

        file = datastore_path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"tokens": self.tokens, "doc_offsets": self.doc_offsets}
        if suffix_array:
            tensors["suffix_array"] = self.suffix_array
        metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "vocab_size": str(self.vocab_size),
                    "tokenizer_fingerprint": self.tokenizer_fingerprint, "max_match": str(self.max_match),
                    "suffix_array": "stored" if suffix_array else "rebuild"}
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(file), metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(file, 0o666 & ~umask)  # safetensors creates the file owner-only; a datastore is shared like weights
        return file

    @classmethod
    def load(cls, path: str | os.PathLike, tokenizer=None) -> CorpusIndex:
        """Read a datastore written by ``save`` (a file, or a folder holding ``DATASTORE_FILE``). With
        ``tokenizer`` (or a vocab size) it is also ``check``-ed. A missing file raises ``FileNotFoundError``, a
        corrupt or inconsistent one ``ValueError``, both naming the file."""
        from safetensors import safe_open

        file = datastore_path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no datastore file at {file}")
        try:
            with safe_open(str(file), framework="np") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except Exception as error:  # safetensors raises its own error types for bad headers / truncation
            raise ValueError(f"{file} is not a readable safetensors datastore: {error}") from error
        index = cls(*_validated(file, metadata, tensors), path=str(file))
        if tokenizer is not None:
            index.check(tokenizer)
        return index


def datastore_path(path: str | os.PathLike) -> Path:
    """``path`` itself if it names a ``.safetensors`` file, else ``path / DATASTORE_FILE`` (a folder)."""
    path = Path(path)
    return path if path.suffix == ".safetensors" and not path.is_dir() else path / DATASTORE_FILE


def _validated(file: Path, metadata: dict, tensors: dict) -> tuple:
    """The constructor arguments from a datastore file's contents, after cheap consistency checks (O(T) numpy
    passes and a sampled order check of the suffix array)."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"{file} is not a valid hf_jetspec datastore: {reason}")

    if metadata.get("format") != FORMAT:
        raise bad(f"format {metadata.get('format')!r}, expected {FORMAT!r}")
    if metadata.get("format_version") != str(FORMAT_VERSION):
        raise bad(f"format version {metadata.get('format_version')!r}, this version reads {FORMAT_VERSION}")
    stored = metadata.get("suffix_array", "stored")
    if stored not in ("stored", "rebuild"):
        raise bad(f"suffix_array metadata {stored!r}, expected 'stored' or 'rebuild'")
    missing = {"tokens", "doc_offsets"} | ({"suffix_array"} if stored == "stored" else set())
    missing -= set(tensors)
    if missing:
        raise bad(f"missing tensors {sorted(missing)}")
    fingerprint = metadata.get("tokenizer_fingerprint", "")
    try:
        vocab_size, max_match = int(metadata["vocab_size"]), int(metadata["max_match"])
        dtype = token_dtype(vocab_size)
        if max_match < 1:
            raise ValueError(f"max_match {max_match}")
    except (KeyError, ValueError) as error:
        raise bad(f"bad metadata ({error})") from None
    tokens, offsets = tensors["tokens"], tensors["doc_offsets"]
    if tokens.dtype != dtype or tokens.ndim != 1:
        raise bad(f"tokens {tokens.dtype}{list(tokens.shape)}, expected 1-D {dtype} for vocab size {vocab_size}")
    if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size < 1:
        raise bad("doc_offsets must be 1-D int64")
    sep = np.iinfo(dtype).max
    steps = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != tokens.size or (steps < 1).any():
        raise bad("doc_offsets do not partition the tokens")
    separators = tokens == sep
    if not separators[offsets[1:] - 1].all() or int(separators.sum()) != offsets.size - 1:
        raise bad("document separators are not where doc_offsets say")
    if tokens.size > offsets.size - 1 and int(tokens[~separators].max()) >= vocab_size:
        raise bad(f"token ids >= vocab size {vocab_size}")
    if stored == "rebuild":
        return tokens, corpus_suffix_array(tokens, max_match), offsets, vocab_size, fingerprint, max_match
    sa = tensors["suffix_array"]
    if sa.dtype not in (np.uint32, np.int64) or sa.ndim != 1 or sa.size != tokens.size - (offsets.size - 1):
        raise bad(f"suffix_array {sa.dtype}{list(sa.shape)} does not fit {tokens.size} tokens")
    if sa.size:
        if int(sa.min()) < 0 or int(sa.max()) >= tokens.size or separators[sa].any():
            raise bad("suffix_array points outside the corpus tokens")
        big, width = dtype.newbyteorder(">"), max_match + 1
        for i in np.random.default_rng(0).integers(0, max(sa.size - 1, 1), size=min(64, sa.size - 1)):
            a, b = int(sa[i]), int(sa[i + 1])
            if tokens[a : a + width].astype(big).tobytes() > tokens[b : b + width].astype(big).tobytes():
                raise bad("suffix_array is not sorted")
    return tokens, sa, offsets, vocab_size, fingerprint, max_match


def tokenizer_fingerprint(tokenizer) -> str:
    """``"sha256:" + 16 hex digits`` of what gives token ids their meaning: ``len(tokenizer)`` and every
    (id, token string) pair of ``get_vocab()`` (added and special tokens included), sorted by id. Stable across
    processes and library versions that keep the vocabulary; ~tens of ms for a 150k vocabulary."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(f"{len(tokenizer)}\n".encode())
    digest.update("\n".join(f"{i}\t{t}" for t, i in sorted(vocab.items(), key=lambda item: item[1])).encode())
    return "sha256:" + digest.hexdigest()[:16]
