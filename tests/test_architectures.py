"""Targets beyond Llama/Qwen3 full attention: sliding-window models (Mistral, Gemma 2, Qwen3 with
``use_sliding_window``; all layers or mixed with full ones), GPT-2/Falcon-style ``.h`` layer lists, and the clear
errors for attention a tree mask cannot express. Windows here are far shorter than the generations, so every
run attends across the window's edge."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import transformers
from helpers import ScrambledOracle, assert_same_tokens, greedy_reference
from packaging.version import Version
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache

import hf_jetspec
from hf_jetspec import JetSpecHead
from hf_jetspec.attention import plan_tree_attention, sliding_window
from hf_jetspec.cache import cache_kwarg, full_layers
from hf_jetspec.tree import DraftTree
from hf_jetspec.verify import verify_tree

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, max_position_embeddings=512, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]


def windowed(kind: str, window: int):
    """(model type, config kwargs) of a sliding-window family: ``mistral`` (every layer slides, one mask),
    ``qwen3`` (first layer full, the rest slide: a mask per kind), ``gemma2`` (explicit mixed ``layer_types``)."""
    return {
        "mistral": ("mistral", dict(sliding_window=window)),
        "qwen3": ("qwen3", dict(head_dim=8, use_sliding_window=True, sliding_window=window, max_window_layers=1)),
        "gemma2": ("gemma2", dict(head_dim=8, sliding_window=window, layer_types=MIXED)),
    }[kind]


_MODELS: dict = {}


def make(model_type: str, seed: int = 0, **extra):
    key = (model_type, seed, tuple(sorted((k, str(v)) for k, v in extra.items())))
    if key not in _MODELS:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**COMMON, **extra})).eval()
        model.generation_config.pad_token_id = 0
        model.generation_config.eos_token_id = None
        _MODELS[key] = model
    return _MODELS[key]


def strategies(model, free_run, seed: int, block: int = 6, head: bool = True):
    """Every greedy strategy, as ``name -> generate() kwargs``; without ``head``, no fresh head (for targets
    `JetSpecHead.for_target` refuses)."""
    runs = {
        "jetspec-oracle": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=False,
                               drafter=ScrambledOracle(free_run, VOCAB, block, seed=seed)),
        "jetspec-merged": dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=True,
                               node_cost=None, drafter=ScrambledOracle(free_run, VOCAB, block, seed=seed)),
        "suffix": dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None),
        "jacobi": dict(custom_generate=hf_jetspec.jacobi_generate),
        "speculative-jacobi": dict(custom_generate=hf_jetspec.speculative_jacobi_generate, draft_model=model),
    }
    if head:
        runs["jetspec-head"] = dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=8,
                                    draft_head=JetSpecHead.for_target(model, block_size=block, num_hidden_layers=1))
    return runs


@pytest.mark.parametrize("case", range(9))
def test_sliding_window_targets_are_lossless(case):
    rng = random.Random(case)
    kind = ("mistral", "qwen3", "gemma2")[case % 3]
    window = rng.randint(3, 10)
    model_type, extra = windowed(kind, window)
    model = make(model_type, seed=case, **extra)
    prompt = torch.randint(3, VOCAB, (1, rng.randint(1, 14)), generator=torch.Generator().manual_seed(case))
    max_new = rng.randint(20, 40)
    free_run = greedy_reference(model, prompt, max_new_tokens=max_new)
    assert prompt.shape[1] + max_new > 2 * window
    torch.manual_seed(case)
    for name, kwargs in strategies(model, free_run, seed=case).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=max_new, **kwargs)
        assert_same_tokens(free_run, out, f"[{kind} window={window} {name}]")


@pytest.mark.parametrize("kind", ["qwen3", "gemma2"])
def test_mixed_window_target_with_a_static_cache(kind):
    model_type, extra = windowed(kind, 5)
    model = make(model_type, seed=3, **extra)
    prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    free_run = greedy_reference(model, prompt, max_new_tokens=30)
    out = model.generate(prompt, do_sample=False, max_new_tokens=30, cache_implementation="static",
                         custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=False,
                         drafter=ScrambledOracle(free_run, VOCAB, 6, seed=3))
    assert_same_tokens(free_run, out, f"[{kind} static]")


@pytest.mark.parametrize("window", [4, 7, 64])
def test_static_cache_of_sliding_layers_only(window):
    """Every layer slides: a window at least as long as the generation is a full cache already; a shorter one has
    lost the cache's length, which the call's max_length (prompt + new tokens) gives back. Every strategy, with
    trees reaching the cache's end."""
    model = make("mistral", seed=4, sliding_window=window)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    free_run = greedy_reference(model, prompt, max_new_tokens=26)
    for name, kwargs in strategies(model, free_run, seed=4).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=26, cache_implementation="static", **kwargs)
        assert_same_tokens(free_run, out, f"[mistral static, window {window}, {name}]")
    # Without a length to take (a bare cache), the call names the fix instead of failing inside the model.
    cache = StaticCache(config=model.config, max_cache_len=32)
    assert all(type(layer).__name__ == "StaticSlidingWindowLayer" for layer in cache.layers) or window >= 32
    if window < 32:
        with pytest.raises(ValueError, match="cache_implementation='dynamic'"):
            full_layers(cache, window)
        assert all(layer.max_cache_len == 40 for layer in full_layers(cache, window, max_length=40).layers)


def random_tree(rng: random.Random, size: int) -> DraftTree:
    """A random tree, deep and bushy: each node hangs under one of the three latest."""
    tokens, parents, depths = [rng.randrange(3, VOCAB)], [-1], [0]
    for _ in range(size - 1):
        parent = rng.randrange(max(0, len(tokens) - 3), len(tokens))
        tokens.append(rng.randrange(3, VOCAB))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return DraftTree.from_lists(tokens, parents, depths)


