"""Tree verification attention: Triton kernel vs the dense-mask SDPA reference, and the ``jetspec_tree``
attention implementation inside a tiny Qwen3 against sdpa with a dense 4D tree mask.

Kernels run on CPU tensors through the Triton interpreter (``TRITON_INTERPRET=1``, set below). Triton fixes the
mode when first imported, so in a run where something imported it earlier (transformers model classes do) the
variable must come from the environment or the top of conftest.py; otherwise the kernel tests skip, as they do
without Triton. The model tests then exercise the SDPA fallback.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import inspect
import zlib

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM, StaticCache

from hf_jetspec.kernels import TreeMeta, kernel_available, register, sdpa_tree_reference, tree_attention

needs_kernel = pytest.mark.skipif(
    not kernel_available("cpu"),
    reason="needs Triton imported with TRITON_INTERPRET=1: set it before anything imports triton (top of conftest.py)",
)
# Max abs error vs an fp32 reference. The interpreter truncates fp32 -> bf16 casts (GPUs round to nearest), so
# interpreted bf16 outputs can be 1 ulp off: ~1.6e-2 at |out| ~ 2-4.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


# ---------------------------------------------------------------- trees


def random_parents(num_nodes: int, gen: torch.Generator) -> torch.Tensor:
    """Random topologically ordered tree ``[N]``: each node's parent is a uniformly random earlier node."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]
    return torch.tensor(parents)


def chain_parents(num_nodes: int) -> torch.Tensor:
    return torch.arange(num_nodes) - 1


def star_parents(num_nodes: int) -> torch.Tensor:
    parents = torch.zeros(num_nodes, dtype=torch.long)
    parents[0] = -1
    return parents


def make_parents(kind: str, num_nodes: int, gen: torch.Generator) -> torch.Tensor:
    return {"random": lambda: random_parents(num_nodes, gen), "chain": lambda: chain_parents(num_nodes),
            "star": lambda: star_parents(num_nodes)}[kind]()  # fmt: skip


def brute_force_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """``bool[N, N]`` ancestor-or-self matrix by walking up from every node."""
    n = parents.numel()
    ancestors = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            ancestors[i, j] = True
            j = int(parents[j])
    return ancestors


def depths(parents: torch.Tensor) -> torch.Tensor:
    depth = torch.zeros_like(parents)
    for i in range(1, parents.numel()):
        depth[i] = depth[parents[i]] + 1
    return depth


@pytest.mark.parametrize("num_nodes", [1, 2, 31, 32, 33, 70])
@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_tree_meta_from_parents(kind: str, num_nodes: int) -> None:
    parents = make_parents(kind, num_nodes, torch.Generator().manual_seed(num_nodes))
    meta = TreeMeta.from_parents(parents, prefix_len=7)
    expected = brute_force_ancestors(parents)
    assert meta.ancestor_bits.dtype == torch.int32
    assert meta.ancestor_bits.shape == (num_nodes, (num_nodes + 31) // 32)
    assert torch.equal(meta.ancestor_matrix(), expected)
    assert torch.equal(TreeMeta.from_ancestor_matrix(expected, 7).ancestor_bits, meta.ancestor_bits)
    assert (meta.prefix_len, meta.num_nodes) == (7, num_nodes)


def test_tree_meta_bit_layout() -> None:
    meta = TreeMeta.from_parents(chain_parents(33), prefix_len=0)  # node 32 sees all 33 nodes
    assert meta.ancestor_bits[32].tolist() == [-1, 1]  # word 0: bits 0..31 set (int32 -1); word 1: bit 0
    assert meta.ancestor_bits[1].tolist() == [3, 0]


def test_tree_meta_visibility_ignores_static_slack() -> None:
    meta = TreeMeta.from_parents(torch.tensor([-1, 0, 0]), prefix_len=2)
    expected = [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0]]
    assert meta.visibility(6).int().tolist() == expected
    with pytest.raises(ValueError):
        meta.visibility(4)


@pytest.mark.parametrize(
    "parents", [torch.tensor([0, 0]), torch.tensor([-1, 1]), torch.tensor([-1, 2, 0]), torch.tensor([-1, -1])]
)
def test_tree_meta_rejects_bad_parents(parents: torch.Tensor) -> None:
    with pytest.raises(ValueError):
        TreeMeta.from_parents(parents, prefix_len=0)


