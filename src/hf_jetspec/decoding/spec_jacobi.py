"""Speculative Jacobi decoding: a small draft model (same tokenizer) proposes K tokens autoregressively with its own
KV cache; the target checks the whole chain ``[anchor ; d_1 .. d_K]`` in one forward and commits the converged
prefix plus its own next token. Optionally, further Jacobi iterations refine the unaccepted tail with the target's
own predictions as guesses before the draft is asked again.

Greedy: a draft token is accepted iff it equals the target's choice (the Jacobi / tree walk), so the tokens are
plain ``generate()``'s. Sampling: standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023) on the
PROCESSED distributions (target and draft logits both go through the prepared logits processors): accept d_i with
probability ``min(1, p(d_i) / q(d_i))``, else draw from ``norm(max(0, p - q))``; after K acceptances draw from p.
That is recursive rejection on a chain (`hf_jetspec.acceptance.rejection_walk`). Every committed token is then
distributed exactly as the target's.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..acceptance import accept
from ..attention import sliding_window
from ..cache import cache_kwarg, check_cache, full_layers, keep_positions
from ..limits import check_range, check_window_limits
from ..tokens import TokenSelector
from ..tree import DraftTree
from .jacobi import leading_matches
from .rows import per_row
from .session import DecodingSession

DEFAULT_DRAFT_TOKENS = 5


class DraftRunner:
    """The draft model and its own KV cache, which always holds a prefix of the committed sequence."""

    def __init__(self, draft_model, target_vocab: int) -> None:
        lm_head = draft_model.get_output_embeddings() if hasattr(draft_model, "get_output_embeddings") else None
        if getattr(lm_head, "weight", None) is None:
            raise ValueError(f"draft_model= takes a loaded causal LM with an LM head (AutoModelForCausalLM."
                             f"from_pretrained(...)), got {type(draft_model).__name__}; a JetSpecHead is a "
                             "draft_head= of jetspec_generate")
        vocab = lm_head.weight.shape[0]
        if vocab != target_vocab:
            raise ValueError(f"The draft model's vocabulary ({vocab}) differs from the target's ({target_vocab}): "
                             "speculative Jacobi needs a draft with the same tokenizer.")
        self.model = draft_model
        self.cache = full_layers(DynamicCache(config=draft_model.config), sliding_window(draft_model)[0])
        check_cache(self.cache)
        self.key = cache_kwarg(draft_model)
        self.seen: list[int] = []  # the tokens whose KV the draft cache holds

    def next_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Raw logits ``[1, V]`` (fp32) after ``ids [1, L]`` (which extends ``seen``), feeding only the new tokens."""
        length = len(self.seen)
        positions = torch.arange(length, ids.shape[1], device=ids.device)[None]
        out = self.model(input_ids=ids[:, length:], position_ids=positions, use_cache=True, **{self.key: self.cache})
        self.seen = ids[0].tolist()
        return out.logits[:, -1].to(dtype=torch.float32)

    def sync(self, ids: torch.Tensor) -> None:
        """Roll the cache back to the longest prefix of the committed ``ids [1, L]`` it holds (at most L - 1, so the
        next call has a token to feed): rejected drafts are forgotten."""
        keep = leading_matches(self.seen, ids[0, :-1].tolist())
        if keep < len(self.seen):
            keep_positions(self.cache, keep, [])
            self.seen = self.seen[:keep]


def draft_chain(draft: DraftRunner, selector: TokenSelector, ids: torch.Tensor, count: int
                ) -> tuple[list[int], torch.Tensor | None]:
    """Draft ``count`` tokens after ``ids [1, L]``, choosing each like the target would (argmax of the processed
    draft scores, or a draw from them with the selector's generator). Returns the tokens and, when sampling, the
    processed draft distributions ``q [count, V]``."""
    tokens, dists = [], []
    for _ in range(count):
        scores = selector.scores(ids, draft.next_logits(ids))
        if selector.do_sample:
            dists.append(torch.softmax(scores, dim=-1))
            token = int(torch.multinomial(dists[-1], 1, generator=selector.generator))
        else:
            token = int(scores.argmax(dim=-1))
        tokens.append(token)
        ids = torch.cat((ids, ids.new_tensor([[token]])), dim=1)
    return tokens, torch.cat(dists) if dists else None


