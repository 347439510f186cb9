"""Jacobi decoding: guess the next n tokens, check them all in one target forward, keep what converged.

Each iteration feeds ``[anchor ; g_1 .. g_n]`` (the last committed token and n guesses) in one causal forward.
Guess g_i is accepted while it equals the target's own choice after ``g_1 .. g_{i-1}`` (the prediction at the
preceding position of the same forward); the accepted guesses plus the first fresh prediction are committed, so
every iteration commits at least one token. The predictions after the accepted prefix become the next iteration's
guesses (shifted: the fixed-point iteration of Santilli et al. 2023), and the window is topped up with new slots
from an initialiser (``pad``, ``repeat-last``, ``random`` or ``ngram``: prompt-lookup style).

Optionally (``ngram_pool > 0``) n-grams harvested from the Jacobi trajectories (Lookahead decoding, Fu et al. 2024)
whose first token is the anchor are verified in the same forward, as extra branches of a token tree.

Exactness: tokens are chosen with `TokenSelector` and emitted with `TokenWriter` one position at a time, by the same
"choose, then match" walk as tree verification, so greedy decoding returns plain ``generate()``'s tokens and
sampling (``do_sample=True``) draws exactly from the target: each emitted token is a fresh choice from the processed
distribution given the emitted prefix; a guess only decides whether the next position's logits can be reused.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..acceptance import accept_walk
from ..limits import MAX_FORWARD_TOKENS, check_range, check_window_limits
from ..tree import DraftTree
from .rows import per_row
from .session import DecodingSession

INITIALISERS = ("pad", "repeat-last", "random", "ngram")
DEFAULT_WINDOW = 8
MAX_LOOKUP_NGRAM = 3


# ---------------------------------------------------------------------------------------------- new window slots


def lookup_continuation(context: torch.Tensor, count: int, max_ngram: int = MAX_LOOKUP_NGRAM) -> list[int]:
    """Prompt lookup: find the most recent earlier occurrence of the longest suffix (``max_ngram`` .. 1 tokens) of
    ``context [T]`` and return up to ``count`` tokens that followed it ([] when no suffix recurs)."""
    length = context.shape[0]
    for size in range(min(max_ngram, length - 1), 0, -1):
        windows = context[:-1].unfold(0, size, 1)  # [T - size, size]: every earlier n-gram with a successor
        hits = (windows == context[-size:]).all(dim=-1).nonzero()
        if len(hits):
            start = int(hits[-1]) + size
            return context[start : start + count].tolist()
    return []


def new_slots(init: str, context: torch.Tensor, count: int, pad_id: int, vocab: int, rng: torch.Generator) -> list[int]:
    """``count`` guesses for the window slots after ``context [T]`` (committed tokens + carried guesses)."""
    if count <= 0:
        return []
    last = int(context[-1])
    if init == "pad":
        return [pad_id] * count
    if init == "repeat-last":
        return [last] * count
    if init == "random":
        return torch.randint(vocab, (count,), generator=rng).tolist()
    found = lookup_continuation(context, count)
    return found + [found[-1] if found else last] * (count - len(found))


def pad_token(generation_config, model) -> int:
    text_config = model.config.get_text_config()  # multimodal configs keep the token ids on their text config
    for candidate in (generation_config.pad_token_id, generation_config.eos_token_id,
                      getattr(text_config, "pad_token_id", None)):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    return 0


# ------------------------------------------------------------------------------------------------ n-gram pool


class NgramPool:
    """Lookahead-style pool of n-grams keyed by their first token (at most ``per_key`` per key, most recent kept).

    n-grams come from Jacobi trajectories: the prediction for position s+1 made in a forward whose input at s was
    the previous forward's prediction for s extends the gram that ended at s (`harvest`).
    """

    def __init__(self, size: int, per_key: int = 8) -> None:
        if size < 2:
            raise ValueError(f"pool n-gram size must be >= 2, got {size}")
        self.size, self.per_key = size, per_key
        self.grams: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        self.partial: dict[int, tuple[int, ...]] = {}  # absolute position -> gram whose last token is predicted there

    def add(self, gram: tuple[int, ...]) -> None:
        bucket = self.grams.setdefault(gram[0], OrderedDict())
        bucket.pop(gram[1:], None)
        bucket[gram[1:]] = None
        if len(bucket) > self.per_key:
            bucket.popitem(last=False)

    def candidates(self, token: int, limit: int) -> list[list[int]]:
        """Up to ``limit`` continuations (``size - 1`` tokens) of ``token``, most recent first."""
        bucket = self.grams.get(token)
        return [list(g) for g in reversed(bucket)][:limit] if bucket else []

    def harvest(self, start: int, inputs: list[int], predictions: list[int]) -> None:
        """Record one forward along the Jacobi chain: ``inputs[i]`` sat at absolute position ``start + i`` and the
        target predicted ``predictions[i]`` for position ``start + i + 1``."""
        partial = {}
        for i, (token, predicted) in enumerate(zip(inputs, predictions)):
            base = self.partial.get(start + i)
            if base is None or base[-1] != token:
                base = (token,)
            gram = (base + (predicted,))[-self.size :]
            if len(gram) == self.size:
                self.add(gram)
            partial[start + i + 1] = gram
        self.partial = partial


# ------------------------------------------------------------------------------------------------ one iteration


def verify_guesses(session: DecodingSession, branches: list[list[int]]) -> tuple[list[int], list[int]]:
    """One target forward over ``[anchor ; branches]`` (branch 0: the Jacobi window; others: pool candidates),
    emitting the target's tokens along the longest matching path and committing it.

    Returns (the visited nodes, root first; the target's raw argmax prediction at each branch-0 node).
    """
    tree, chain = DraftTree.from_branches(session.anchor, branches, session.ids.device)
    logits = session.verify(tree)
    visited = accept_walk(tree, logits, session.selector, session.writer)
    session.commit(visited)
    return visited, logits[chain].argmax(dim=-1).tolist()


def fit_branches(branches: list[list[int]], max_nodes: int) -> list[list[int]]:
    """Branch 0 and as many further branches as fit ``max_nodes`` tree nodes (the root takes one)."""
    kept, used = [branches[0]], 1 + len(branches[0])
    for branch in branches[1:]:
        if used + len(branch) <= max_nodes:
            kept.append(branch)
            used += len(branch)
    return kept


def leading_matches(guesses: list[int], committed: list[int]) -> int:
    """How many leading guesses equal the committed tokens: the Jacobi slots that converged this iteration."""
    count = 0
    for guess, token in zip(guesses, committed):
        if guess != token:
            break
        count += 1
    return count


@per_row("Jacobi decoding verifies window= guesses per forward")
def jacobi_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    window: int = DEFAULT_WINDOW,
    init: str = "ngram",
    ngram_pool: int = 0,
    pool_ngram_size: int = 4,
    token_streamer=None,
    generator: torch.Generator | None = None,
    init_seed: int = 0,
    tree_kernel: bool | None = None,
    **model_kwargs,
):
    """Generate with KV-cached Jacobi decoding (greedy: identical tokens to plain ``generate()``; sampling: the
    same distribution, "sample, then match").

    Args (beyond ``generate()``'s own):
        window: guesses verified per forward (n; 0 = plain decoding).
        init: how new window slots are guessed: ``"pad"``, ``"repeat-last"``, ``"random"`` or ``"ngram"`` (the
            tokens that followed the latest earlier occurrence of the text's last 1-3 tokens).
        ngram_pool: pool n-grams (starting with the last token) also verified per forward (0 = plain Jacobi).
        pool_ngram_size: n-gram length of the pool (the anchor included).
        token_streamer: a streamer receiving tokens as they are committed (``generate()`` does not forward its own
            ``streamer=`` to ``custom_generate`` callables).
        generator: ``torch.Generator`` for reproducible sampling; init_seed: seed of the ``random`` initialiser.

    Returns the sequences ``[1, T]``, or a `JetSpecGenerateOutput` when ``return_dict_in_generate=True``, whose
    ``stats.extra`` holds ``iterations`` (target forwards after prefill), ``slot_accepts`` (how often window slot i
    was accepted) and ``pool_tokens`` (tokens accepted from pool branches).
    """
    if init not in INITIALISERS:
        raise ValueError(f"Unknown Jacobi init {init!r}; choose from {INITIALISERS}")
    check_range("window", window, minimum=0, maximum=MAX_FORWARD_TOKENS - 1)
    check_range("ngram_pool", ngram_pool, minimum=0, maximum=MAX_FORWARD_TOKENS - 1)
    check_window_limits(model, input_ids.shape[1], generation_config, window, ngram_pool, pool_ngram_size)
    pool = NgramPool(pool_ngram_size) if ngram_pool else None
    pad_id, vocab = pad_token(generation_config, model), model.get_output_embeddings().weight.shape[0]
    rng = torch.Generator().manual_seed(init_seed)
    slot_accepts, pool_tokens = [0] * window, 0

    with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, model_kwargs, token_streamer=token_streamer, generator=generator,
                         tree_kernel=tree_kernel) as session:
        session.prefill()
        guesses = new_slots(init, session.ids[0], window, pad_id, vocab, rng)
        while not session.finished:
            n = min(window, session.max_depth())
            branches = [guesses[:n]]
            if pool is not None and n > 0:
                depth = min(n, pool_ngram_size - 1)
                branches += [c[:depth] for c in pool.candidates(session.anchor, ngram_pool)]
                branches = fit_branches(branches, session.node_room(1 + sum(map(len, branches))))
            before, prefix, inputs = session.writer.length, session.prefix, [session.anchor] + branches[0]
            visited, predictions = verify_guesses(session, branches)
            accepted = len(visited) - 1
            converged = min(accepted, leading_matches(branches[0], session.ids[0, before:].tolist()))
            for i in range(converged):
                slot_accepts[i] += 1
            pool_tokens += accepted - converged
            if pool is not None:
                pool.harvest(prefix, inputs, predictions)
            carried = predictions[accepted + 1 :]
            context = torch.cat((session.ids[0], session.ids.new_tensor(carried)))
            guesses = carried + new_slots(init, context, window - len(carried), pad_id, vocab, rng)
        session.stats.extra.update(iterations=len(session.stats.accept_lengths), slot_accepts=slot_accepts,
                                   pool_tokens=pool_tokens, window=window, init=init)
        return session.finish()