def test_tree_meta_rejects_bad_ancestor_matrix() -> None:
    good = brute_force_ancestors(torch.tensor([-1, 0, 1]))
    for bad in (good & ~torch.eye(3, dtype=torch.bool), good.T, good[:, :2]):
        with pytest.raises(ValueError):
            TreeMeta.from_ancestor_matrix(bad, prefix_len=0)
    with pytest.raises(ValueError):
        TreeMeta.from_ancestor_matrix(good, prefix_len=-1)


# ---------------------------------------------------------------- kernel vs reference

# (dtype, batch, kv_heads, group, head_dim, nodes, prefix, slack, tree kind, prefix_split_len)
EXPLICIT_CASES = [
    (torch.float32, 1, 2, 2, 32, 16, 0, 0, "random", None),  # no prefix
    (torch.float32, 1, 1, 1, 16, 1, 5, 3, "chain", None),  # a lone root
    (torch.bfloat16, 1, 1, 4, 32, 40, 0, 0, "chain", None),  # chain: causal within the tree
    (torch.float32, 2, 1, 2, 16, 33, 100, 7, "star", 64),  # star across a 32-bit word boundary, 2 splits
    (torch.bfloat16, 1, 2, 1, 64, 70, 200, 11, "random", 64),  # 3 bitmask words, 4 splits
    (torch.float16, 1, 2, 4, 16, 9, 130, 0, "random", 64),  # prefix ends inside a key tile
    (torch.float32, 1, 1, 2, 128, 12, 40, 5, "random", None),
    (torch.bfloat16, 1, 1, 2, 256, 6, 70, 2, "random", 64),  # head_dim 256 tiles (32-key blocks)
    (torch.float32, 1, 2, 4, 16, 20, 64, 0, "random", 64),  # prefix an exact multiple of the split
]


def random_cases(count: int) -> list[tuple]:
    gen = torch.Generator().manual_seed(1234)
    cases = []
    for i in range(count):
        pick = lambda values: values[int(torch.randint(0, len(values), (1,), generator=gen))]  # noqa: E731
        cases.append((
            [torch.float32, torch.bfloat16, torch.float16][i % 3], pick([1, 2]), pick([1, 2]), [1, 2, 4][i % 3],
            pick([16, 32, 64]), int(torch.randint(1, 48, (1,), generator=gen)), pick([0, 3, 57, 150]),
            pick([0, 1, 13]), pick(["random", "random", "chain", "star"]), pick([None, 64]),
        ))  # fmt: skip
    return cases


def make_inputs(case: tuple, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TreeMeta]:
    """Query ``[B, Hq, N, D]`` as a transposed ``[B, N, Hq, D]`` view (the model's layout), key/value
    ``[B, Hkv, P + N + slack, D]`` whose slack is NaN (must never be read), and the tree."""
    dtype, batch, kv_heads, group, head_dim, nodes, prefix, slack, kind, _ = case
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, nodes, kv_heads * group, head_dim, generator=gen).to(dtype).transpose(1, 2)
    key, value = (torch.randn(batch, kv_heads, prefix + nodes + slack, head_dim, generator=gen).to(dtype) for _ in "kv")
    key[:, :, prefix + nodes :] = float("nan")
    value[:, :, prefix + nodes :] = float("nan")
    return query, key, value, TreeMeta.from_parents(make_parents(kind, nodes, gen), prefix)


def case_id(case: tuple) -> str:
    dtype, batch, kv_heads, group, head_dim, nodes, prefix, slack, kind, split = case
    return f"{str(dtype)[6:]}-B{batch}-Hkv{kv_heads}x{group}-D{head_dim}-N{nodes}-P{prefix}+{slack}-{kind}-split{split}"


@needs_kernel
@pytest.mark.parametrize("case", EXPLICIT_CASES + random_cases(36), ids=case_id)
def test_kernel_matches_reference(case: tuple) -> None:
    query, key, value, meta = make_inputs(case, seed=zlib.crc32(case_id(case).encode()))
    scaling = query.shape[-1] ** -0.5
    out = tree_attention(query, key, value, meta, scaling, prefix_split_len=case[-1])
    end = meta.prefix_len + meta.num_nodes
    upcast = (t.float() for t in (query, key[:, :, :end], value[:, :, :end]))
    expected = sdpa_tree_reference(*upcast, meta, scaling)
    assert out.shape == expected.shape and out.dtype == query.dtype
    assert torch.isfinite(out).all()
    assert (out.float() - expected).abs().max().item() < TOLERANCE[query.dtype]