def path_tokens(tree: DraftTree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return path[::-1]


@pytest.mark.parametrize("kind", ["mistral", "qwen3", "gemma2"])
@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_tree_logits_match_plain_forwards_of_each_path(kind, cache_kind):
    """The verified logits at every node of a random deep tree equal a plain forward of prefix + that node's
    path: the window is applied to prefix keys and to ancestors alike."""
    window = 4
    model_type, extra = windowed(kind, window)
    model = make(model_type, seed=5, **extra)
    rng = random.Random(5)
    tree = random_tree(rng, 14)
    assert int(tree.depths.max()) > window
    prefix = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))
    cache = DynamicCache(config=model.config) if cache_kind == "dynamic" else \
        StaticCache(config=model.config, max_cache_len=64)
    cache = full_layers(cache, sliding_window(model)[0], max_length=64)
    key = cache_kwarg(model)
    with torch.no_grad():
        model(input_ids=prefix, use_cache=True, **{key: cache})
        logits = verify_tree(model, tree, cache, prefix.shape[1], plan_tree_attention(model, False), key)
        for node in range(len(tree)):
            ids = torch.cat((prefix, torch.tensor([path_tokens(tree, node)])), dim=1)
            expected = model(input_ids=ids).logits[0, -1]
            torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4, msg=f"node {node}")


def test_window_mask_of_a_chain_is_the_sliding_causal_mask():
    chain = DraftTree.from_lists(list(range(3, 9)), [-1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5])
    prefix, window = 5, 3
    mask = chain.attention_mask(prefix, torch.float32, window=window)[0, 0]
    query = torch.arange(prefix, prefix + 6)[:, None]
    key = torch.arange(prefix + 6)[None, :]
    expected = (key <= query) & (query - key < window)
    assert torch.equal(mask == 0, expected)


def test_attention_kinds_a_tree_mask_cannot_express_are_refused():
    model = make("llama4_text", seed=6, head_dim=8, attention_chunk_size=8)
    prompt = torch.randint(3, VOCAB, (1, 5))
    with pytest.raises(ValueError, match="chunked_attention"):
        model.generate(prompt, do_sample=False, max_new_tokens=5, custom_generate=hf_jetspec.suffix_generate)


def test_kernel_request_on_a_sliding_target_is_refused():
    model_type, extra = windowed("gemma2", 4)
    model = make(model_type, seed=7, **extra)
    with pytest.raises(ValueError, match="sliding window"):
        plan_tree_attention(model, use_kernel=True)
    assert plan_tree_attention(model).window == 4 and plan_tree_attention(model).mixed


@pytest.mark.parametrize("model_type,extra", [
    ("gpt2", dict(n_embd=32, n_layer=2, n_head=4, n_positions=512)),
    ("falcon", dict(new_decoder_architecture=False)),
])
def test_h_layer_targets(model_type, extra):
    """GPT-2 and Falcon keep their blocks in ``transformer.h``: the head taps them, every strategy runs."""
    model = make(model_type, seed=8, **extra)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(8))
    free_run = greedy_reference(model, prompt, max_new_tokens=24)
    torch.manual_seed(8)
    for name, kwargs in strategies(model, free_run, seed=8).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=24, **kwargs)
        assert_same_tokens(free_run, out, f"[{model_type} {name}]")


@pytest.mark.parametrize("model_type,extra", [
    ("bloom", dict(n_head=4, n_layer=2)),
    ("mpt", dict(d_model=32, n_heads=4, n_layers=2, use_cache=True)),
    ("falcon", dict(new_decoder_architecture=False, alibi=True)),
])
def test_alibi_targets_are_refused(model_type, extra):
    """ALiBi biases come from cache slots (Bloom: from the 2D mask), not from the position ids a tree step passes:
    MPT's merged trees returned other tokens than plain greedy, Bloom crashed on the 4D mask. Every strategy now
    refuses them by name."""
    model = make(model_type, seed=9, **extra)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(9))
    free_run = greedy_reference(model, prompt, max_new_tokens=8)
    with pytest.raises(ValueError, match="uses ALiBi position biases"):
        JetSpecHead.for_target(model)
    for name, kwargs in strategies(model, free_run, seed=9, head=False).items():
        with pytest.raises(ValueError, match="uses ALiBi position biases"):
            model.generate(prompt, do_sample=False, max_new_tokens=8, **kwargs)


