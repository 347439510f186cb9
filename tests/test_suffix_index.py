"""Suffix indexes (retrieval drafting): both indexes against brute-force search, tries, merging, datastore files."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_jetspec.candidates import PAD, Candidates, merge_candidates, trie_from_rows
from hf_jetspec.suffix_index import (
    DATASTORE_FILE,
    ContextIndex,
    CorpusIndex,
    suffix_array_numpy,
    tokenizer_fingerprint,
)

try:
    import pydivsufsort  # noqa: F401

    BACKENDS = ["numpy", "divsufsort"]
except ImportError:
    BACKENDS = ["numpy", pytest.param("divsufsort", marks=pytest.mark.skip(reason="pydivsufsort not installed"))]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VOCAB = 5  # a tiny vocabulary: many repeats, long matches, branching continuations

docs_strategy = st.lists(st.lists(st.integers(0, VOCAB - 1), max_size=25), max_size=6)
context_strategy = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12)


# ---- brute force --------------------------------------------------------------------------------------------------


def prefix_counts(rows: list[list[int]]) -> dict[tuple[int, ...], int]:
    """{path: number of rows starting with it} for every non-empty prefix of every row, plus the root ()."""
    counts = Counter({(): len(rows)})
    for row in rows:
        for d in range(1, len(row) + 1):
            counts[tuple(row[:d])] += 1
    return dict(counts)


def brute_corpus(docs, context, max_match, depth):
    """(L, continuation rows of all occurrences) of the longest context suffix occurring with a following token."""
    ctx = list(context)[-max_match:]
    for length in range(len(ctx), 0, -1):
        query = ctx[-length:]
        rows = [doc[i + length : i + length + depth] for doc in docs for i in range(len(doc) - length)
                if doc[i : i + length] == query]
        if rows:
            return length, rows
    return 0, []


def brute_context(text, max_match, depth, max_occurrences):
    """(L, rows of the most recent max_occurrences earlier occurrences, total) for a growing text."""
    n = len(text)
    for length in range(min(max_match, n - 1), 0, -1):
        query = text[n - length :]
        ends = [j for j in range(length - 1, n - 1) if text[j - length + 1 : j + 1] == query]
        if ends:
            return length, [text[j + 1 : j + 1 + depth] for j in ends[-max_occurrences:]], len(ends)
    return 0, [], 0


def check_trie(cands: Candidates) -> None:
    """Structural invariants: root, topological depth-major order, consistent depths, unique children."""
    assert cands.parents[0] == -1 and cands.depths[0] == 0
    assert (cands.parents[1:] < np.arange(1, len(cands))).all()
    assert (cands.depths[1:] == cands.depths[cands.parents[1:]] + 1).all()
    assert (np.diff(cands.depths) >= 0).all()
    children = list(zip(cands.parents.tolist(), cands.tokens.tolist()))[1:]
    assert len(set(children)) == len(children)


# ---- CorpusIndex ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(docs=docs_strategy, context=context_strategy, max_match=st.integers(1, 6), depth=st.integers(1, 5))
def test_corpus_lookup_matches_brute_force(backend, docs, context, max_match, depth):
    index = CorpusIndex.build(docs, vocab_size=VOCAB, max_match=max_match, backend=backend)
    length, rows = brute_corpus(docs, context, max_match, depth)
    cands = index.lookup(context, max_depth=depth, max_occurrences=10_000)
    if length == 0:
        assert cands is None
        return
    check_trie(cands)
    assert (cands.source, cands.match_len, cands.total) == ("corpus", length, len(rows))
    assert cands.tokens[0] == context[-1]
    assert cands.paths("corpus") == prefix_counts(rows)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(docs=docs_strategy, context=context_strategy, max_match=st.integers(1, 6), depth=st.integers(1, 5),
       cap=st.integers(1, 6))
def test_corpus_capping_keeps_proportions(backend, docs, context, max_match, depth, cap):
    index = CorpusIndex.build(docs, vocab_size=VOCAB, max_match=max_match, backend=backend)
    length, rows = brute_corpus(docs, context, max_match, depth)
    cands = index.lookup(context, max_depth=depth, max_occurrences=cap)
    if length == 0:
        assert cands is None
        return
    check_trie(cands)
    assert cands.total == len(rows) and cands.count[0] == min(cap, len(rows))
    full = prefix_counts(rows)
    used = cands.count[0]
    # The suffix-array range is sorted by continuation (at least to max_match + 1 tokens from the match start), so
    # each path is a contiguous block and evenly spaced picks give it within one of its proportional share.
    sorted_depth = depth if backend == "divsufsort" else max_match + 1 - length
    got = cands.paths("corpus")
    for path, count in full.items():
        if len(path) <= sorted_depth:
            assert abs(got.get(path, 0) - count * used / len(rows)) < 1, path
    assert set(got) <= set(full)


@SETTINGS
@given(docs=docs_strategy, context=context_strategy, depth=st.integers(1, 5))
def test_corpus_continuations_stop_at_document_ends(docs, context, depth):
    index = CorpusIndex.build(docs, vocab_size=VOCAB, max_match=4)
    cands = index.lookup(context, max_depth=depth, max_occurrences=10_000)
    if cands is None:
        return
    # every root path is a substring of one document, right after the matched suffix
    suffix = list(context[-cands.match_len :])
    for path in cands.paths("corpus"):
        whole = suffix + list(path)
        assert any(doc[i : i + len(whole)] == whole for doc in docs for i in range(len(doc))), whole


def test_corpus_hand_made():
    docs = [[1, 2, 3, 4], [9, 2, 3, 5, 6], [2, 3], [7, 2, 3, 4, 8]]
    index = CorpusIndex.build(docs, vocab_size=10, max_match=8)
    cands = index.lookup([0, 2, 3], max_depth=3)
    assert (cands.match_len, cands.total) == (2, 3)  # "2 3" at the end of document 2 has no following token
    assert cands.paths("corpus") == {(): 3, (4,): 2, (4, 8): 1, (5,): 1, (5, 6): 1}
    assert index.lookup([9, 2, 3], max_depth=5).paths("corpus") == {(): 1, (5,): 1, (5, 6): 1}
    assert index.lookup([6], max_depth=2) is None  # 6 ends its document
    assert index.lookup([0], max_depth=2) is None and index.lookup([3, 11], max_depth=2) is None  # 11: out of vocab
    assert index.lookup([4, 8, 11, 2], max_depth=1).match_len == 1  # matching stops at the out-of-vocab id
    assert index.lookup([2, 3], max_depth=3, min_match=3) is None
    fractions = cands.fractions()[0]
    assert fractions[0] == 1 and sorted(fractions[cands.depths == 1].tolist()) == [1 / 3, 2 / 3]
    assert index.num_documents == 4 and index.num_tokens == 16 and index.document(1).tolist() == docs[1]
    import torch

    for context in (torch.tensor([[0, 2, 3]]), np.array([0, 2, 3]), (0, 2, 3)):  # a [1, n] batch row too
        assert index.lookup(context, max_depth=3).paths() == cands.paths()


@pytest.mark.parametrize("docs", [[], [[]], [[], []]])
def test_empty_corpus_returns_none(docs):
    index = CorpusIndex.build(docs, vocab_size=10)
    assert index.lookup([1, 2], max_depth=4) is None and index.num_tokens == 0


def test_suffix_array_numpy_sorts_by_prefix():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 3, 300).astype(np.uint16)
    for depth, span in ((1, 1), (3, 4), (8, 8), (9, 16), (400, 512)):  # prefix doubling sorts 2**k >= depth tokens
        order = suffix_array_numpy(tokens, depth)
        keys = [tuple(tokens[p : p + span].tolist()) for p in range(tokens.size)]
        assert order.tolist() == sorted(range(tokens.size), key=lambda p: (keys[p], p))


def test_large_vocab_uses_uint32():
    index = CorpusIndex.build([[70_000, 5, 70_001], [5, 70_000]], vocab_size=100_000)
    assert index.tokens.dtype == np.uint32
    assert index.lookup([1, 5], max_depth=2).paths("corpus") == {(): 2, (70_000,): 1, (70_001,): 1}


def test_build_rejects_out_of_vocab_ids():
    with pytest.raises(ValueError, match="outside"):
        CorpusIndex.build([[1, 2, 10]], vocab_size=10)


# ---- ContextIndex -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dense", [0, 16, 10**9])  # never / sometimes / always compare whole shifted slices
@SETTINGS
@given(text=st.lists(st.integers(0, VOCAB - 1), max_size=60), max_match=st.integers(1, 12), depth=st.integers(1, 6),
       cap=st.integers(1, 8))
def test_context_lookup_matches_brute_force(dense, text, max_match, depth, cap):
    index = ContextIndex(text, max_match=max_match)
    index.DENSE = dense
    length, rows, total = brute_context(text, max_match, depth, cap)
    cands = index.lookup(max_depth=depth, max_occurrences=cap)
    if length == 0:
        assert cands is None
        return
    check_trie(cands)
    assert (cands.source, cands.match_len, cands.total, cands.tokens[0]) == ("context", length, total, text[-1])
    assert cands.paths("context") == prefix_counts(rows)


@SETTINGS
@given(text=st.lists(st.integers(0, VOCAB - 1), max_size=300), cuts=st.lists(st.integers(0, 300), max_size=8))
def test_context_incremental_extend_equals_scratch(text, cuts):
    incremental = ContextIndex(max_match=6)
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        incremental.extend(text[start:stop])
        scratch = ContextIndex(text[:stop], max_match=6)
        assert incremental.tokens.tolist() == text[:stop]
        got, want = incremental.lookup(max_depth=4, max_occurrences=3), scratch.lookup(max_depth=4, max_occurrences=3)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.paths() == want.paths() and got.totals == want.totals and got.match_lens == want.match_lens


def test_context_prefers_recent_and_stops_at_the_end():
    index = ContextIndex([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2], max_match=4)
    cands = index.lookup(max_depth=3, max_occurrences=2)
    assert (cands.match_len, cands.total) == (2, 3)
    assert cands.paths("context") == {(): 2, (4,): 1, (4, 1): 1, (4, 1, 2): 1, (5,): 1, (5, 1): 1, (5, 1, 2): 1}
    periodic = ContextIndex([7, 7, 7, 7], max_match=8).lookup(max_depth=5)
    assert periodic.match_len == 3 and periodic.paths("context") == {(): 1, (7,): 1}  # not past the current end
    index.extend(np.array([9]))
    assert index.lookup(max_depth=2) is None
    assert ContextIndex([5]).lookup(max_depth=2) is None and ContextIndex().lookup(max_depth=2) is None


def test_context_accepts_torch_tensors():
    import torch

    index = ContextIndex(torch.tensor([[3, 4, 5, 3]]))
    index.extend(torch.tensor([4]))
    assert index.lookup(max_depth=2).paths("context") == {(): 1, (5,): 1, (5, 3): 1}


# ---- tries and merging ------------------------------------------------------------------------------------------


def test_trie_from_rows_counts_prefixes():
    rows = np.array([[4, 5, 6], [4, 5, PAD], [4, 7, PAD], [8, PAD, PAD], [4, 5, 6]])
    cands = trie_from_rows(1, rows, "corpus", match_len=3, total=9)
    check_trie(cands)
    assert cands.paths("corpus") == {(): 5, (4,): 4, (4, 5): 3, (4, 5, 6): 2, (4, 7): 1, (8,): 1}
    assert (cands.match_len, cands.total, cands.max_depth) == (3, 9, 3)


@SETTINGS
@given(a_rows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=8),
       b_rows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=8))
def test_merge_keeps_per_source_counts(a_rows, b_rows):
    def trie(rows, source, match_len):
        width = max(len(r) for r in rows)
        padded = np.array([r + [PAD] * (width - len(r)) for r in rows])
        return trie_from_rows(9, padded, source, match_len, total=len(rows) + 1)

    a, b = trie(a_rows, "context", 2), trie(b_rows, "corpus", 5)
    merged = merge_candidates(a, b)
    check_trie(merged)
    assert merged.sources == ("context", "corpus") and merged.match_lens == (2, 5)
    assert merged.totals == (len(a_rows) + 1, len(b_rows) + 1)
    pa, pb = prefix_counts(a_rows), prefix_counts(b_rows)
    assert merged.paths() == {p: (pa.get(p, 0), pb.get(p, 0)) for p in set(pa) | set(pb)}
    assert merged.paths("corpus") == pb
    assert merge_candidates(None, a, None) is a and merge_candidates(None) is None
    with pytest.raises(ValueError, match="sources"):
        merged.match_len


def test_merge_refuses_different_anchors_and_same_source():
    a = trie_from_rows(1, np.array([[2, 3]]), "context", 1, 1)
    with pytest.raises(ValueError, match="anchors"):
        merge_candidates(a, trie_from_rows(2, np.array([[2, 3]]), "corpus", 1, 1))
    with pytest.raises(ValueError, match="same source"):
        merge_candidates(a, a)


def test_merged_context_and_corpus_lookups():
    corpus = CorpusIndex.build([[1, 2, 3, 4, 5], [2, 3, 6]], vocab_size=10)
    context = ContextIndex([2, 3, 4, 9, 2, 3])
    merged = merge_candidates(context.lookup(max_depth=2), corpus.lookup(context.tokens, max_depth=2))
    assert merged.paths() == {(): (1, 2), (4,): (1, 1), (4, 9): (1, 0), (4, 5): (0, 1), (6,): (0, 1)}
    assert merged.sources == ("context", "corpus") and merged.match_lens == (2, 2)


# ---- datastore files --------------------------------------------------------------------------------------------


class FakeTokenizer:
    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)


def fake_tokenizer(size: int = 10, rename: int | None = None) -> FakeTokenizer:
    return FakeTokenizer({(f"t{i}" if i != rename else "other"): i for i in range(size)})


@pytest.fixture
def corpus():
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 10, rng.integers(0, 40)).tolist() for _ in range(30)]
    return CorpusIndex.build(docs, vocab_size=10, tokenizer_fingerprint=tokenizer_fingerprint(fake_tokenizer()))


@pytest.mark.parametrize("name", ["", "store.safetensors"])
def test_save_load_round_trip(corpus, tmp_path, name):
    file = corpus.save(tmp_path / name if name else tmp_path)
    assert file.name == (name or DATASTORE_FILE) and file.is_file()
    loaded = CorpusIndex.load(file.parent if not name else file, tokenizer=fake_tokenizer())
    for field in ("tokens", "suffix_array", "doc_offsets"):
        assert np.array_equal(getattr(loaded, field), getattr(corpus, field))
        assert getattr(loaded, field).dtype == getattr(corpus, field).dtype
    assert (loaded.vocab_size, loaded.max_match, loaded.tokenizer_fingerprint) == (10, 32, corpus.tokenizer_fingerprint)
    rng = np.random.default_rng(2)
    for _ in range(20):
        context = rng.integers(0, 10, 6)
        a, b = (index.lookup(context, max_depth=4, max_occurrences=5) for index in (corpus, loaded))
        assert (a is None and b is None) or (a.paths() == b.paths() and a.totals == b.totals)


def test_copies_and_pickles_find_the_same_matches(corpus):
    """A head carries its datastore: ``copy.deepcopy(head)`` and pickling (torch.save, multiprocessing) must work
    and the copy must look up what the original does (its bytes view and memoryview are rebuilt, not copied)."""
    import copy
    import pickle

    rng = np.random.default_rng(3)
    for clone in (copy.deepcopy(corpus), pickle.loads(pickle.dumps(corpus)), copy.copy(corpus)):
        assert clone._sa_view.obj is not None and clone.num_tokens == corpus.num_tokens
        for _ in range(20):
            context = rng.integers(0, 10, 6)
            a, b = (index.lookup(context, max_depth=4, max_occurrences=5) for index in (corpus, clone))
            assert (a is None and b is None) or (a.paths() == b.paths() and a.totals == b.totals)


def test_save_without_suffix_array_rebuilds_it(corpus, tmp_path):
    full = corpus.save(tmp_path / "full.safetensors")
    small = corpus.save(tmp_path / "small.safetensors", suffix_array=False)
    assert small.stat().st_size < full.stat().st_size / 2
    loaded = CorpusIndex.load(small, tokenizer=fake_tokenizer())
    assert np.array_equal(loaded.suffix_array, corpus.suffix_array) and loaded.suffix_array.dtype == np.uint32
    context = corpus.document(3)[:5]
    assert loaded.lookup(context, max_depth=4).paths() == corpus.lookup(context, max_depth=4).paths()


def test_fingerprint_is_stable_and_mismatch_is_refused(corpus, tmp_path):
    file = corpus.save(tmp_path)
    assert tokenizer_fingerprint(fake_tokenizer()) == tokenizer_fingerprint(fake_tokenizer())
    assert tokenizer_fingerprint(fake_tokenizer()).startswith("sha256:")
    for other in (fake_tokenizer(rename=3), fake_tokenizer(size=11)):
        message = r"built for tokenizer sha256:\w+, not this tokenizer \(sha256:\w+\)"
        with pytest.raises(ValueError, match=message) as info:
            CorpusIndex.load(file, tokenizer=other)
        assert str(file) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="vocab size 10, not 12"):
        CorpusIndex.load(file, tokenizer=12)
    CorpusIndex.load(file).check(10)


def test_fingerprint_of_a_real_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    def make(vocab):
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                       unk_token="<unk>")

    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    assert tokenizer_fingerprint(make(vocab)) == tokenizer_fingerprint(make(dict(vocab)))
    assert tokenizer_fingerprint(make(vocab)) != tokenizer_fingerprint(make({**vocab, "c": 2, "b": 3}))


def test_corrupt_files_are_refused(corpus, tmp_path):
    file = corpus.save(tmp_path)
    data = file.read_bytes()
    with pytest.raises(FileNotFoundError, match="no datastore file"):
        CorpusIndex.load(tmp_path / "missing")
    for broken in (data[: len(data) // 2], data[:5], b"not a safetensors file at all", b""):
        file.write_bytes(broken)
        with pytest.raises(ValueError, match=str(file)):
            CorpusIndex.load(file)
    from safetensors.numpy import save_file

    tokens, sa, offsets = corpus.tokens, corpus.suffix_array, corpus.doc_offsets
    meta = {"format": "hf_jetspec.suffix_index", "format_version": "1", "vocab_size": "10", "max_match": "32"}
    cases = {
        "format": ({"tokens": tokens, "suffix_array": sa, "doc_offsets": offsets}, {**meta, "format": "other"}),
        "version": ({"tokens": tokens, "suffix_array": sa, "doc_offsets": offsets}, {**meta, "format_version": "9"}),
        "max_match": ({"tokens": tokens, "suffix_array": sa, "doc_offsets": offsets}, {**meta, "max_match": "0"}),
        "no array": ({"tokens": tokens, "suffix_array": sa, "doc_offsets": offsets}, {**meta, "suffix_array": "x"}),
        "rebuild offsets": ({"tokens": tokens, "doc_offsets": offsets[:-1].copy()},
                            {**meta, "suffix_array": "rebuild"}),
        "missing": ({"tokens": tokens, "doc_offsets": offsets}, meta),
        "not sorted": ({"tokens": tokens, "suffix_array": sa[::-1].copy(), "doc_offsets": offsets}, meta),
        "separators": ({"tokens": np.where(tokens == 65535, 1, tokens).astype(np.uint16), "suffix_array": sa,
                        "doc_offsets": offsets}, meta),
        "vocab": ({"tokens": tokens, "suffix_array": sa, "doc_offsets": offsets}, {**meta, "vocab_size": "5"}),
    }
    for reason, (tensors, metadata) in cases.items():
        save_file(tensors, str(file), metadata=metadata)
        with pytest.raises(ValueError, match="not a valid hf_jetspec datastore"):
            CorpusIndex.load(file)


def test_auto_backend_falls_back_to_numpy(monkeypatch):
    import hf_jetspec.suffix_index as module

    docs = [[1, 2, 1, 2, 3], [2, 1, 2, 4]]
    monkeypatch.setattr(module, "_divsufsort_available", lambda: False)
    auto = CorpusIndex.build(docs, vocab_size=5, max_match=3)
    plain = CorpusIndex.build(docs, vocab_size=5, max_match=3, backend="numpy")
    assert np.array_equal(auto.suffix_array, plain.suffix_array)
    with pytest.raises(ValueError, match="backend"):
        CorpusIndex.build(docs, vocab_size=5, backend="other")
