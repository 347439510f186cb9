"""One check for the training commands' numeric options: a count out of range is one argparse error naming the
option (exit status 2) before any model loads, not a traceback or a run with a silently wrong count."""

from __future__ import annotations

import argparse


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, **minimums: int) -> None:
    """``parser.error`` for the first option in ``minimums`` (attribute name -> least value) below its minimum;
    options left at ``None`` (not given, no default) or absent (another subcommand's) pass."""
    for name, minimum in minimums.items():
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")