@pytest.mark.parametrize("model_type,extra,message", [
    # positions from cache slots: the BART-family decoders, RoFormer (sinusoidal from the cache length)
    ("bart", dict(d_model=32, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64),
     "takes no position_ids"),
    ("roformer", dict(embedding_size=32), "takes no position_ids"),
    # no KV cache at all
    ("openai-gpt", dict(n_embd=32, n_layer=2, n_head=4), "takes no KV cache"),
    ("rwkv", dict(attention_hidden_size=32), "takes no KV cache"),
    # masks built from lengths; state-space layers
    ("xlm", dict(emb_dim=32, n_layers=2, n_heads=4, causal=True, is_decoder=True), "builds its attention masks"),
    ("mamba", dict(state_size=4, expand=2, conv_kernel=2), "has linear_attention layers"),
    # an indexer that keeps sink and local tokens by cache slot (Kolibri 1.1): other tokens with the fix that makes
    # DeepSeek sparse attention lossless (indexer keys compacted with the cache)
    ("kolibri1_1", dict(hidden_size=64, head_dim=16, sliding_window=5, index_layers=[1], kv_source_layers=[0, 1, 1],
                        layer_types=["sliding_attention", "indexed_attention", "indexed_attention"], index_topk=4,
                        index_pool_size=16, index_compression=4, index_num_heads=2, index_num_local_tokens=2,
                        index_num_sink_tokens=1, mlp_only_layers=[0], mlp_only_intermediate_size=64,
                        moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                        shared_expert_intermediate_size=32), "keeps sink and local tokens by cache slot"),
])
def test_targets_a_tree_cannot_be_verified_on_are_refused(model_type, extra, message):
    """Found by running every strategy on every causal-LM family transformers 5.25 ships (tiny random configs):
    the BART-family decoders (BartForCausalLM, Marian, mBART, Pegasus, MVP, TrOCR, BigBird-Pegasus) and RoFormer
    returned other tokens than plain greedy with branching trees (their positions come from cache slots; chains
    happened to match); GPT-1, RWKV, XLNet, XLM, ProphetNet, CPM-Ant, Mamba crashed inside transformers or hf_jetspec.
    Each is now refused by name, by every strategy, before anything runs on it; plain generate() still works."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    model = make(model_type, seed=3, **extra)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    free_run = greedy_reference(model, prompt, max_new_tokens=6)
    with pytest.raises(ValueError, match=message):  # a head for it, before anything else
        JetSpecHead.for_target(model)
    for name, kwargs in strategies(model, free_run, seed=3, head=False).items():
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, do_sample=False, max_new_tokens=6, **kwargs)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_flex_attention_targets_on_cpu(model_type):
    """With attn_implementation="flex_attention" on CPU, plain generate() works (transformers passes block masks)
    but a verification forward with a dense tree mask made torch's compiled flex kernel index out of bounds (suffix,
    merged trees) or corrupt the heap and kill the process (Jacobi). Off CUDA, tree steps now run on sdpa.

    On some CPUs torch's compiled flex kernel itself is wrong at one decode length (torch 2.13, a 2-core EPYC: this
    Llama's logits off by 2.2 from eager attention at the 16th token), so plain generate() is no reference there:
    the strategies must still run, and the tokens are compared only where plain generate() agrees with eager."""
    torch.manual_seed(20)
    config = AutoConfig.for_model(model_type, **COMMON)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention").eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    assert model.config._attn_implementation == "flex_attention"
    prompt = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(20))
    try:
        free_run = greedy_reference(model, prompt, max_new_tokens=20)
    except Exception as err:  # noqa: BLE001 (torch inductor needs a working C++ toolchain for CPU flex)
        pytest.skip(f"plain generate() with flex_attention fails on this machine: {type(err).__name__}")
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    eager.generation_config = model.generation_config
    kernel_is_right = torch.equal(free_run, greedy_reference(eager, prompt, max_new_tokens=20))
    for name, kwargs in strategies(model, free_run, seed=20).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=20, **kwargs)
        assert out.shape == free_run.shape, name
        if kernel_is_right:
            assert_same_tokens(free_run, out, f"[{model_type} flex_attention {name}]")
    assert model.config._attn_implementation == "flex_attention"
    if not kernel_is_right:
        pytest.skip("torch's CPU flex kernel and eager attention disagree on this machine: tokens not compared")


def test_heads_for_targets_with_an_odd_per_head_size():
    """GPT-NeoX / Phi / StableLM with hidden 36 and 4 heads (9 per head, partial rotary): `for_target` copied the 9
    and refused itself ("head_dim must be even for rotary embeddings"), so neither the default CLI strategy nor
    `train` could make a head. The head's attention is its own: it rounds up to 10."""
    model = make("gpt_neox", seed=1, hidden_size=36, num_attention_heads=4, rotary_pct=0.5)
    head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
    assert head.config.head_dim == 10
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    free_run = greedy_reference(model, prompt, max_new_tokens=20)
    for name, kwargs in strategies(model, free_run, seed=1).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=20, **kwargs)
        assert_same_tokens(free_run, out, f"[gpt_neox head_dim 9 {name}]")


def test_recurrent_depth_targets_decode_losslessly_and_refuse_heads_by_name():
    """HRM cycles two small layer stacks several times per token (num_hidden_layers counts the cycles' cache layers,
    not modules): a head has no single layer output to tap, and `for_target` said only "Cannot find the decoder
    layers". It now names the cycling; the strategies that need no taps stay lossless."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "hrm_text" not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no hrm_text")
    model = make("hrm_text", seed=5, head_dim=8, H_cycles=2, L_cycles=1, L_bp_cycles=[1], num_layers_per_stack=2,
                 num_hidden_layers=8)
    with pytest.raises(ValueError, match=r"runs its decoder layers several times per token .* num_hidden_layers=8"):
        JetSpecHead.for_target(model)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    free_run = greedy_reference(model, prompt, max_new_tokens=16)
    for name, kwargs in strategies(model, free_run, seed=5, head=False).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=16, **kwargs)
        assert_same_tokens(free_run, out, f"[hrm_text {name}]")


def tiny_blt():
    """A BLT (byte latent transformer) of four width-32 sub-models; transformers' BLT generate() reads a top-level
    num_hidden_layers its config lacks."""
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8)
    config = AutoConfig.for_model("blt", **{f"{part}_config": dict(small)
                                            for part in ("patcher", "encoder", "decoder", "global")})
    config.encoder_config.hidden_size_global = config.decoder_config.hidden_size_global = 32
    config.global_config.encoder_cross_output_size = 32 * config.cross_attn_k
    config.num_hidden_layers = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model


@pytest.mark.parametrize("model_type,message", [
    ("blt", "groups its bytes into patches by their entropy within each forward"),
    # transformers 5.17 names its state `cache_params` (no KV cache); later versions `cache`, without positions
    ("xlstm", r"takes no (KV cache|position_ids: .* \(or folds them into a recurrent state\))"),
])
def test_byte_patching_and_recurrent_targets_are_refused_by_name(model_type, message):
    """BLT (bytes grouped into patches by the entropy of each forward's bytes) crashed inside its attention in every
    strategy and in `for_target`; xLSTM's refusal spoke of cache slots only. Both are refused by name, by a fresh
    head and by every strategy, before anything runs on them (xLSTM's own generate() fails on tiny configs, so the
    oracle follows the prompt)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    model = tiny_blt() if model_type == "blt" else make("xlstm", seed=5, num_heads=4, num_blocks=2, embedding_dim=32)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=message):
        JetSpecHead.for_target(model)
    for name, kwargs in strategies(model, prompt, seed=5, head=False).items():
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, do_sample=False, max_new_tokens=6, **kwargs)


