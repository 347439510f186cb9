"""Tree verification attention microbenchmark: Triton kernel vs SDPA with a dense mask vs flex_attention.

One attention call of a tree verification step (the N tree nodes on top of P cached tokens), timed per backend:

* ``kernel``: :func:`tree_attention` with the packed ancestor bitmask.
* ``sdpa``: what transformers' sdpa path does with a 4D float mask: ``repeat_kv`` of K/V to the query heads, then
  ``scaled_dot_product_attention`` with the dense ``[1, 1, N, P + N]`` additive mask (built once, outside timing,
  as the model builds it once per forward).
* ``flex``: ``torch.compile``-d ``flex_attention`` with a ``BlockMask`` from the tree (built outside timing; its
  build time is the ``flex mask`` column) and ``enable_gqa=True``.

Every timed output is checked against an fp32 SDPA reference (max abs error columns).

Then end-to-end JetSpec steps on a randomly initialised Qwen3-8B-shaped target with the oracle drafter, per tree
budget, through the kernel and through sdpa with the dense mask (``--no-e2e`` skips them).

GPU (Qwen3-8B attention shapes: 32 query heads, 8 KV heads, head_dim 128, bf16; under 10 minutes on an H200)::

    python -m hf_jetspec.kernels.bench

CPU smoke test (tiny shapes, kernel through the Triton interpreter, eager flex)::

    TRITON_INTERPRET=1 python -m hf_jetspec.kernels.bench --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .tree_attention import TreeMeta, kernel_available, sdpa_tree_reference, tree_attention

BF16_TOLERANCE = 2e-2


@dataclasses.dataclass(frozen=True)
class Setup:
    """What to sweep and how long to time each call."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    tree_sizes: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    warmup: int
    reps: int
    flex_budget_s: float  # stop timing flex (compiles per shape) once the run is this old


QWEN3_8B = Setup(32, 8, 128, torch.bfloat16, (16, 32, 64, 128, 256), (512, 2048, 8192), 20, 100, 420.0)
QUICK = Setup(4, 2, 32, torch.bfloat16, (5, 16), (0, 40), 1, 1, 60.0)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention call: query ``[1, Hq, N, D]``, key/value ``[1, Hkv, P + N, D]``, the tree and the scale."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    meta: TreeMeta
    scaling: float


def random_tree(num_nodes: int, gen: torch.Generator) -> torch.Tensor:
    """Parents ``[N]`` of a random draft-like tree: each node hangs under one of the 4 most recent nodes."""
    parents = [-1] + [max(0, i - 1 - int(torch.randint(0, 4, (1,), generator=gen))) for i in range(1, num_nodes)]
    return torch.tensor(parents)


def make_problem(setup: Setup, num_nodes: int, prefix_len: int, device: torch.device, seed: int) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    shape_q = (1, setup.num_q_heads, num_nodes, setup.head_dim)
    shape_kv = (1, setup.num_kv_heads, prefix_len + num_nodes, setup.head_dim)
    query, key, value = (torch.randn(s, generator=gen).to(device, setup.dtype) for s in (shape_q, shape_kv, shape_kv))
    meta = TreeMeta.from_parents(random_tree(num_nodes, gen), prefix_len).to(device)
    return Problem(query, key, value, meta, setup.head_dim**-0.5)


def dense_bias(problem: Problem) -> torch.Tensor:
    """The ``[1, 1, N, P + N]`` additive float mask of transformers' sdpa path."""
    visible = problem.meta.visibility(problem.key.shape[2])
    bias = torch.zeros(visible.shape, dtype=problem.query.dtype, device=visible.device)
    return bias.masked_fill(~visible, torch.finfo(bias.dtype).min)[None, None]


def tree_block_mask(problem: Problem) -> BlockMask:
    """flex_attention ``BlockMask``: every prefix key, then ancestor-or-self tree keys."""
    prefix_len, num_nodes = problem.meta.prefix_len, problem.meta.num_nodes
    ancestors = problem.meta.ancestor_matrix()

    def mask_mod(b, h, q_idx, kv_idx):
        tree_idx = (kv_idx - prefix_len).clamp(0, num_nodes - 1)
        return (kv_idx < prefix_len) | (ancestors[q_idx, tree_idx] & (kv_idx < prefix_len + num_nodes))

    return create_block_mask(
        mask_mod, B=None, H=None, Q_LEN=num_nodes, KV_LEN=problem.key.shape[2], device=problem.query.device
    )


