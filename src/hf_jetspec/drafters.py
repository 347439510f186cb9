"""Drafters: what proposes the per-depth distributions a draft tree is built from.

A drafter has ``block_size`` (it drafts depths 1 .. block_size - 1 below the anchor), ``layer_ids`` (target layers
whose hidden states it reads; empty for none) and owns its state:

- ``start()``: reset before a new sequence;
- ``observe(features, visited)``: the target's tapped states of its latest forward (``features [n, F]``, None when
  no layers are tapped) and which of those positions were committed (``visited``: node indices of a verified tree;
  None: all of them, the prompt after prefill: the positions the prefill ran, which leave out the tokens a filled
  cache held when generation continues from one);
- ``propose(ids, depth) -> logits [min(depth, block_size - 1), V]``: ``ids [1, L + 1]`` is the committed sequence
  (its last token is the anchor, not yet in the target's cache), ``depth`` the deepest level the tree can use this
  step (it may be 0: the drafter still takes in what it observed).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .devices import execution_device, same_device
from .head import HeadContext, JetSpecHead


class Drafter(Protocol):
    block_size: int
    layer_ids: list[int]

    def start(self) -> None: ...

    def observe(self, features: torch.Tensor | None, visited: list[int] | None) -> None: ...

    def propose(self, ids: torch.Tensor, depth: int) -> torch.Tensor: ...


class HeadDrafter:
    """Drafts with a `JetSpecHead` over the target's embeddings and LM head."""

    def __init__(self, head: JetSpecHead, target) -> None:
        if not isinstance(head, JetSpecHead):
            raise TypeError(f"draft_head must be a JetSpecHead, got {type(head).__name__}")
        head.check_target(target)
        self.head = head_on_target_device(head, target).eval()
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        if head.config.draft_vocab is not None:
            self.lm_head = DraftVocabProjection(self.lm_head, head.config.draft_vocab, dtype=head.fc.weight.dtype)
        self.block_size = head.config.block_size
        self.layer_ids = list(head.config.target_layer_ids)
        self.start()

    def start(self) -> None:
        self.context = HeadContext()
        self.pending: list[torch.Tensor] = []  # committed positions' features not yet in the head's context
        # Leading positions without features: the tokens a filled cache held when the call began (a conversation's
        # earlier turns, never run by this call); the head's context starts after them. Set by the first proposal.
        self.uncovered: int | None = None

    def observe(self, features: torch.Tensor | None, visited: list[int] | None) -> None:
        self.pending.append(features if visited is None else features[visited])

    def propose(self, ids: torch.Tensor, depth: int) -> torch.Tensor:
        new = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)
        if self.uncovered is None:
            self.uncovered = ids.shape[1] - 1 - new.shape[0]
        if self.uncovered < 0 or self.uncovered + self.context.length + new.shape[0] != ids.shape[1] - 1:
            raise RuntimeError(
                f"Head context out of sync: {self.uncovered} uncovered + {self.context.length} + {new.shape[0]} "
                f"features for {ids.shape[1] - 1} committed positions"
            )
        self.pending = []
        return self.head.draft(self.context, new, int(ids[0, -1]), self.embed, self.lm_head, depth)


def head_on_target_device(head: JetSpecHead, target) -> JetSpecHead:
    """``head``, moved (in place, as ``head.to`` does) to the device the target computes on when it is elsewhere:
    it drafts with the target's embeddings and LM head, so ``JetSpecHead.from_pretrained(...)`` (on the CPU) serves
    a GPU target as given. A head never loaded (``meta``) is refused."""
    device, where = head.fc.weight.device, execution_device(target)
    if device.type == "meta":
        raise ValueError("The draft head's weights are on the meta device (built under `torch.device('meta')` or "
                         "`init_empty_weights`, never loaded): load it with JetSpecHead.from_pretrained(...)")
    return head if same_device(device, where) else head.to(where)


class DraftVocabProjection:
    """The target's LM head restricted to a draft vocabulary: hidden ``[n, H]`` -> logits ``[n, V]``, ``-inf``
    outside the ``ids`` (so the draft distribution is renormalised over them). The rows of the LM-head weight are
    gathered once per decoding call (cast to ``dtype``, default the weight's: the head's compute dtype); a round then
    reads ``len(ids) / V`` of the weight."""

    def __init__(self, lm_head: torch.nn.Module, ids: list[int], dtype: torch.dtype | None = None) -> None:
        weight = lm_head.weight.detach()
        dtype = dtype or weight.dtype
        self.ids = torch.tensor(ids, dtype=torch.long, device=weight.device)
        self.weight = weight.index_select(0, self.ids).to(dtype)
        bias = getattr(lm_head, "bias", None)
        self.bias = None if bias is None else bias.detach().index_select(0, self.ids).to(dtype)
        self.vocab_size = weight.shape[0]

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight, self.bias)
        out = sub.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, sub)


class OracleDrafter:
    """Test double and benchmark upper bound: drafts a known continuation (e.g. the target's own greedy output).

    ``reference [T]`` is a full token sequence (prompt + continuation); at committed length L it proposes
    ``reference[L : L + block_size - 1]`` with near-certain confidence (other tokens get log-odds -30).
    """

    def __init__(self, reference: torch.Tensor, vocab_size: int, block_size: int = 16) -> None:
        self.reference = reference.reshape(-1)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.layer_ids: list[int] = []

    def start(self) -> None:
        pass

    def observe(self, features: torch.Tensor | None, visited: list[int] | None) -> None:
        pass

    def propose(self, ids: torch.Tensor, depth: int) -> torch.Tensor:
        depth = max(0, min(depth, self.block_size - 1))
        start = ids.shape[1]
        future = self.reference[start : start + depth].to(ids.device)
        logits = torch.zeros(depth, self.vocab_size, device=ids.device)
        logits[: len(future)] = -30.0
        logits[torch.arange(len(future), device=ids.device), future] = 0.0
        return logits


class ScrambledOracleDrafter(OracleDrafter):
    """A test double that knows the continuation but ranks it unreliably, so accepted lengths vary from 1 to the
    whole block and accepted paths often leave the first branch (exercising tree verification and cache compaction).

    At each depth the true token is ranked first with probability ``p_first``, second with ``p_second``, else it
    keeps a random logit. The scramble depends only on (``seed``, committed length, depth): runs are reproducible.
    ``propose`` returns ``logits [min(depth, block_size - 1), vocab_size]`` on the CPU.
    """

    def __init__(self, reference: torch.Tensor, vocab_size: int, block_size: int = 16, seed: int = 0,
                 p_first: float = 0.6, p_second: float = 0.25) -> None:
        super().__init__(reference, vocab_size, block_size)
        self.seed, self.p_first, self.p_second = seed, p_first, p_second

    def propose(self, ids: torch.Tensor, depth: int) -> torch.Tensor:
        start, depth = ids.shape[1], max(0, min(depth, self.block_size - 1))
        gen = torch.Generator().manual_seed(self.seed * 100_003 + start)
        logits = torch.randn(depth, self.vocab_size, generator=gen) * 2
        u = torch.rand(depth, generator=gen)
        for d, token in enumerate(self.reference[start : start + depth].tolist()):
            top2 = logits[d].topk(2).values
            if u[d] < self.p_first:
                logits[d, token] = top2[0] + 1.0
            elif u[d] < self.p_first + self.p_second:
                logits[d, token] = (top2[0] + top2[1]) / 2
        return logits