def test_heads_for_targets_that_name_fields_differently():
    """`JetSpecHead.for_target` reads sizes under each family's names (GPT-2's ``n_inner``, which may be None;
    Cohere 2 MoE's ``layer_norm_eps`` with ``rms_norm_eps`` None): it failed with "'GPT2Config' object has no
    attribute 'intermediate_size'" and "unsupported operand type(s) for +: 'Tensor' and 'NoneType'"."""
    from transformers import AutoConfig as Auto

    for model_type, kwargs in [("gpt2", dict(n_embd=32, n_layer=2, n_head=4)),
                               ("cohere2_moe", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=64,
                                                    moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2))]:
        try:
            config = Auto.for_model(model_type, vocab_size=VOCAB, pad_token_id=0, **kwargs)
        except ValueError:
            continue  # a transformers version without this family
        assert getattr(config, "intermediate_size", None) is None or model_type != "gpt2"
        torch.manual_seed(4)
        model = AutoModelForCausalLM.from_config(config).eval()
        model.generation_config.eos_token_id = None
        head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
        assert head.config.intermediate_size > 0 and head.config.rms_norm_eps > 0
        prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
        free_run = greedy_reference(model, prompt, max_new_tokens=16)
        out = model.generate(prompt, do_sample=False, max_new_tokens=16, custom_generate=hf_jetspec.jetspec_generate,
                             draft_head=head, tree_budget=8)
        assert_same_tokens(free_run, out, f"[{model_type} head]")


def test_bert_style_stacks_and_factorised_embeddings():
    """BERT-style stacks used as decoders keep their layers in ``encoder.layer``: a head taps them (it was refused:
    "Cannot find the decoder layers of BertLMHeadModel"). ELECTRA factorises its embeddings (narrower than the
    hidden size) and a head, which shares the target's embeddings and LM head at the hidden size, crashed inside its
    RMSNorm; it is refused by name, and the training-free strategies stay lossless."""
    bert = make("bert", seed=6, is_decoder=True)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(6))
    free_run = greedy_reference(bert, prompt, max_new_tokens=16)
    for name, kwargs in strategies(bert, free_run, seed=6).items():
        out = bert.generate(prompt, do_sample=False, max_new_tokens=16, **kwargs)
        assert_same_tokens(free_run, out, f"[bert {name}]")
    electra = make("electra", seed=6, is_decoder=True, embedding_size=16)
    with pytest.raises(ValueError, match="token embeddings 16-dim, LM head 16-dim, hidden size 32"):
        JetSpecHead.for_target(electra)
    free_run = greedy_reference(electra, prompt, max_new_tokens=16)
    for name, kwargs in [("oracle", dict(custom_generate=hf_jetspec.jetspec_generate, tree_budget=12, retrieval=False,
                                         drafter=ScrambledOracle(free_run, VOCAB, 6, seed=6))),
                         ("suffix", dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None)),
                         ("jacobi", dict(custom_generate=hf_jetspec.jacobi_generate))]:
        out = electra.generate(prompt, do_sample=False, max_new_tokens=16, **kwargs)
        assert_same_tokens(free_run, out, f"[electra {name}]")


def test_use_cache_false_by_the_models_own_config_is_named():
    """MPT's config defaults to use_cache=False: the error says where that can come from and what to pass."""
    model = make("llama", seed=9, use_cache=False)
    model.generation_config.use_cache = False
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match="use_cache is False .*generation_config.*pass use_cache=True"):
        model.generate(prompt, do_sample=False, max_new_tokens=8, custom_generate=hf_jetspec.jacobi_generate)
    out = model.generate(prompt, do_sample=False, max_new_tokens=8, use_cache=True,
                         custom_generate=hf_jetspec.jacobi_generate)
    assert_same_tokens(greedy_reference(model, prompt, max_new_tokens=8, use_cache=True), out)


def test_multimodal_target_on_text():
    """Gemma 3 with its vision tower (``Gemma3ForConditionalGeneration``): token ids, windows and layers live on the
    text config and the language model; text prompts decode losslessly with every strategy."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = {**COMMON, "head_dim": 8, "sliding_window": 5, "layer_types": MIXED}
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    torch.manual_seed(9)
    model = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=VOCAB - 1,
        boi_token_index=VOCAB - 2, eoi_token_index=VOCAB - 3)).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    prompt = torch.randint(3, VOCAB - 4, (1, 8), generator=torch.Generator().manual_seed(9))
    free_run = greedy_reference(model, prompt, max_new_tokens=24)
    for name, kwargs in strategies(model, free_run, seed=9).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=24, **kwargs)
        assert_same_tokens(free_run, out, f"[gemma3 multimodal {name}]")


@pytest.mark.parametrize("kind", ["mistral", "gemma2"])
def test_sliding_window_sampling_is_plain_sampling_draw_for_draw(kind):
    """"Sample, then match" makes one draw per emitted token from the target's processed distribution: with the
    same seed it returns plain ``generate(do_sample=True)``'s tokens, across the window's edge."""
    model_type, extra = windowed(kind, 4)
    model = make(model_type, seed=10, **extra)
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(10))
    assert_sampling_is_plain_sampling(model, prompt, 24, kind)


def assert_sampling_is_plain_sampling(model, prompt: torch.Tensor, max_new: int, label: str) -> None:
    """JetSpec ("match" rule) and suffix decoding return plain ``generate(do_sample=True)``'s tokens for 4 seeds."""
    kwargs = dict(do_sample=True, temperature=0.8, top_k=20, max_new_tokens=max_new)
    for seed in range(4):
        torch.manual_seed(seed)
        plain = model.generate(prompt, **kwargs)
        for name, extra_kwargs in [("jetspec", dict(custom_generate=hf_jetspec.jetspec_generate, retrieval=False,
                                                    drafter=ScrambledOracle(plain, VOCAB, 6, seed=seed))),
                                   ("suffix", dict(custom_generate=hf_jetspec.suffix_generate, node_cost=None))]:
            torch.manual_seed(seed)
            out = model.generate(prompt, **kwargs, **extra_kwargs)
            assert_same_tokens(plain, out, f"[{label} {name} seed={seed}]")


