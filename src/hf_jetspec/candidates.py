"""Candidates: the trie of continuations a retrieval lookup returns, and how tries from several sources merge.

A ``Candidates`` trie is rooted at the anchor (the context's last token); its paths are what followed the matched
occurrences, with how many occurrences of each source support each node. ``trie_from_rows`` builds one from a
lookup's continuation rows, ``merge_candidates`` merges tries of different sources by token path (per-source counts
kept), so a tree builder can score every node by source, match length, count / parent count and depth. The suffix
indexes that produce tries are in `hf_jetspec.suffix_index`.

Arrays are numpy int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = -1  # continuation rows: no token (past the current end or a document end)


@dataclass
class Candidates:
    """A trie of continuations of the context, in depth-major topological order (parents before children).

    tokens / parents / depths: int64 ``[N]``. Node 0 is the root: the anchor (the context's last token, already
    committed), parent -1, depth 0; node i stands for the token path root -> i.
    counts: int64 ``[S, N]``: how many occurrences of source s support the path root -> node (0 where source s
    did not propose it). The root's count is the number of occurrences the source used (after capping).
    sources / match_lens / totals: one entry per source s: its name ("context" or "corpus"), the length of the
    matched context suffix, and how many occurrences of that suffix the index held before capping.
    A single lookup gives S = 1 (then ``source`` / ``match_len`` / ``total`` / ``count`` read it directly);
    ``merge_candidates`` stacks sources.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    counts: np.ndarray
    sources: tuple[str, ...]
    match_lens: tuple[int, ...]
    totals: tuple[int, ...]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def _single(self, values: tuple):
        if len(self.sources) != 1:
            raise ValueError(f"these candidates merge {len(self.sources)} sources {self.sources}; index per source")
        return values[0]

    @property
    def source(self) -> str:
        return self._single(self.sources)

    @property
    def match_len(self) -> int:
        return self._single(self.match_lens)

    @property
    def total(self) -> int:
        return self._single(self.totals)

    @property
    def count(self) -> np.ndarray:
        """``[N]`` counts of the single source."""
        return self._single(tuple(self.counts))

    def fractions(self) -> np.ndarray:
        """Float64 ``[S, N]``: count / parent's count per source (the empirical probability of each node's token
        after its parent's path; root 1, 0 where the source did not propose the node)."""
        counts = self.counts.astype(np.float64)
        parent_counts = counts[:, np.maximum(self.parents, 0)]
        out = np.divide(counts, parent_counts, out=np.zeros_like(counts), where=parent_counts > 0)
        out[:, 0] = 1.0
        return out

    def paths(self, source: str | None = None) -> dict[tuple[int, ...], object]:
        """``{token path below the root: counts}`` (root: ``()``). With ``source``: that source's count (int) for
        the nodes it proposed; without: a tuple of per-source counts for every node."""
        parents, tokens = self.parents.tolist(), self.tokens.tolist()
        keys: list[tuple[int, ...]] = [()]
        for node in range(1, len(self)):  # parents come first
            keys.append(keys[parents[node]] + (tokens[node],))
        if source is None:
            return {key: tuple(int(c) for c in self.counts[:, node]) for node, key in enumerate(keys)}
        row = self.counts[self.sources.index(source)].tolist()
        return {key: row[node] for node, key in enumerate(keys) if row[node] > 0}


