"""Token selection and emission shared by every decoding loop (one sequence).

Selection reproduces ``generate()``'s ``_sample`` exactly: raw logits cast to float32, the prepared logits
processors applied with the sequence so far, then argmax (greedy) or a multinomial draw (sampling). Stopping
criteria are checked after every single token, so a stop inside an accepted run cuts it exactly where plain
generation would have stopped.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from .outputs import OUTPUT_CACHE_FIELD, DecodingStats, JetSpecGenerateOutput


# Logits processors that keep state from call to call, assuming one call per emitted token: drafts must not be
# scored with them (they would advance the state with tokens that are never emitted).
STATEFUL_PROCESSORS = ("UnbatchedClassifierFreeGuidanceLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor")


class TokenSelector:
    """Chooses the next token from raw logits as ``generate()`` would, given the sequence so far."""

    def __init__(self, logits_processor, generation_config, generator: torch.Generator | None = None) -> None:
        self.processors = logits_processor
        self.do_sample = bool(generation_config.do_sample)
        self.generator = generator

    def for_drafts(self) -> "TokenSelector":
        """The selector a drafter scores its own tokens with: the same rule without the processors that keep state
        between calls (classifier-free guidance, SynthID watermarking), which must see the emitted tokens only.
        Drafts only need some distribution to be drawn from and verified against, so this changes no output."""
        if not any(type(p).__name__ in STATEFUL_PROCESSORS for p in self.processors):
            return self
        drafts = TokenSelector.__new__(TokenSelector)
        drafts.processors = LogitsProcessorList(p for p in self.processors
                                                if type(p).__name__ not in STATEFUL_PROCESSORS)
        drafts.do_sample, drafts.generator = self.do_sample, self.generator
        return drafts

    @property
    def plain_greedy(self) -> bool:
        """True when the choice is a bare argmax of the raw logits (no processors, no sampling)."""
        return not self.do_sample and len(self.processors) == 0

    def scores(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Processed scores ``[1, V]`` for raw ``logits [1, V]`` after the sequence ``ids [1, L]``."""
        logits = logits.to(dtype=torch.float32)
        return self.processors(ids, logits) if len(self.processors) else logits

    def choose(self, scores: torch.Tensor) -> int:
        if not self.do_sample:
            return int(scores.argmax(dim=-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


class TokenWriter:
    """The growing sequence. ``emit`` appends one token, records scores, checks the stopping criteria; the
    streamer receives each step's tokens together when ``flush`` is called."""

    def __init__(self, input_ids, stopping_criteria, generation_config, streamer=None, token_streamer=None) -> None:
        """``streamer``: generate()'s own (it already received the prompt); ``token_streamer``: one passed to a
        custom_generate callable, which receives the prompt here first, as generate() would have done."""
        self.ids = input_ids
        self.prompt_len = input_ids.shape[1]
        self.stopping_criteria = stopping_criteria
        self.streamer = streamer or token_streamer
        if streamer is None and token_streamer is not None:
            token_streamer.put(input_ids.cpu())
        want = generation_config.return_dict_in_generate
        self.scores: tuple | None = () if want and generation_config.output_scores else None
        self.raw_logits: tuple | None = () if want and generation_config.output_logits else None
        self.finished = False
        self._pending: list[int] = []

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    def emit(self, token: int, scores: torch.Tensor | None = None, raw: torch.Tensor | None = None) -> bool:
        """Append ``token``; return True when generation must stop after it."""
        self.ids = torch.cat((self.ids, self.ids.new_tensor([[token]])), dim=1)
        if self.scores is not None:
            self.scores += (scores,)
        if self.raw_logits is not None:
            self.raw_logits += (raw.to(torch.float32),)
        self._pending.append(token)
        self.finished = bool(self.stopping_criteria(self.ids, self.scores).all())
        return self.finished

    def flush(self) -> None:
        if self.streamer is not None and self._pending:
            self.streamer.put(torch.tensor(self._pending))
        self._pending = []

    def result(self, generation_config, cache, stats: DecodingStats):
        self.flush()
        if self.streamer is not None:
            self.streamer.end()
        stats.new_tokens = self.length - self.prompt_len
        if not generation_config.return_dict_in_generate:
            return self.ids
        return JetSpecGenerateOutput(
            sequences=self.ids,
            scores=self.scores,
            logits=self.raw_logits,
            accept_lengths=list(stats.accept_lengths),
            stats=stats,
            **{OUTPUT_CACHE_FIELD: cache if generation_config.use_cache else None},
        )


def remaining_tokens(writer: TokenWriter, generation_config) -> int:
    """Tokens still allowed by ``max_length`` (the sequence already holds ``writer.length``)."""
    return max(0, generation_config.max_length - writer.length)