# RoPE whose frequencies depend on the forward's longest position (hf_jetspec.rope): Phi-3's longrope switches from
# short to long factors at original_max_position_embeddings (and generate() recomputes the sequence there); dynamic
# NTK rescales at every new position past max_position_embeddings.
ROPE = {
    "longrope": ("phi3", dict(max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.1, 1.2, 1.3],
        long_factor=[2.0, 3.0, 4.0, 5.0], original_max_position_embeddings=16))),
    "dynamic": ("llama", dict(max_position_embeddings=24, rope_parameters=dict(rope_type="dynamic", factor=2.0,
                                                                                rope_theta=10000.0))),
}


# transformers 5.17's Phi-3 generate() is itself broken past the switch: its prepare_inputs drops the cache but
# still feeds only the newest token, and does so at every later step (each forward sees one token). 5.24 recomputes
# the sequence; hf_jetspec does what 5.24 does, so on older versions there is nothing to compare with.
LONGROPE_COMPARABLE = Version(transformers.__version__) >= Version("5.24")


def skip_broken_longrope(kind: str) -> None:
    if kind == "longrope" and not LONGROPE_COMPARABLE:
        pytest.skip("Phi-3 generate() past the longrope switch is broken in transformers < 5.24 (seen on 5.17)")


@pytest.mark.parametrize("case", range(8))
def test_rope_switch_targets_are_lossless(case):
    """Generations that cross the switch, from prompts before it, just before it and (longrope) at and past it:
    every strategy returns plain greedy's tokens. Dynamic NTK keeps its frequencies in the rotary module between
    calls and resets them only for a prompt shorter than the switch, so from a longer prompt even two plain
    generate() calls differ: those prompts are not compared."""
    rng = random.Random(case)
    kind = ("longrope", "dynamic")[case % 2]
    skip_broken_longrope(kind)
    model_type, extra = ROPE[kind]
    model = make(model_type, seed=case, **extra)
    switch = hf_jetspec.rope.rope_switch(model)
    assert switch == hf_jetspec.rope.RopeSwitch(16 if kind == "longrope" else 24, per_position=kind == "dynamic")
    lengths = [rng.randint(1, 10), switch.position - 1] + [switch.position, switch.position + 3] * (kind == "longrope")
    prompt_len = lengths[case // 2 % len(lengths)]
    prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(case))
    max_new = rng.randint(30, 40)
    free_run = greedy_reference(model, prompt, max_new_tokens=max_new)
    for name, kwargs in strategies(model, free_run, seed=case).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=max_new, **kwargs)
        assert_same_tokens(free_run, out, f"[{kind} prompt {prompt_len} {name}]")


def test_rope_switch_limits_forwards_not_speed_elsewhere():
    """Only the RoPE types that need it are limited; an oracle still accepts whole blocks before a longrope switch
    and after it, and after a dynamic-NTK switch every step verifies the anchor alone."""
    from hf_jetspec.rope import RopeSwitch, positions_left, rope_switch

    for rope_type in ("default", "linear", "yarn"):
        extra = {} if rope_type == "default" else dict(rope_parameters=dict(rope_type=rope_type, factor=2.0,
                                                                            rope_theta=10000.0))
        assert rope_switch(make("llama", seed=0, max_position_embeddings=24, **extra)) is None
    assert positions_left(None, 100) is None
    assert [positions_left(RopeSwitch(16, False), p) for p in (0, 10, 15, 16, 40)] == [15, 5, 0, None, None]
    assert [positions_left(RopeSwitch(16, True), p) for p in (10, 15, 16, 40)] == [5, 0, 0, 0]
    for kind in ("longrope", "dynamic") if LONGROPE_COMPARABLE else ("dynamic",):
        model = make(ROPE[kind][0], seed=1, **ROPE[kind][1])
        prompt = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
        free_run = greedy_reference(model, prompt, max_new_tokens=48)
        out = model.generate(prompt, do_sample=False, max_new_tokens=48, custom_generate=hf_jetspec.jetspec_generate,
                             drafter=hf_jetspec.OracleDrafter(free_run, VOCAB, 6), tree_budget=8, retrieval=False,
                             return_dict_in_generate=True)
        assert_same_tokens(free_run, out.sequences, kind)
        accepted, position = out.accept_lengths, prompt.shape[1]
        steps = []
        for length in accepted:  # the anchor of each step sits at `position`
            steps.append((position, length))
            position += length
        before = [n for p, n in steps if p < 16]
        after = [n for p, n in steps if p >= 25]
        assert max(before) == 6 and all(p + n <= (16 if kind == "longrope" else 24) for p, n in steps if p < 16)
        assert (max(after) == 6) if kind == "longrope" else set(after) == {1}


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_rope_switch_sampling_is_plain_sampling_draw_for_draw(kind):
    skip_broken_longrope(kind)
    model = make(ROPE[kind][0], seed=11, **ROPE[kind][1])
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(11))
    assert_sampling_is_plain_sampling(model, prompt, 30, kind)