@needs_kernel
def test_kernel_rejects_unsupported_inputs() -> None:
    query, key, value, meta = make_inputs((torch.float32, 1, 1, 2, 16, 4, 3, 0, "chain", None), seed=0)
    with pytest.raises(ValueError, match="head_dim"):
        tree_attention(query[..., :12], key[..., :12], value[..., :12], meta, 0.25)
    with pytest.raises(ValueError, match="nodes"):
        tree_attention(query[:, :, :3], key, value, meta, 0.25)
    with pytest.raises(ValueError, match="dtype|share"):
        tree_attention(query, key.half(), value.half(), meta, 0.25)


# ---------------------------------------------------------------- inside a transformers model

PREFIX_LEN = 11
TREE_PARENTS = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 3, 6, 5])


def tiny_qwen3(attn_implementation: str) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen3ForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()  # float32


@pytest.fixture(scope="module")
def models() -> tuple[Qwen3ForCausalLM, Qwen3ForCausalLM]:
    """The same weights twice: ``sdpa`` and ``jetspec_tree``."""
    register()
    reference = tiny_qwen3("sdpa")
    tree = tiny_qwen3("jetspec_tree")
    tree.load_state_dict(reference.state_dict())
    return reference, tree


def cache_kwarg(model: Qwen3ForCausalLM) -> str:
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name is deprecated)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward(model: Qwen3ForCausalLM, ids: torch.Tensor, cache, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None], use_cache=True, **{cache_kwarg(model): cache}, **kwargs).logits[0]


def dense_tree_mask(parents: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """The ``(1, 1, N, P + N)`` additive float mask a plain sdpa model needs for the tree step."""
    visible = TreeMeta.from_parents(parents, prefix_len).visibility(prefix_len + parents.numel())
    return torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("static", [False, True], ids=["dynamic_cache", "static_cache"])
def test_tree_step_matches_sdpa_with_dense_mask(models, static: bool) -> None:
    reference, tree = models
    gen = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 97, (PREFIX_LEN,), generator=gen)
    tokens = torch.randint(0, 97, (TREE_PARENTS.numel(),), generator=gen)
    position_ids = (PREFIX_LEN + depths(TREE_PARENTS))[None]

    ref_cache = DynamicCache()
    tree_cache = StaticCache(config=tree.config, max_cache_len=40) if static else DynamicCache()
    assert torch.allclose(forward(tree, prefix, tree_cache), forward(reference, prefix, ref_cache), atol=1e-5)

    mask = dense_tree_mask(TREE_PARENTS, PREFIX_LEN)
    expected = forward(reference, tokens, ref_cache, attention_mask=mask, position_ids=position_ids)
    meta = TreeMeta.from_parents(TREE_PARENTS, PREFIX_LEN)
    got = forward(tree, tokens, tree_cache, position_ids=position_ids, tree_meta=meta)
    assert (got - expected).abs().max().item() <= 1e-4

    causal = forward(reference, tokens, DynamicCache(), position_ids=position_ids)  # sanity: the tree mask matters
    assert (causal - expected).abs().max().item() > 1e-2


def test_without_tree_meta_behaves_like_sdpa(models) -> None:
    reference, tree = models
    ids = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(6))
    ref_cache, tree_cache = DynamicCache(), DynamicCache()
    for chunk in (ids[:12], ids[12:13], ids[13:17], ids[17:18]):  # prefill, decode, chunked prefill, decode
        expected = forward(reference, chunk, ref_cache)
        assert torch.equal(forward(tree, chunk, tree_cache), expected)


def test_register_is_idempotent_and_validates_names() -> None:
    assert register() == register() == "jetspec_tree"
    assert register("my_tree") == "my_tree"
    for bad in ("flash_tree", "org/tree"):
        with pytest.raises(ValueError):
            register(bad)


@needs_kernel
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_jetspec_generation_through_the_kernel_equals_greedy(family):
    from helpers import ScrambledOracle, assert_same_tokens, greedy_reference, jetspec, make_target

    model = make_target(family, seed=12)
    prompt = torch.tensor([[5, 17, 33, 9, 71]])
    reference = greedy_reference(model, prompt, max_new_tokens=24)
    # retrieval off: the tree is the drafter's full budget, not sized by a cost curve timed on a busy machine
    out = jetspec(model, prompt, drafter=ScrambledOracle(reference, 128, 8, seed=1), tree_budget=16, retrieval=False,
                  tree_kernel=True, max_new_tokens=24, return_dict_in_generate=True)
    assert_same_tokens(reference, out.sequences)
    assert max(out.accept_lengths) > 1
    assert model.config._attn_implementation == "sdpa"  # restored after the tree steps