def backends(
    problem: Problem, flex_fn: Callable, block_mask: BlockMask | None
) -> dict[str, Callable[[], torch.Tensor]]:
    """Zero-argument callables returning ``[1, N, Hq, D]``; ``flex`` only when ``block_mask`` is given."""
    q, k, v, scale = problem.query, problem.key, problem.value, problem.scaling
    groups = q.shape[1] // k.shape[1]
    bias = dense_bias(problem)
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(
            q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), attn_mask=bias, scale=scale
        ).transpose(1, 2)
    }
    if kernel_available(q.device):
        calls["kernel"] = lambda: tree_attention(q, k, v, problem.meta, scale)
    if block_mask is not None:
        calls["flex"] = lambda: flex_fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True).transpose(1, 2)
    return calls


def time_ms(fn: Callable[[], torch.Tensor], device: torch.device, warmup: int, reps: int) -> tuple[float, torch.Tensor]:
    """Mean milliseconds per call after ``warmup`` calls (CUDA events on GPU), and the last output."""
    for _ in range(warmup):
        out = fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(reps):
            out = fn()
        return (time.perf_counter() - start) * 1e3 / reps, out
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(reps):
        out = fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / reps, out


def build_ms(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """Wall-clock milliseconds of one call of ``fn`` (synchronised), and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3, result


def run(setup: Setup, device: torch.device, use_flex: bool) -> bool:
    """Print the table; return whether every checked output was within tolerance."""
    if device.type == "cuda":
        flex_fn = torch.compile(flex_attention)
    else:  # eager flex (unfused, warns): enough for a CPU smoke test
        flex_fn = flex_attention
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    names = ("kernel", "sdpa", "flex")
    print(f"device={device} dtype={setup.dtype} Hq={setup.num_q_heads} Hkv={setup.num_kv_heads} D={setup.head_dim}")
    print(f"warmup={setup.warmup} reps={setup.reps}; ms per call; err = max |out - fp32 reference|;"
          " speedup = backend ms / kernel ms")  # fmt: skip
    header = f"{'N':>5} {'P':>6} | " + " ".join(f"{n + ' ms':>10}" for n in names)
    print(header + f" {'flex mask':>10} | " + " ".join(f"{n + ' err':>10}" for n in names) + f" | {'speedup':>14}")
    all_ok, started = True, time.perf_counter()
    for prefix_len in setup.prefix_lens:
        for num_nodes in setup.tree_sizes:
            problem = make_problem(setup, num_nodes, prefix_len, device, seed=prefix_len * 1000 + num_nodes)
            expected = sdpa_tree_reference(*(t.float() for t in (problem.query, problem.key, problem.value)),
                                           problem.meta, problem.scaling)  # fmt: skip
            flex_now = use_flex and time.perf_counter() - started < setup.flex_budget_s
            mask_ms, block_mask = build_ms(lambda: tree_block_mask(problem), device) if flex_now else (math.nan, None)
            times, errors, failures = {}, {}, []
            for name, fn in backends(problem, flex_fn, block_mask).items():
                try:
                    times[name], out = time_ms(fn, device, setup.warmup, setup.reps)
                except Exception as exc:  # report and keep benchmarking the other backends
                    failures.append(f"{name} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    continue
                errors[name] = (out.float() - expected).abs().max().item()
            ok = not failures and all(err <= BF16_TOLERANCE for err in errors.values())
            all_ok &= ok
            print(_row(num_nodes, prefix_len, names, times, errors, mask_ms) + ("" if ok else "  <-- CHECK FAILED"))
            for failure in failures:
                print("      " + failure)
    return all_ok


def _row(num_nodes: int, prefix_len: int, names: tuple[str, ...], times: dict, errors: dict, mask_ms: float) -> str:
    cell = lambda table, name, fmt: format(table[name], fmt) if name in table else "n/a"  # noqa: E731
    baselines = [b for b in ("sdpa", "flex") if b in times and "kernel" in times]
    speedup = ", ".join(f"{times[b] / times['kernel']:.2f}x {b}" for b in baselines)
    timings = " ".join(f"{cell(times, n, '.4f'):>10}" for n in names)
    errs = " ".join(f"{cell(errors, n, '.2e'):>10}" for n in names)
    return f"{num_nodes:>5} {prefix_len:>6} | {timings} {mask_ms:>10.3f} | {errs} | {speedup}"


def end_to_end(device: torch.device, quick: bool, budgets: tuple[int, ...] = (16, 32, 64, 128, 256),
               prefix_len: int = 1024, new_tokens: int = 96) -> None:
    """JetSpec decoding steps on a randomly initialised Qwen3-8B-shaped target (bf16) with the oracle drafter:
    per tree budget, verify-step time and tokens/s through the kernel vs sdpa with the dense mask."""
    # A benchmark script, not library code: it may use the decoding engine (the library never imports it).
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import hf_jetspec

    shape = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936)
    if quick:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=256)
        budgets, prefix_len, new_tokens = (8, 16), 32, 12
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(max_position_embeddings=32768, attn_implementation="sdpa", **shape))
    torch.set_default_dtype(previous)
    model.eval().generation_config.pad_token_id = 0
    prompt = torch.randint(0, shape["vocab_size"], (1, prefix_len), device=device)
    kwargs = dict(do_sample=False, max_new_tokens=new_tokens)
    model.generate(prompt, **kwargs)  # warm-up
    start = time.perf_counter()
    reference = model.generate(prompt, **kwargs)
    plain_s = time.perf_counter() - start
    print(f"\nend-to-end: {'tiny' if quick else 'Qwen3-8B-shaped'} random target ({dtype}), prefix {prefix_len}, {new_tokens} new tokens, "
          f"oracle drafter (block 16); plain greedy {new_tokens / plain_s:.1f} tokens/s")
    print(f"{'budget':>6} {'attention':>10} | {'verify ms':>10} {'tokens/s':>9} {'tau':>6} {'speedup':>8} | same as greedy")
    for budget in budgets:
        for use_kernel in (True, False):
            drafter = hf_jetspec.OracleDrafter(reference, shape["vocab_size"], 16)
            run = lambda: model.generate(prompt, custom_generate=hf_jetspec.jetspec_generate, drafter=drafter,  # noqa: E731
                                         tree_budget=budget, tree_kernel=use_kernel, return_dict_in_generate=True,
                                         **kwargs)
            try:
                run()
                start = time.perf_counter()
                out = run()
                seconds = time.perf_counter() - start
            except Exception as exc:
                print(f"{budget:>6} {'kernel' if use_kernel else 'sdpa':>10} | failed: {type(exc).__name__}: {exc}")
                continue
            stats = out.stats
            verify_ms = 1e3 * stats.target_time / max(1, stats.target_forwards)
            same = torch.equal(out.sequences, reference)
            print(f"{budget:>6} {'kernel' if use_kernel else 'sdpa':>10} | {verify_ms:>10.2f} "
                  f"{new_tokens / seconds:>9.1f} {stats.tau:>6.2f} {plain_s / seconds:>7.2f}x | {same}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 1 rep; runs on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--no-flex", action="store_true", help="skip flex_attention (it compiles once per shape)")
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end JetSpec steps")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    setup = QUICK if args.quick else QWEN3_8B
    if device.type != "cuda" and not args.quick:
        parser.error("the full benchmark needs a CUDA GPU; use --quick on CPU")
    if not kernel_available(device):
        print(f"note: the Triton kernel is not available on {device} (CPU needs TRITON_INTERPRET=1): kernel column n/a")
    ok = run(setup, device, use_flex=not args.no_flex)
    print("all outputs within tolerance" if ok else "SOME OUTPUTS EXCEED THE TOLERANCE")
    if not args.no_e2e and kernel_available(device):
        end_to_end(device, args.quick)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