# Other decoder-only families transformers ships, as tiny random configs: each must run every strategy losslessly
# (a regression net for transformers upgrades; model types an installed version lacks are skipped).
MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8)
DSA = dict(index_topk=4, index_head_dim=16, index_n_heads=16)  # 16 indexer heads: no score ties between forwards
ZOO = {
    "qwen2": dict(),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
    "olmo2": dict(),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, initializer_range=0.5),  # (at 0.2 greedy repeats a token)
    "granite": dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "cohere": dict(logit_scale=0.5),
    "stablelm": dict(partial_rotary_factor=0.5, initializer_range=0.5),
    "gemma": dict(head_dim=8),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=8, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                        first_k_dense_replace=1, moe_intermediate_size=32, n_group=1, topk_group=1,
                        initializer_range=0.1),
    "smollm3": dict(),
    "glm4": dict(),
    "helium": dict(head_dim=8),
    "nemotron": dict(),
    "gpt_neox": dict(),
    "gptj": dict(n_embd=32, n_head=4, n_layer=3, rotary_dim=4),
    "codegen": dict(n_embd=32, n_head=4, n_layer=3, rotary_dim=4),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32),
    # Gemma 4: a heterogeneous config (head_dim differs by layer, so reading config.head_dim raises); its last two
    # layers share the keys and values of earlier ones (their cache layers store nothing); per-layer inputs
    "gemma4_text": dict(head_dim=8, sliding_window=5, num_hidden_layers=6, num_kv_shared_layers=2,
                        layer_types=["sliding_attention", "full_attention"] * 3, hidden_size_per_layer_input=8,
                        vocab_size_per_layer_input=VOCAB),
    # Gemma 3n: KV sharing, AltUp (decoder layers output [streams, b, T, H]), per-layer intermediate sizes
    "gemma3n_text": dict(head_dim=8, sliding_window=5, num_hidden_layers=4, num_kv_shared_layers=2,
                         layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=VOCAB, intermediate_size=[64] * 4, altup_num_inputs=2,
                         laurel_rank=8, activation_sparsity_pattern=[0.0] * 4),
    "gemma3_text": dict(head_dim=8, sliding_window=5),
    "cohere2": dict(sliding_window=5),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=5),
    "exaone4": dict(sliding_window=5),
    "ernie4_5": dict(),
    "seed_oss": dict(head_dim=8),
    "ministral3": dict(head_dim=8),
    "olmo3": dict(sliding_window=5),
    "starcoder2": dict(),
    # found by the family sweep's "not built" rows, built by hand (4 December 2026): MLA, DeepSeek sparse attention
    # (indexed attention: an indexer keeps the top 4 keys, so short prompts already drop keys), DBRX's `.blocks`
    "deepseek_v2": dict(MLA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                        moe_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1, topk_method="greedy"),
    "glm4_moe_lite": dict(MLA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                          moe_intermediate_size=32, n_group=1, topk_group=1, mlp_layer_types=["dense", "sparse", "sparse"]),
    "minicpm3": dict(MLA, num_key_value_heads=4, scale_emb=12, scale_depth=1.4, dim_model_base=16),
    "deepseek_v32": dict(MLA, **DSA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, moe_intermediate_size=32, n_group=1, topk_group=1,
                         mlp_layer_types=["dense", "sparse", "sparse"], first_k_dense_replace=1),
    "glm_moe_dsa": dict(MLA, **DSA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, moe_intermediate_size=32, n_group=1, topk_group=1,
                        mlp_layer_types=["dense", "sparse", "sparse"], first_k_dense_replace=1),
    "dots3_note_text": dict(MLA, **DSA, num_key_value_heads=4, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                            n_shared_experts=1, moe_intermediate_size=32, n_group=1, topk_group=1,
                            shared_experts_intermediate_size=32, first_k_dense_replace=1, sliding_window=5,
                            swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=16,
                            swa_kv_lora_rank=16, swa_head_dim=16, swa_qk_nope_head_dim=8, swa_v_head_dim=8),
    "axk2": dict(MLA, **DSA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                 moe_intermediate_size=32, n_group=1, topk_group=1, mlp_layer_types=["dense", "sparse", "sparse"],
                 gated_norm_rank=16),
    "hy_v4": dict(MLA, **DSA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                  moe_intermediate_size=32),  # indexed attention and hyper-connections: 4 residual streams per layer
    "dbrx": dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=256, attn_config={"kv_n_heads": 2,
                 "rope_theta": 10000.0, "clip_qkv": 8.0}, ffn_config={"hidden_size": 32, "ffn_hidden_size": 64,
                 "moe_num_experts": 4, "moe_top_k": 2}),
}


@pytest.mark.parametrize("model_type", sorted(ZOO))
def test_architecture_zoo(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    model = make(model_type, seed=12, max_position_embeddings=128, **ZOO[model_type])
    rng = random.Random(model_type)
    prompt = torch.randint(3, VOCAB, (1, rng.randint(2, 10)), generator=torch.Generator().manual_seed(12))
    if "deepseek_sparse_attention" in (getattr(model.config, "layer_types", None) or ()):
        # DeepSeek sparse attention as older transformers (5.17) lay it out (another layer kind and cache): not verified,
        # refused by name
        with pytest.raises(ValueError, match="has deepseek_sparse_attention layers"):
            model.generate(prompt, do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.suffix_generate)
        return
    plain = model.generate(prompt, do_sample=False, max_new_tokens=24, return_dict_in_generate=True,
                           output_logits=True)
    free_run, logits = plain.sequences, torch.stack(plain.logits)
    for name, kwargs in strategies(model, free_run, seed=12).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=24, return_dict_in_generate=True,
                             output_logits=True, **kwargs)
        assert_same_tokens(free_run, out.sequences, f"[{model_type} {name}]")
        # every step's whole distribution, not only its argmax (float32 rounding of multi-token forwards)
        error = (torch.stack(out.logits) - logits).abs().max() / logits.abs().max().clamp(min=1)
        assert error < 1e-4, f"[{model_type} {name}] logits differ by {error:.1e} of their range"


IMAGE, VISION_START, VISION_END = VOCAB - 1, VOCAB - 3, VOCAB - 4