def trie_from_rows(anchor: int, rows: np.ndarray, source: str, match_len: int, total: int) -> Candidates:
    """The trie of the continuation rows ``[k, D]`` (int64; each row one occurrence's following tokens, PAD
    after its end), rooted at ``anchor``. Vectorised: one lexsort, then the nodes are the positions where a sorted
    row first differs from the previous one (per depth); counts are the run lengths."""
    k, depth = rows.shape
    if k == 0 or depth == 0:
        return Candidates(*(np.array(v, np.int64) for v in ([anchor], [-1], [0], [[k]])), (source,), (match_len,),
                          (total,))
    rows = rows[np.lexsort(rows.T[::-1])]
    valid = rows != PAD  # a prefix of each row
    new = np.ones((k, depth), dtype=bool)
    new[1:] = np.logical_or.accumulate(rows[1:] != rows[:-1], axis=1)  # [i, d]: row i starts a node at depth d+1
    new &= valid
    node_depth, node_row = np.nonzero(new.T)  # depth-major order = node order
    ids = np.zeros((depth, k), dtype=np.int64)
    ids[node_depth, node_row] = np.arange(1, node_row.size + 1)
    ids = np.maximum.accumulate(ids, axis=1).T  # [k, D]: the node holding row i at depth d+1 (valid cells)
    parents = np.zeros(node_row.size, dtype=np.int64)
    deeper = node_depth > 0
    parents[deeper] = ids[node_row[deeper], node_depth[deeper] - 1]
    counts = np.bincount(ids[valid], minlength=node_row.size + 1)
    counts[0] = k
    return Candidates(
        tokens=np.concatenate(([anchor], rows[node_row, node_depth])).astype(np.int64),
        parents=np.concatenate(([-1], parents)),
        depths=np.concatenate(([0], node_depth + 1)).astype(np.int64),
        counts=counts[None].astype(np.int64),
        sources=(source,),
        match_lens=(int(match_len),),
        totals=(int(total),),
    )


def merge_candidates(*tries: Candidates | None) -> Candidates | None:
    """Merge tries by token path (``None`` entries are skipped; all ``None`` gives ``None``). A path proposed by
    several sources is one node with each source's count in its row of ``counts``. The roots must carry the same
    anchor token and the sources must differ. Vectorised per depth level (np.unique over (parent, token) keys)."""
    present = [t for t in tries if t is not None]
    if not present:
        return None
    out = present[0]
    for other in present[1:]:
        out = _merge_two(out, other)
    return out


def _merge_two(a: Candidates, b: Candidates) -> Candidates:
    if int(a.tokens[0]) != int(b.tokens[0]):
        raise ValueError(f"cannot merge tries with different anchors {int(a.tokens[0])} and {int(b.tokens[0])}")
    if set(a.sources) & set(b.sources):
        raise ValueError(f"cannot merge tries of the same source: {a.sources} and {b.sources}")
    map_a, map_b = np.zeros(len(a), dtype=np.int64), np.zeros(len(b), dtype=np.int64)
    tokens, parents, depths = [a.tokens[:1]], [np.array([-1])], [np.array([0])]
    size, radix = 1, int(max(a.tokens.max(), b.tokens.max())) + 1
    for depth in range(1, max(a.max_depth, b.max_depth) + 1):
        in_a, in_b = np.flatnonzero(a.depths == depth), np.flatnonzero(b.depths == depth)
        keys = np.concatenate((map_a[a.parents[in_a]] * radix + a.tokens[in_a],
                               map_b[b.parents[in_b]] * radix + b.tokens[in_b]))
        unique, inverse = np.unique(keys, return_inverse=True)
        map_a[in_a], map_b[in_b] = size + inverse[: in_a.size], size + inverse[in_a.size :]
        tokens.append(unique % radix)
        parents.append(unique // radix)
        depths.append(np.full(unique.size, depth))
        size += unique.size
    counts = np.zeros((a.counts.shape[0] + b.counts.shape[0], size), dtype=np.int64)
    counts[: a.counts.shape[0], map_a] = a.counts
    counts[a.counts.shape[0] :, map_b] = b.counts
    return Candidates(
        tokens=np.concatenate(tokens).astype(np.int64),
        parents=np.concatenate(parents).astype(np.int64),
        depths=np.concatenate(depths).astype(np.int64),
        counts=counts,
        sources=a.sources + b.sources,
        match_lens=a.match_lens + b.match_lens,
        totals=a.totals + b.totals,
    )
