"""What a merged-tree loop learns within one decoding call: how deep the head need draft (`DraftDepth`), how far
the calibration's estimates are off on this text (`online_estimates`, `hf_jetspec.calibration.OnlineCalibration`),
both read from the verified trees (`reached_nodes`, `deepest_head_node`). Nothing here is timed: the trees stay a
function of the tokens, and only their size and order change, never the output (verification decides that).
"""

from __future__ import annotations

from collections import deque

from ..calibration import Calibration, OnlineCalibration
from ..tree import DraftTree


class DraftDepth:
    """How deep the head drafts for a merged tree: the deepest head node the recent trees took, plus ``margin``,
    doubled whenever a tree took a node at the limit itself (the limit was what stopped it); between ``least`` and
    ``most`` (the block). A merged tree stops where nodes no longer pay for their verification, usually a few
    levels deep, while the head's cost grows with the depth it decodes (its layers and the draft LM head run once
    per depth): on a CPU drafting 15 depths for a tree 3 deep is most of the head's time. A function of the
    trees, hence of the tokens: nothing is timed."""

    def __init__(self, most: int, least: int = 2, margin: int = 2, window: int = 8) -> None:
        self.most, self.least, self.margin = most, min(least, most), margin
        self.limit = most
        self.recent: deque[int] = deque(maxlen=window)

    def update(self, used: int) -> None:
        """After a merged tree whose deepest head node is ``used`` deep (`deepest_head_node`)."""
        self.recent.append(used)
        if used >= self.limit:
            self.limit = min(self.most, 2 * self.limit)
        else:
            self.limit = max(self.least, min(self.most, max(self.recent) + self.margin))


def online_estimates(calibration: Calibration, online: bool | None) -> "Calibration | OnlineCalibration":
    """The edge estimates a merged tree uses: ``calibration`` itself, or an `OnlineCalibration` over it adapting
    every model (``online=True``) or the models it did not fit (None)."""
    if online is not None and not isinstance(online, bool):
        raise ValueError(f"online_calibration= takes True, False or None, got {online!r}")
    kinds = ("head", "retrieval") if online else () if online is False else tuple(
        kind for kind in ("head", "retrieval") if not calibration.fitted_on.get(kind, 0))
    return OnlineCalibration(calibration, kinds) if kinds else calibration


def deepest_head_node(tree: DraftTree, records: list) -> int:
    """The depth of a merged tree's deepest node that the head proposed (0: none)."""
    depths = tree.depths.tolist()
    return max((depths[node] for node in range(1, len(tree)) if records[node][0] == "head"), default=0)


def reached_nodes(tree: DraftTree, records: list, visited: list[int]) -> list[tuple[str, list[float], bool]]:
    """The outcomes of one verified merged tree: ``(kind, features, accepted)`` for every node whose parent was
    accepted (the edges the target actually tested)."""
    reached, parents = set(visited), tree.parents.tolist()
    return [(*records[node], node in reached) for node in range(1, len(tree)) if parents[node] in reached]