def vision_language_model(family: str):
    """A tiny random vision-language model and ``(model, image kwargs)`` for one 56x56 image: Qwen2-VL / Qwen3-VL
    (multimodal RoPE: 16 patches merged into 4 image tokens at grid positions, so the text after the image continues
    from the grid's largest position, 2 below its index), LLaVA or Gemma 3 (image tokens at ordinary positions;
    Gemma 3's attend to each other bidirectionally in the prefill)."""
    torch.manual_seed(9)
    if family == "gemma3":
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration

        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)
        model = Gemma3ForConditionalGeneration(Gemma3Config(
            # a smaller init: at 0.2 Gemma's scaled embeddings saturate and greedy repeats one token
            text_config={**COMMON, "head_dim": 8, "sliding_window": 5, "layer_types": MIXED, "initializer_range": 0.05},
            vision_config=vision, mm_tokens_per_image=4, image_token_index=IMAGE, boi_token_index=VISION_START, eoi_token_index=VISION_END))
        with torch.no_grad():  # initialised to zeros: the image would reach the text as zeros
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.3)
        image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    elif family == "paligemma":
        from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14, projection_dim=32)
        model = PaliGemmaForConditionalGeneration(PaliGemmaConfig(
            # a low RoPE base: a position off by one (PaliGemma's start at 1) changes the greedy tokens at once; a
            # larger init: at 0.2 greedy repeats one token
            text_config={**COMMON, "head_dim": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 10.0},
                         "initializer_range": 0.4},
            vision_config=vision, image_token_index=IMAGE, projection_dim=32,
            hidden_size=32, vocab_size=VOCAB))
        image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    elif family == "mllama":
        from transformers import MllamaConfig, MllamaForConditionalGeneration

        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_global_layers=1,
                      attention_heads=2, image_size=28, patch_size=14, max_num_tiles=2, vision_output_dim=32,
                      supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]], intermediate_layers_indices=[0])
        model = MllamaForConditionalGeneration(MllamaConfig(
            vision_config=vision, text_config={**COMMON, "num_hidden_layers": 3, "cross_attention_layers": [1]},
            image_token_index=VOCAB))  # the image token is the first of 8 extra embeddings
        with torch.no_grad():  # the cross-attention tanh gates start at 0: the image would contribute nothing
            for name, param in model.named_parameters():
                if name.endswith("gate") or name.endswith("_gate"):
                    param.fill_(1.0)
        # one image on 1 of its 2 tiles (aspect ratio [1, 1]; the second tile is padding)
        image = dict(pixel_values=torch.randn(1, 1, 2, 3, 28, 28), aspect_ratio_ids=torch.tensor([[1]]),
                     aspect_ratio_mask=torch.tensor([[[1, 0]]]))
    elif family == "llava":
        from transformers import LlavaConfig, LlavaForConditionalGeneration

        vision = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, image_size=56, patch_size=28, projection_dim=16)
        model = LlavaForConditionalGeneration(LlavaConfig(
            text_config={**COMMON, "model_type": "llama"}, vision_config=vision, image_token_index=IMAGE,
            vision_feature_layer=-1))
        image = dict(pixel_values=torch.randn(1, 3, 56, 56))
    else:
        from transformers import AutoModelForImageTextToText

        mrope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
        vision = dict(depth=1, hidden_size=32, num_heads=2, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2, in_channels=3)
        if family == "qwen3_vl":
            mrope["mrope_interleaved"] = True
            vision.update(hidden_size=16, out_hidden_size=32, intermediate_size=32, num_position_embeddings=16,
                          deepstack_visual_indexes=[0])
        else:
            vision.update(embed_dim=16, mlp_ratio=2)
        config = AutoConfig.for_model(
            family, text_config={**COMMON, "head_dim": 8, "rope_parameters": mrope, "rope_scaling": mrope},
            vision_config=vision, image_token_id=IMAGE, video_token_id=VOCAB - 2, vision_start_token_id=VISION_START,
            vision_end_token_id=VISION_END)
        model = AutoModelForImageTextToText.from_config(config)
        image = dict(pixel_values=torch.randn(16, 3 * 2 * 14 * 14), image_grid_thw=torch.tensor([[1, 4, 4]]))
    model.eval().generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model, image


def image_prompt(model, image: dict, before: int, after: int, seed: int) -> dict:
    """``generate()`` kwargs: ``before`` text tokens, the image (vision start, 4 image tokens, vision end), ``after``
    text tokens; ``mm_token_type_ids`` where the model takes them (transformers >= 5.25's Qwen-VL processors)."""
    import inspect

    text = torch.randint(3, VOCAB - 5, (1, before + after), generator=torch.Generator().manual_seed(seed))
    if "aspect_ratio_ids" in image:  # Mllama: one image token; the tokens from it on cross-attend to the used tiles
        ids = torch.cat([text[:, :before], torch.tensor([[VOCAB]]), text[:, before:]], dim=1)
        cross = torch.zeros(1, ids.shape[1], 1, 2, dtype=torch.long)
        cross[:, before:, 0, :1] = 1
        return dict(input_ids=ids, cross_attention_mask=cross, **image)
    ids = torch.cat([text[:, :before], torch.tensor([[VISION_START] + [IMAGE] * 4 + [VISION_END]]),
                     text[:, before:]], dim=1)
    inputs = dict(input_ids=ids, **image)
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters and "image_grid_thw" in image:
        inputs["mm_token_type_ids"] = (ids == IMAGE).int()
    return inputs


@pytest.mark.parametrize("family,after", [("qwen2_vl", 4), ("qwen2_vl", 0), ("qwen3_vl", 3), ("llava", 4),
                                          ("gemma3", 4), ("paligemma", 4), ("mllama", 4), ("mllama", 0)])
def test_image_prompts_are_lossless(family, after):
    """An image in the prompt: every strategy returns plain ``generate()``'s tokens (and the image changes them, so
    the test sees it). With multimodal RoPE the text after the image sits 2 positions below its index, PaliGemma's
    positions start at 1 (`hf_jetspec.rope.position_offset`); verifying at the index gave other tokens, for every
    strategy. Mllama cross-attends to the image from cache layers that hold it (never compacted) under a per-token
    ``cross_attention_mask`` (each new token repeats the last row); before, every strategy crashed or differed.
    ``after=0``: the prompt ends with the image. The logits of every step match plain decoding's to float32 rounding
    too (the whole distribution, which sampling draws from, not only its argmax)."""
    model, image = vision_language_model(family)
    inputs = image_prompt(model, image, before=3, after=after, seed=after)
    plain = model.generate(**inputs, do_sample=False, max_new_tokens=20, return_dict_in_generate=True,
                           output_logits=True)
    free_run, logits = plain.sequences, torch.stack(plain.logits)
    other = {k: torch.randn_like(v) if k == "pixel_values" else v for k, v in inputs.items()}
    assert not torch.equal(free_run, model.generate(**other, do_sample=False, max_new_tokens=20))
    for name, kwargs in strategies(model, free_run, seed=9).items():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=20, return_dict_in_generate=True,
                             output_logits=True, **kwargs)
        assert_same_tokens(free_run, out.sequences, f"[{family} image {name}]")
        assert (torch.stack(out.logits) - logits).abs().max() < 1e-4, f"[{family} image {name}] logits"


