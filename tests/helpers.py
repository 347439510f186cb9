"""Test helpers: tiny random targets (Qwen3, Qwen3-MoE, Llama), `ScrambledOracle` (the library's
`ScrambledOracleDrafter`), the plain-greedy-versus-strategy comparison every equivalence test uses, and the
exact-distribution machinery of the sampling tests (enumerated processed next-token tables, joints, chi-squared p-values)."""

from __future__ import annotations

import itertools

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    StoppingCriteria,
)

import hf_jetspec
from hf_jetspec.drafters import ScrambledOracleDrafter

TARGET_FAMILIES = ("qwen3", "qwen3_moe", "llama")


def make_target(family: str, seed: int = 0, vocab: int = 128, layers: int = 4, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, **extra):
    """A tiny randomly initialised float32 causal LM in eval mode. A larger init spread than HF's default keeps
    the greedy continuations varied (not one repeated token) and top-2 logit gaps far above float32 noise."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, max_position_embeddings=1024, initializer_range=0.2, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    common.update(extra)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(intermediate_size=2 * hidden, head_dim=hidden // heads, **common))
    elif family == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            intermediate_size=2 * hidden, moe_intermediate_size=hidden, num_experts=4, num_experts_per_tok=2,
            head_dim=hidden // heads, decoder_sparse_step=1, **common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(intermediate_size=2 * hidden, **common))
    else:
        raise ValueError(family)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model.eval()


class StopAfterToken(StoppingCriteria):
    """Stops a row once its last token is ``token`` (a per-row criterion, as ``generate()`` calls them)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


# A drafter that knows the target's continuation but ranks it unreliably (see its docstring).
ScrambledOracle = ScrambledOracleDrafter


def greedy_reference(model, prompt: torch.Tensor, **gen_kwargs) -> torch.Tensor:
    return model.generate(prompt, do_sample=False, **gen_kwargs)


def jetspec(model, prompt: torch.Tensor, **kwargs):
    return model.generate(prompt, do_sample=False, custom_generate=hf_jetspec.jetspec_generate, **kwargs)


def assert_same_tokens(reference: torch.Tensor, output: torch.Tensor, context: str = "") -> None:
    if not torch.equal(reference, output):
        ref, out = reference[0].tolist(), output[0].tolist()
        first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
        raise AssertionError(
            f"Output differs from plain greedy generate at position {first} {context}\n"
            f"  greedy  ({len(ref)}): {ref}\n  strategy({len(out)}): {out}"
        )


# ------------------------------------------------------------------------ exact distributions and chi-squared


def enumerate_logits(lm, prompt: torch.Tensor, vocab: int, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every continuation of ``prompt [1, P]`` by ``depth`` tokens, in base-``vocab`` code order, and the raw fp32
    logits after each of its prefixes (one batched forward): ``(ids [V^depth, P + depth], logits [V^depth,
    depth + 1, V])``, ``logits[c, l]`` following the first l continuation tokens of ``c``."""
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=depth)), dtype=torch.long)
    ids = torch.cat((prompt.expand(len(conts), -1), conts), dim=1)
    with torch.no_grad():
        logits = lm(ids).logits.float()
    return ids, logits[:, prompt.shape[1] - 1 :]


def processed_tables(lm, prompt: torch.Tensor, processors, vocab: int, depth: int) -> list[torch.Tensor]:
    """Processed next-token distributions after every continuation prefix: ``out[l][code]`` is ``[V]`` for the
    prefix of length l (0..depth) whose base-V code is ``code``. ``processors``: a ``LogitsProcessorList`` (what
    ``generate()`` builds), applied with the prompt + prefix as context."""
    ids, logits = enumerate_logits(lm, prompt, vocab, depth)
    out = []
    for length in range(depth + 1):
        rows = torch.arange(0, len(ids), vocab ** (depth - length))
        context = ids[rows, : prompt.shape[1] + length]
        scores = logits[rows, length]
        out.append(torch.softmax(processors(context, scores) if len(processors) else scores, dim=-1))
    return out


def exact_joint(tables: list[torch.Tensor], length: int) -> torch.Tensor:
    """Probability of every ``length``-token continuation (flat, base-V code order) from `processed_tables`."""
    joint = tables[0][0]
    for l in range(1, length):
        joint = (joint[:, None] * tables[l]).flatten()
    return joint


def joint_counts(samples: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counts of every continuation code for ``samples [n, length]``."""
    codes = torch.zeros(samples.shape[0], dtype=torch.long)
    for i in range(samples.shape[1]):
        codes = codes * vocab + samples[:, i]
    return torch.bincount(codes, minlength=vocab ** samples.shape[1])


def _chi2_sf(stat: torch.Tensor, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def chi_squared_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-squared goodness of fit; cells expecting < 5 are pooled. Survival function via gammaincc."""
    expected = probs.double() * counts.sum()
    small = expected < 5
    obs = torch.cat((counts.double()[~small], counts.double()[small].sum()[None]))
    exp = torch.cat((expected[~small], expected[small].sum()[None]))
    stat = ((obs - exp) ** 2 / exp.clamp_min(1e-12)).sum()
    return _chi2_sf(stat, len(obs) - 1)


def two_sample_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-squared test that two count vectors come from the same distribution (2 x K contingency table); cells
    whose pooled expectation is < 5 in either sample are merged."""
    a, b = a.double(), b.double()
    share = a.sum() / (a.sum() + b.sum())
    small = (a + b) * torch.minimum(share, 1 - share) < 5
    a = torch.cat((a[~small], a[small].sum()[None]))
    b = torch.cat((b[~small], b[small].sum()[None]))
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    ea, eb = total * share, total * (1 - share)
    stat = ((a - ea) ** 2 / ea + (b - eb) ** 2 / eb).sum()
    return _chi2_sf(stat, len(total) - 1)
