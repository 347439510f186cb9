"""What a retrieval lookup costs (the suffix index of `hf_jetspec.suffix_index`), next to one target forward
(~60-100 ms for SmolLM2-135M on this CPU, docs/forward_cost.py).

    nice -n 10 .venv/bin/python docs/lookup_cost.py                      # 1M and 10M tokens, both backends
    .venv/bin/python docs/lookup_cost.py --sizes 1000000 --backends numpy

Synthetic corpora, "random-ish" text: ids drawn from a Zipf-Mandelbrot law over a 49,152-id vocabulary (SmolLM2's),
documents of ~300 tokens (uniform 150-450), half of each document copied in spans of 4-48 tokens from earlier
documents (so long matches exist, as with boilerplate and repeated answers in a real datastore). Per corpus size and
suffix-array backend: build time, datastore file size, load time, and the median / 90th percentile microseconds of
`CorpusIndex.lookup(context, max_depth=16, max_occurrences=64)` for three kinds of context:

- in-corpus: the 64 tokens before a random corpus position (long matches, up to max_match = 32);
- fresh: 64 new Zipf tokens (short matches on frequent ids: the widest suffix-array ranges);
- mixed: 48 fresh tokens followed by 16 copied from the corpus;

plus `ContextIndex.lookup` on 1,000-2,000 tokens of the same text, and on ~32,000 tokens of degenerate repetitive
text (its worst case: every position matches).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from hf_jetspec.suffix_index import ContextIndex, CorpusIndex

VOCAB = 49_152
CONTEXT = 64


def zipf_tokens(rng: np.random.Generator, size: int) -> np.ndarray:
    weights = 1.0 / (np.arange(VOCAB) + 2.7) ** 1.05
    cdf = np.cumsum(weights / weights.sum())
    ids = np.searchsorted(cdf, rng.random(size), side="right")
    return np.minimum(ids, VOCAB - 1).astype(np.int64)


def synthetic_corpus(size: int, seed: int = 0) -> list[np.ndarray]:
    """Documents of 150-450 tokens, half fresh Zipf tokens and half spans copied from earlier documents."""
    rng = np.random.default_rng(seed)
    fresh = zipf_tokens(rng, size)
    written = np.empty(size, dtype=np.int64)  # everything emitted so far, the pool spans are copied from
    docs, used, taken = [], 0, 0
    while used < size:
        length = min(int(rng.integers(150, 451)), size - used)
        doc = np.empty(length, dtype=np.int64)
        filled = 0
        while filled < length:
            span = min(int(rng.integers(4, 49)), length - filled)
            if used > 1000 and rng.random() < 0.5:
                start = int(rng.integers(0, used - span))
                doc[filled : filled + span] = written[start : start + span]
            else:
                doc[filled : filled + span] = fresh[taken : taken + span]
                taken += span
            filled += span
        written[used : used + length] = doc
        docs.append(doc)
        used += length
    return docs


def timed_us(fn, contexts) -> tuple[float, float]:
    for context in contexts[:20]:
        fn(context)
    times = []
    for context in contexts:
        start = time.perf_counter()
        fn(context)
        times.append(time.perf_counter() - start)
    times.sort()
    return 1e6 * statistics.median(times), 1e6 * times[int(0.9 * len(times))]


def contexts_for(index: CorpusIndex, rng: np.random.Generator, count: int) -> dict[str, list[np.ndarray]]:
    tokens = index.tokens.astype(np.int64)

    def copied(length: int) -> np.ndarray:
        while True:
            end = int(rng.integers(length, tokens.size))
            piece = tokens[end - length : end]
            if (piece != index.sep).all():
                return piece

    return {
        "in-corpus": [copied(CONTEXT) for _ in range(count)],
        "fresh": [zipf_tokens(rng, CONTEXT) for _ in range(count)],
        "mixed": [np.concatenate((zipf_tokens(rng, CONTEXT - 16), copied(16))) for _ in range(count)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--backends", default="divsufsort,numpy")
    parser.add_argument("--lookups", type=int, default=1000)
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs; lookup(max_depth=16, max_occurrences=64), "
          f"{args.lookups} contexts per kind; microseconds: median / p90")
    for size in (int(s) for s in args.sizes.split(",")):
        start = time.perf_counter()
        docs = synthetic_corpus(size)
        print(f"\n== {size:,} tokens, {len(docs):,} documents (generated in {time.perf_counter() - start:.1f} s)")
        for backend in args.backends.split(","):
            start = time.perf_counter()
            index = CorpusIndex.build(docs, vocab_size=VOCAB, max_match=32, backend=backend)
            build = time.perf_counter() - start
            with tempfile.TemporaryDirectory() as folder:
                small = index.save(os.path.join(folder, "tokens-only.safetensors"), suffix_array=False)
                file = index.save(folder)
                megabytes, small_megabytes = file.stat().st_size / 2**20, small.stat().st_size / 2**20
                start = time.perf_counter()
                index = CorpusIndex.load(file)
                load = time.perf_counter() - start
                start = time.perf_counter()
                CorpusIndex.load(small)
                rebuild = time.perf_counter() - start
            rng = np.random.default_rng(1)
            line = [f"{backend:>10}: build {build:5.1f} s, file {megabytes:5.1f} MiB (load {load:4.2f} s; tokens only "
                    f"{small_megabytes:4.1f} MiB, load + rebuild {rebuild:4.1f} s)"]
            for kind, contexts in contexts_for(index, rng, args.lookups).items():
                median, p90 = timed_us(lambda c: index.lookup(c, max_depth=16, max_occurrences=64), contexts)
                lengths = [index.match(c)[0] for c in contexts[:200]]
                line.append(f"{kind} {median:5.0f} / {p90:5.0f} us (match {statistics.median(lengths):.0f})")
            print("  " + "; ".join(line))
    text = np.concatenate(synthetic_corpus(2000, seed=5))
    contexts = [ContextIndex(text[: 1000 + 2 * i]) for i in range(500)]
    median, p90 = timed_us(lambda c: c.lookup(max_depth=16, max_occurrences=64), contexts)
    print(f"\nContextIndex.lookup on 1,000-2,000 tokens of the same text: {median:.0f} / {p90:.0f} us")
    for name, text in (("one repeated token", np.full(32_000, 7)), ("a period-3 pattern", np.tile([1, 2, 3], 10_667))):
        contexts = [ContextIndex(text[: 31_000 + 2 * i]) for i in range(200)]
        median, p90 = timed_us(lambda c: c.lookup(max_depth=16, max_occurrences=64), contexts)
        print(f"ContextIndex.lookup on ~32,000 tokens of {name} (worst cases): {median:.0f} / {p90:.0f} us")


if __name__ == "__main__":
    main()
