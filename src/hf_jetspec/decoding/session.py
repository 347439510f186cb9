"""`DecodingSession`: one ``generate()`` call of a speculative loop (batch size 1), shared by every strategy.

It owns the target's side of a step: call validation, prefill, the KV cache, token selection and emission
(`TokenSelector`, `TokenWriter`), the tapped hidden states, timing and statistics. A loop only decides WHAT to
verify; every loop reads the same::

    with DecodingSession(model, input_ids, ..., layer_ids=drafter.layer_ids) as session:
        session.prefill()                                        # prompt -> first token
        while not session.finished:
            tree = ...                                           # propose: a DraftTree rooted at the anchor
            logits = session.verify(tree)                        # one target forward over the tree  [N, V]
            visited = accept_walk(tree, logits, session.selector, session.writer)   # emits tokens
            session.commit(visited)                              # keep the accepted path's KV
        return session.finish()

Invariant between steps: the cache holds every committed token but the last (the **anchor**, root of the next
tree), so the cached prefix is ``writer.length - 1``; it is derived, never tracked.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ..attention import plan_tree_attention
from ..cache import cache_kwarg, keep_positions, room_left
from ..config import cross_attention_layers
from ..features import FeatureTap
from ..outputs import DecodingStats, Timer
from ..rope import position_offset, positions_left, rope_switch
from ..tokens import TokenSelector, TokenWriter, remaining_tokens
from ..tree import DraftTree
from ..verify import verify_tree
from .common import prefill, token_row_inputs, validate_call


class DecodingSession:
    """The state of one decoding call. Arguments are what ``generate()`` hands a ``custom_generate`` callable, plus
    ``token_streamer`` / ``generator`` / ``tree_kernel`` (see the loops) and ``layer_ids``: target layers whose
    hidden states `features` exposes after every forward (empty: none)."""

    def __init__(self, model, input_ids: torch.Tensor, logits_processor, stopping_criteria, generation_config,
                 synced_gpus: bool, streamer, model_kwargs: dict, *, token_streamer=None,
                 generator: torch.Generator | None = None, tree_kernel: bool | None = None,
                 layer_ids: list[int] = ()) -> None:
        self.cache = validate_call(model, input_ids, generation_config, synced_gpus, model_kwargs)
        self.model, self.model_kwargs, self.generation_config = model, model_kwargs, generation_config
        self.plan = plan_tree_attention(model, tree_kernel)
        self.cache_key = cache_kwarg(model)
        self.selector = TokenSelector(logits_processor, generation_config, generator)
        self.writer = TokenWriter(input_ids, stopping_criteria, generation_config, streamer, token_streamer)
        self.timer, self.stats = Timer(input_ids.device), DecodingStats()
        self.tap = FeatureTap(model, layer_ids)
        self.rope = rope_switch(model)
        self.position_offset: torch.Tensor | None = None  # multimodal RoPE after an image (`rope.position_offset`)
        self.row_inputs = None  # per-token inputs every new token repeats (`common.TokenRows`)
        self.fixed_layers = cross_attention_layers(model)  # cache layers holding an image, not the sequence
        self.features: torch.Tensor | None = None  # [n, F]: tapped states of the latest forward's positions
        self._start = 0.0
        self._verified_prefix: int | None = None
        self._refill: tuple[int, dict | None] | None = None  # (prefix, inputs) of `_refill_inputs`

    def __enter__(self) -> "DecodingSession":
        self.tap.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.tap.__exit__(*exc)

    # ------------------------------------------------------------------------------------------------ state

    @property
    def ids(self) -> torch.Tensor:
        """The committed sequence ``[1, L]`` (its last token is the anchor)."""
        return self.writer.ids

    @property
    def finished(self) -> bool:
        return self.writer.finished

    @property
    def prefix(self) -> int:
        """Cached positions: every committed token but the anchor."""
        return self.writer.length - 1

    @property
    def anchor(self) -> int:
        return int(self.writer.ids[0, -1])

    def node_room(self, wanted: int) -> int:
        """How many of ``wanted`` tree nodes (root included) the next step may verify: a StaticCache must hold them
        all; a DynamicCache takes any number."""
        room = room_left(self.cache, self.prefix)
        if room is not None and room < 1:  # plain generate() fails here too, inside the cache (an IndexError)
            raise ValueError(f"The StaticCache is full ({self.prefix} positions) and generation has not finished: "
                             "pass a longer one (max_cache_len), a DynamicCache, or fewer max_new_tokens.")
        return wanted if room is None else max(1, min(wanted, room))

    def max_depth(self) -> int:
        """The deepest draft worth verifying: a step commits at most depth + 1 tokens (``max_length`` bounds them),
        and a chain that deep must fit the cache."""
        left = remaining_tokens(self.writer, self.generation_config) - 1
        depth = max(0, min(left, self.node_room(left + 1) - 1))
        rope_left = positions_left(self.rope, self.prefix)  # a forward must not straddle a RoPE switch
        if rope_left is not None:
            depth = min(depth, rope_left)
        return 0 if self._refill_inputs() is not None else depth

    @contextmanager
    def drafting(self):
        """Time a drafter's work (``stats.draft_time``)."""
        start = self.timer.now()
        try:
            yield
        finally:
            self.stats.draft_time += self.timer.now() - start

    # ------------------------------------------------------------------------------------------------ steps

    def prefill(self) -> None:
        """Run the prompt exactly as ``generate()`` does (in chunks with ``prefill_chunk_size``) and emit the first
        token; `features` then holds the prompt's tapped states ``[T, F]`` (continuing from a filled cache of P
        tokens: the rest's, ``[T - P, F]``)."""
        self._start = self.timer.now()
        parts = []  # each prefill forward's tapped states (several with a chunked prefill)
        logits, positions = prefill(self.model, self.ids, self.model_kwargs,
                                    getattr(self.generation_config, "prefill_chunk_size", None),
                                    after_forward=lambda: parts.append(self._tapped()))
        self.position_offset = position_offset(self.model, self.ids.shape[1], positions)
        self.row_inputs = token_row_inputs(self.model_kwargs)
        self.features = None if parts[-1] is None else parts[0] if len(parts) == 1 else torch.cat(parts)
        self.stats.prefill_time = self.timer.now() - self._start
        scores = self.selector.scores(self.ids, logits)
        self.writer.emit(self.selector.choose(scores), scores, logits)
        self.writer.flush()

    def verify(self, tree: DraftTree) -> torch.Tensor:
        """One target forward over ``tree`` (rooted at the anchor) on top of the cached prefix; returns the target's
        raw logits at every node ``[N, V]``. `features` then holds the nodes' tapped states ``[N, F]``."""
        start = self.timer.now()
        self._verified_prefix = self.prefix
        refill = self._refill_inputs()
        if refill is not None:  # at a longrope switch generate() recomputes the whole sequence: so do we
            if len(tree) != 1:
                raise ValueError("At a RoPE switch the step verifies the anchor alone (session.max_depth() is 0).")
            keep_positions(self.cache, 0, [], self.fixed_layers)
            logits = self.model(**{**refill, self.cache_key: self.cache}, return_dict=True).logits[0, -1:]
            self.features = None if (tapped := self._tapped()) is None else tapped[-1:]
        else:
            logits = verify_tree(self.model, tree, self.cache, self._verified_prefix, self.plan, self.cache_key,
                                 self.position_offset, self.row_inputs)
            self.features = self._tapped()
        self.stats.target_time += self.timer.now() - start
        return logits

    def commit(self, visited: list[int]) -> None:
        """After an acceptance rule emitted this step's tokens: keep the KV of the ``visited`` nodes (root first, a
        root-to-node path) and drop the rest of the tree; stream the step's tokens and record its length."""
        keep_positions(self.cache, self._verified_prefix, visited, self.fixed_layers)
        self.stats.accept_lengths.append(self.writer.length - 1 - self._verified_prefix)
        self._verified_prefix = None
        self.writer.flush()

    def finish(self):
        """The ``generate()`` result: sequences, or a `JetSpecGenerateOutput` with ``stats``."""
        self.stats.total_time = self.timer.now() - self._start
        return self.writer.result(self.generation_config, self.cache, self.stats)

    def _refill_inputs(self) -> dict | None:
        """At a longrope switch (the anchor at ``original_max_position_embeddings``, the cache holding the positions
        before it), the inputs ``generate()`` runs when the model's ``prepare_inputs_for_generation`` drops the
        cache there (Phi-3 does: the whole sequence again, now with the long factors); else None."""
        if self.rope is None or self.rope.per_position or self.prefix != self.rope.position:
            return None
        if self._refill is None or self._refill[0] != self.prefix:
            keep = {k: self.model_kwargs[k] for k in ("logits_to_keep",) if k in self.model_kwargs}  # as prefill
            inputs = self.model.prepare_inputs_for_generation(self.ids, **{self.cache_key: self.cache}, use_cache=True,
                                                              **keep)
            dropped = inputs.get(self.cache_key, inputs.get("past_key_values")) is None
            self._refill = (self.prefix, inputs if dropped else None)
        return self._refill[1]

    def _tapped(self) -> torch.Tensor | None:
        features = self.tap.features()
        return None if features is None else features[0]
