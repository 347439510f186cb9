"""`TextPrinter`: prints a streamed answer as soon as its tokens arrive.

transformers' ``TextStreamer`` holds text back until a space or newline (so words are never printed in pieces); an
answer without spaces (code, a long number, Chinese or Japanese text) then prints nothing for minutes. This
streamer prints every step's text at once and flushes, holding back only what can still change: a trailing
incomplete UTF-8 character (decoded as U+FFFD), which the next token completes.
"""

from __future__ import annotations

import sys
from typing import TextIO

from transformers.generation.streamers import BaseStreamer

REPLACEMENT = "\ufffd"


class TextPrinter(BaseStreamer):
    """A ``streamer=`` / ``token_streamer=`` that writes decoded text to ``stream`` (stdout) after every step.

    ``skip_prompt``: the first ``put`` (the prompt, as ``generate()`` sends it) is not printed. ``decode_kwargs``
    go to ``tokenizer.decode`` (e.g. ``skip_special_tokens=True``). ``text`` holds everything printed.
    """

    def __init__(self, tokenizer, skip_prompt: bool = True, stream: TextIO | None = None, **decode_kwargs) -> None:
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.stream = stream
        self.decode_kwargs = decode_kwargs
        self.tokens: list[int] = []  # since the last line break (decoding restarts there)
        self.printed = 0  # characters of the decoded ``tokens`` already written
        self.text = ""
        self._prompt_pending = skip_prompt

    def _write(self, text: str) -> None:
        if text:
            stream = self.stream or sys.stdout
            stream.write(text)
            stream.flush()
            self.text += text

    def put(self, value) -> None:
        if value.dim() > 1:
            if value.shape[0] > 1:
                raise ValueError("TextPrinter streams one sequence (batch size 1)")
            value = value[0]
        if self._prompt_pending:
            self._prompt_pending = False
            return
        self.tokens.extend(value.tolist())
        decoded = self.tokenizer.decode(self.tokens, **self.decode_kwargs)
        stable = decoded.rstrip(REPLACEMENT)
        if len(stable) > self.printed:
            self._write(stable[self.printed:])
            self.printed = len(stable)
        if stable.endswith("\n") and len(stable) == len(decoded):  # a clean break: restart (keeps decoding cheap)
            self.tokens, self.printed = [], 0

    def end(self) -> None:
        decoded = self.tokenizer.decode(self.tokens, **self.decode_kwargs) if self.tokens else ""
        self._write(decoded[self.printed:])
        self._write("\n")
        self.tokens, self.printed = [], 0
        self._prompt_pending = self.skip_prompt