def test_cross_attention_target_text_prompts_head_taps_and_kernel():
    """Mllama without an image (its cross-attention layers hold nothing and are skipped) is lossless; a fresh head
    taps no cross-attention layer (a text-only prompt skips them) and a head that does is refused by name; the
    Triton kernel, which attends to the sequence only, is refused."""
    model, _ = vision_language_model("mllama")
    cross = hf_jetspec.config.cross_attention_layers(model)
    assert cross == {1}
    prompt = torch.randint(3, VOCAB - 5, (1, 8), generator=torch.Generator().manual_seed(3))
    free_run = greedy_reference(model, prompt, max_new_tokens=16)
    for name, kwargs in strategies(model, free_run, seed=3).items():
        out = model.generate(prompt, do_sample=False, max_new_tokens=16, **kwargs)
        assert_same_tokens(free_run, out, f"[mllama text {name}]")
    head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
    assert head.config.target_layer_ids == [0, 2]
    tapping = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1, target_layer_ids=[1, 2])
    with pytest.raises(ValueError, match=r"tap layers \[1\] are the target's cross-attention layers"):
        model.generate(prompt, do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.jetspec_generate,
                       draft_head=tapping)
    with pytest.raises(ValueError, match="cross-attention layers .* tree_kernel=None or False"):
        model.generate(prompt, do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.suffix_generate,
                       tree_kernel=True)


def test_image_batches_are_refused_text_batches_decode():
    """A batch with images is refused by name (transformers holds the batch's images flattened or encoded in one
    structure that rows cannot split); a text-only left-padded batch on a multimodal-RoPE model ([4, B, T] position
    ids) decodes as plain batched ``generate()``."""
    model, image = vision_language_model("qwen2_vl")
    inputs = image_prompt(model, image, before=3, after=4, seed=1)
    batch = {key: torch.cat([value, value]) for key, value in inputs.items()}
    with pytest.raises(ValueError, match="with a batch or padding: .*pass one prompt per call"):
        model.generate(**batch, do_sample=False, max_new_tokens=8, custom_generate=hf_jetspec.jacobi_generate)
    ids = torch.randint(3, VOCAB - 5, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    free_run = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    for name in ("jetspec-head", "suffix", "jacobi"):
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                             **strategies(model, free_run[:1], seed=2)[name])
        assert torch.equal(out, free_run), f"[qwen2_vl text batch {name}]"


def docs_script(name: str):
    """The module of ``docs/<name>.py`` (the sweeps are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_audio_batches_split_per_row_or_are_refused_by_name():
    """Batched audio prompts (Qwen2-Audio: ``input_features`` hold one entry per clip) decode row by row as plain
    batched ``generate()`` when every prompt holds one clip; when they hold other numbers the per-row split cannot be
    right, and the model's own mismatch error comes back naming the split and the way out."""
    sweep = docs_script("vlm_sweep")
    model, inputs = sweep.qwen2_audio()[:2]
    other = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in inputs.items()}
    batch = {k: torch.cat([inputs[k], other[k]]) for k in inputs}
    plain = model.generate(**batch, do_sample=False, max_new_tokens=10)
    head = JetSpecHead.for_target(model, block_size=6, num_hidden_layers=1)
    for name, extra in (("jetspec", dict(draft_head=head)), ("suffix", {}), ("jacobi", {})):
        out = model.generate(**batch, do_sample=False, max_new_tokens=10,
                             custom_generate=getattr(hf_jetspec, f"{name}_generate"), **extra)
        assert torch.equal(out, plain), name
    ids = inputs["input_ids"][0]
    two_clips = torch.cat([ids, ids[ids == sweep.AUDIO]])[None]  # the first prompt holds both clips
    text = torch.randint(3, VOCAB - 12, two_clips.shape, generator=torch.Generator().manual_seed(1))
    batch["input_ids"] = torch.cat([two_clips, text])
    model.generate(**batch, do_sample=False, max_new_tokens=4)  # plain generate() takes it
    with pytest.raises(ValueError, match="Row 0 of the batch failed inside Qwen2AudioForConditionalGeneration .*"
                                         "input_features.* split one entry per row"):
        model.generate(**batch, do_sample=False, max_new_tokens=4, custom_generate=hf_jetspec.jacobi_generate)


def test_family_sweep_script(capsys):
    """docs/family_sweep.py (every causal-LM family through every strategy, run after transformers upgrades)
    classifies families: a supported one is lossless, one that takes no position_ids is refused."""
    sweep = docs_script("family_sweep")
    assert sweep.main(["llama", "bart"]) == 0
    table = capsys.readouterr().out
    assert "| lossless | 1 | llama |" in table and "| refused | 1 | bart |" in table
    assert "| bart | refused | ValueError: BartForCausalLM takes no position_ids" in table


def test_vlm_sweep_script(capsys):
    """docs/vlm_sweep.py (images, videos and audio in the prompt of multimodal families, run after transformers
    upgrades): the Mllama (cross-attention; 2 tiles; 2 images) and Gemma 4 (KV sharing, bidirectional image
    attention) rows come out lossless."""
    sweep = docs_script("vlm_sweep")
    assert sweep.main(["mllama", "gemma4"]) == 0
    table = capsys.readouterr().out
    assert "| lossless | 5 |" in table and "| mllama (2 images) | MllamaForConditionalGeneration | lossless |" in table
