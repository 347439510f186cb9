"""Upper bounds on what one verification forward may carry: tree budget and width, Jacobi window and n-gram pool,
speculative-Jacobi draft tokens. Checked once per call, before the first forward, so a value that cannot fit is
refused with the limit in the message instead of failing (or swapping) deep inside an allocation.

Two bounds apply. A fixed one, `MAX_FORWARD_TOKENS` tokens per forward (far beyond any useful tree: the measured
optimum is 8-64 nodes on a CPU), which the command line checks before importing torch. And a memory one: a forward
over N new tokens with S keys holds, besides the model and the KV cache plain ``generate()`` needs anyway, the logits
``N x V`` (the model's dtype and a float32 copy), the tree mask ``N x S`` (additive and boolean) and ancestor matrix
``N x N``, one layer's attention weights ``heads x N x S`` (float32), the MLP activations ``3 x N x intermediate``
and N more cache slots per layer (`forward_bytes`). N must keep that within `MEMORY_SHARE` of the memory
available on the model's device when the call starts.

This module imports torch only inside functions that take a model.
"""

from __future__ import annotations

import os

MAX_FORWARD_TOKENS = 4096
MEMORY_SHARE = 0.5
_GIB = 2**30


def check_range(name: str, value: int, minimum: int = 1, maximum: int = MAX_FORWARD_TOKENS) -> int:
    """``value`` if ``minimum <= value <= maximum``, else ``ValueError`` naming ``name`` and the range."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        why = " (tokens one verification forward may carry)" if maximum == MAX_FORWARD_TOKENS else ""
        raise ValueError(f"{name}={value} is out of range: it must be in {minimum}..{maximum}{why}")
    return value


def forward_bytes(model, tokens: int, keys: int) -> int:
    """Bytes a verification forward of ``tokens`` new tokens attending to ``keys`` keys allocates besides the model
    and the KV cache of the sequence itself (an estimate that errs on the large side; see the module doc)."""
    from .config import target_size

    config = model.config.get_text_config()
    elem = next(model.parameters()).element_size()
    vocab = model.get_output_embeddings().weight.shape[0]
    hidden = target_size(config, "hidden_size", "n_embd", "d_model", default=vocab)
    heads = target_size(config, "num_attention_heads", "n_head", default=1)
    kv_heads = target_size(config, "num_key_value_heads", default=heads)
    head_dim = target_size(config, "head_dim", default=hidden // heads)
    intermediate = target_size(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    layers = target_size(config, "num_hidden_layers", "n_layer", default=1)
    logits = tokens * vocab * (elem + 4)
    mask = tokens * keys * (elem + 1) + tokens * tokens
    attention = heads * tokens * keys * 4
    mlp = 3 * tokens * intermediate * elem
    cache = 2 * layers * kv_heads * head_dim * tokens * elem
    return logits + mask + attention + mlp + cache


def available_memory(device) -> int | None:
    """Bytes free for new tensors on ``device`` (a torch.device) now; None where unknown (then only the fixed bound
    applies)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def max_forward_tokens(model, sequence: int, extra: int = 0, available: int | None = None) -> int:
    """The most tokens (up to `MAX_FORWARD_TOKENS`) one verification forward may carry on ``model``'s device now,
    for a sequence of up to ``sequence`` tokens (prompt + new); ``extra``: tokens the forward carries anyway;
    ``available``: the free bytes if already read (else read now)."""
    from .devices import execution_device

    available = available_memory(execution_device(model)) if available is None else available
    if available is None:
        return MAX_FORWARD_TOKENS
    allowed = MEMORY_SHARE * available
    low, high = 0, MAX_FORWARD_TOKENS
    while low < high:  # the largest n with forward_bytes(n) <= allowed (monotone in n)
        mid = (low + high + 1) // 2
        if forward_bytes(model, mid, sequence + mid) <= allowed:
            low = mid
        else:
            high = mid - 1
    return low


def check_forward_size(model, generation_config, setting: str, tokens: int) -> None:
    """Refuse ``setting`` (e.g. ``"tree_budget=64"``) when its verification forwards of ``tokens`` tokens exceed
    `MAX_FORWARD_TOKENS` or do not fit in memory."""
    if tokens > MAX_FORWARD_TOKENS:
        raise ValueError(f"{setting} would verify {tokens} tokens per forward; at most {MAX_FORWARD_TOKENS} are "
                         "allowed")
    from .devices import execution_device

    sequence = int(getattr(generation_config, "max_length", None) or 0)
    device = execution_device(model)
    available = available_memory(device)
    # One estimate decides (forward_bytes grows with tokens); the search for the limit runs only to word a refusal.
    if available is not None and forward_bytes(model, tokens, sequence + tokens) > MEMORY_SHARE * available:
        limit = max_forward_tokens(model, sequence, available=available)
        if limit == 0:  # not even one token fits: the length is the problem, not the setting
            need = forward_bytes(model, 1, sequence + 1) / _GIB
            raise ValueError(f"max_length={sequence} (prompt + max_new_tokens) is too long for {device}: one forward "
                             f"over that many keys needs ~{need:.3g} GiB, more than {MEMORY_SHARE:.0%} of the "
                             f"{available / _GIB:.1f} GiB free; ask for fewer new tokens")
        need = forward_bytes(model, tokens, sequence + tokens) / _GIB
        free = available / _GIB
        raise ValueError(f"{setting} would verify {tokens} tokens per forward, needing ~{need:.1f} GiB; {free:.1f} "
                         f"GiB are free on {device} and a forward may use {MEMORY_SHARE:.0%} of that: at most "
                         f"{limit} tokens per forward fit (for {sequence} prompt + new tokens)")


def check_tree_limits(model, generation_config, tree_budget: int, tree_width: int) -> None:
    """JetSpec: ``tree_budget`` (nodes verified per step, root included) and ``tree_width`` (children per depth,
    at most budget - 1 are used) within the fixed bound, and the budget's forwards within memory."""
    check_range("tree_budget", tree_budget)
    check_range("tree_width", tree_width)
    check_forward_size(model, generation_config, f"tree_budget={tree_budget}", tree_budget)


def check_window_limits(model, prompt_len: int, generation_config, window: int, ngram_pool: int = 0,
                        pool_ngram_size: int = 2, name: str = "window") -> None:
    """Jacobi (``window`` guesses plus ``ngram_pool`` branches of up to ``pool_ngram_size - 1`` tokens) and
    speculative Jacobi (``name="num_draft_tokens"``): the anchor and every guess share one forward, and a forward
    never carries more guesses than tokens remain after the prompt (``prompt_len``)."""
    check_range(name, window, minimum=0, maximum=MAX_FORWARD_TOKENS - 1)
    check_range("ngram_pool", ngram_pool, minimum=0, maximum=MAX_FORWARD_TOKENS - 1)
    if ngram_pool:
        check_range("pool_ngram_size", pool_ngram_size, minimum=2, maximum=MAX_FORWARD_TOKENS)
    remaining = int(getattr(generation_config, "max_length", None) or 0) - prompt_len
    guesses = max(0, min(window, remaining - 1))
    tokens = 1 + guesses + ngram_pool * min(guesses, pool_ngram_size - 1)
    setting = f"{name}={window}" + (f" with ngram_pool={ngram_pool} (pool_ngram_size={pool_ngram_size})"
                                    if ngram_pool else "")
    check_forward_size(model, generation_config, setting, tokens)