def verify_chain(session: DecodingSession, guesses: list[int], q: torch.Tensor | None) -> tuple[list[int], list[int]]:
    """Verify the chain ``[anchor ; guesses]`` in one target forward and commit what the acceptance rule takes:
    recursive rejection against the draft distributions ``q [K, V]`` they were sampled from, or the match walk
    (greedy drafts, Jacobi guesses). Returns (the visited nodes, root first; the target's raw argmax at every chain
    node: Jacobi guesses for a later iteration)."""
    tree, _ = DraftTree.from_branches(session.anchor, [guesses], session.ids.device)
    logits = session.verify(tree)
    visited = accept(tree, logits, session.selector, session.writer, q)
    session.commit(visited)
    return visited, logits.argmax(dim=-1).tolist()


@per_row("Speculative Jacobi decoding drafts num_draft_tokens= tokens per step")
def speculative_jacobi_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    draft_model=None,
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    jacobi_iterations: int = 0,
    token_streamer=None,
    generator: torch.Generator | None = None,
    tree_kernel: bool | None = None,
    **model_kwargs,
):
    """Generate with speculative Jacobi decoding (greedy: identical tokens to plain ``generate()``; sampling: the
    target's distribution, by speculative sampling).

    Args (beyond ``generate()``'s own):
        draft_model: a causal LM with the target's tokenizer (same vocabulary); it keeps its own KV cache.
            ``hf_jetspec.models.truncated_draft(model, k)`` builds one from the target's first k layers (untrained,
            so it is accepted rarely unless k is close to the target's depth).
        num_draft_tokens: K, tokens drafted per round.
        jacobi_iterations: after a round that rejected part of the chain, up to this many extra target forwards
            re-verify the rejected tail with the target's own predictions as guesses (Jacobi) before drafting again.
        token_streamer: a streamer receiving committed tokens (``generate()`` does not forward ``streamer=``).
        generator: ``torch.Generator`` for reproducible sampling (draft draws and acceptance tests).

    Returns the sequences, or a `JetSpecGenerateOutput` (``return_dict_in_generate=True``) whose ``stats.extra``
    holds ``rounds`` (draft rounds), ``iterations`` (target forwards after prefill), ``jacobi_tokens`` (tokens
    committed by the extra Jacobi iterations), ``draft_forwards`` and ``slot_accepts`` (how often draft slot i
    was accepted).
    """
    if draft_model is None:
        raise ValueError("Speculative Jacobi decoding needs draft_model= (a causal LM with the same tokenizer).")
    check_range("num_draft_tokens", num_draft_tokens)
    check_range("jacobi_iterations", jacobi_iterations, minimum=0, maximum=10**6)
    check_window_limits(model, input_ids.shape[1], generation_config, num_draft_tokens, name="num_draft_tokens")
    draft = DraftRunner(draft_model, model.get_output_embeddings().weight.shape[0])
    slot_accepts, rounds, jacobi_tokens, draft_forwards = [0] * num_draft_tokens, 0, 0, 0
    tail: list[int] = []  # the target's predictions for the rejected part of the last chain (Jacobi guesses)
    refinements = 0  # Jacobi iterations run since the last draft round

    with DecodingSession(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus,
                         streamer, model_kwargs, token_streamer=token_streamer, generator=generator,
                         tree_kernel=tree_kernel) as session:
        session.prefill()
        while not session.finished:
            count = min(num_draft_tokens, session.max_depth())
            before = session.writer.length
            jacobi = bool(tail) and refinements < jacobi_iterations and count > 0
            with session.drafting():
                if jacobi:
                    guesses, q = tail[:count], None
                    refinements += 1
                else:
                    guesses, q = (draft_chain(draft, session.selector.for_drafts(), session.ids, count) if count
                                  else ([], None))
                    draft_forwards += count
                    rounds += count > 0
                    refinements = 0
            visited, predictions = verify_chain(session, guesses, q)
            accepted = len(visited) - 1
            if jacobi:
                jacobi_tokens += session.writer.length - before
            else:
                for i in range(min(accepted, leading_matches(guesses, session.ids[0, before:].tolist()))):
                    slot_accepts[i] += 1
            draft.sync(session.ids)
            tail = predictions[accepted + 1 :]
        session.stats.extra.update(rounds=rounds, iterations=len(session.stats.accept_lengths),
                                   jacobi_tokens=jacobi_tokens, draft_forwards=draft_forwards,
                                   slot_accepts=slot_accepts, num_draft_tokens=num_draft_tokens)
        return session.finish()
