"""Vision-language models with an image in the prompt, as tiny random models, through every hf_jetspec strategy.

    .venv/bin/python docs/vlm_sweep.py                      # every family, a Markdown table on stdout
    .venv/bin/python docs/vlm_sweep.py mllama gemma4        # some families (with their variant rows)
    .venv/bin/python docs/vlm_sweep.py > docs/results/vlm_sweep.md

A regression net for transformers upgrades: rerun it after each one (a release changes how models place image
tokens, position them, mask them, or cache them; docs/family_sweep.py covers text prompts). For each
image-text-to-text family: build a tiny random model (a text decoder of two to four layers of width 32, a vision
tower of one or two), a prompt of text, one image and more text (placeholder tokens and extra inputs as the
family's processor gives them), run plain greedy ``generate()`` for 20 tokens, then every strategy of
``tests/test_architectures.py::strategies`` (JetSpec with oracle-fed branching trees, merged retrieval trees and an
untrained head; suffix; Jacobi; speculative Jacobi). It also runs plain greedy with other pixel values: the check
only sees how a strategy handles the image if the image changes the greedy tokens. Some tiny models start with image
paths that barely reach the text (zero-initialised projections or gates, small vision weights); their builders
redraw those weights larger.

Outcomes per row: ``lossless`` (every strategy returned plain greedy's tokens, and the image changes them),
``image-inert`` (lossless, but other pixels give the same tokens: the check is weak, boost the row's builder),
``refused`` (every strategy raised hf_jetspec's ValueError naming the problem: linear-attention, conv or chunked
attention layers), ``partly refused`` (some lossless, the others refused by name), ``not built`` (building the model
or plain ``generate()`` failed: not a finding about hf_jetspec), ``not in this transformers``, and the findings
``DIFF`` (other tokens: which strategies, at which new token) and ``CRASH`` (any other exception: type, message,
innermost hf_jetspec frame), which must not occur; ``main()`` returns 1 when one does.

Not covered: gemma3n (its vision tower is a timm MobileNetV5, and timm is not a dependency); chameleon and emu3
(a VQ tokenizer turns the image into codebook tokens of the text vocabulary: another kind of image input, whose
tiny random configs this script does not build).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForImageTextToText
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

import hf_jetspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_architectures import (  # noqa: E402
    COMMON,
    IMAGE,
    VISION_END,
    VISION_START,
    VOCAB,
    image_prompt,
    strategies,
    vision_language_model,
)

MAX_NEW = 20
VIDEO = VOCAB - 2
SPARE = [VOCAB - 5 - i for i in range(6)]  # further special tokens (video start and end, audio)
TEXT = {**COMMON, "num_hidden_layers": 2}
MROPE = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}


# ----------------------------------------------------------------------------------------------------- prompts


def takes(model, argument: str) -> bool:
    return argument in inspect.signature(model.forward).parameters


def count_features(out) -> int:
    """Number of image feature vectors in whatever ``get_image_features`` returned."""
    if isinstance(out, torch.Tensor):
        return out.shape[:-1].numel()
    if isinstance(out, (list, tuple)):
        return sum(count_features(o) for o in out)
    if getattr(out, "pooler_output", None) is not None:
        return count_features(out.pooler_output)
    return count_features(out.last_hidden_state)


def image_tokens(model, image: dict, framed: bool = False, n: int | None = None) -> list[int]:
    """The image's placeholder tokens, one per feature vector (``n``, or counted), between start and end tokens
    when ``framed``."""
    if n is None:
        with torch.no_grad():
            n = count_features(getattr(model, "model", model).get_image_features(**image))
    return [VISION_START] * framed + [IMAGE] * n + [VISION_END] * framed


def prompt(image: dict, tokens: list[int], mm_token_types: bool = False) -> dict:
    """``generate()`` kwargs: 3 text tokens, the image's ``tokens``, 4 text tokens."""
    text = torch.randint(3, VOCAB - 12, (1, 7), generator=torch.Generator().manual_seed(4))
    ids = torch.cat([text[:, :3], torch.tensor([tokens]), text[:, 3:]], dim=1)
    inputs = dict(input_ids=ids, **image)
    if mm_token_types:  # what the processors of transformers >= 5.25 return alongside the ids
        inputs["mm_token_type_ids"] = (ids == IMAGE).int()
    return inputs


# ---------------------------------------------------------------------------------------------------- builders
# Each returns (model, generate() kwargs with one image).


def auto(family: str, **config):
    torch.manual_seed(9)
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(family, **config))
    model.eval().generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def boost(model, std: float = 0.2, part: str = ""):
    """Redraw the >= 2-D weights outside the text decoder (vision tower, projector) whose names contain ``part``
    with a larger spread: with HF's init some tiny models' image features barely reach the text."""
    torch.manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            text = any(key in name for key in ("language_model", "lm_head", "embed_tokens"))
            if param.dim() >= 2 and part in name and not text:
                param.normal_(0, std)
    return model


def tested(family: str, after: int = 4):
    """The builder and prompt of ``tests/test_architectures.py``."""
    model, image = vision_language_model(family)
    return model, image_prompt(model, image, before=3, after=after, seed=4)


def gemma3():
    model, inputs = tested("gemma3")
    inputs["token_type_ids"] = (inputs["input_ids"] == IMAGE).long()  # Gemma3Processor's: image tokens see each other
    return model, inputs


def paligemma():
    model, inputs = tested("paligemma")
    inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])  # PaliGemmaProcessor's: a bidirectional prefix
    return model, inputs


def mllama_two_tiles():
    model, image = vision_language_model("mllama")
    image.update(aspect_ratio_ids=torch.tensor([[2]]), aspect_ratio_mask=torch.tensor([[[1, 1]]]))  # ratio [2, 1]
    inputs = image_prompt(model, image, before=3, after=4, seed=4)
    cross = inputs["cross_attention_mask"]
    cross[..., 1] = cross[..., 0]  # the tokens from the image token on attend to both tiles
    return model, inputs


QWEN_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14, spatial_merge_size=2,
                   temporal_patch_size=2, in_channels=3, out_hidden_size=32)
GLM_TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO, image_start_token_id=VISION_START,
                  image_end_token_id=VISION_END, video_start_token_id=SPARE[0], video_end_token_id=SPARE[1])


def mrope(family: str, vision: dict, tokens: dict | None = None, patch: tuple = (3 * 2 * 14 * 14,),
          strong: bool = False, **text):
    """A multimodal-RoPE family: 16 patches of one 56x56 image merged into 4 image tokens."""
    rope = {**MROPE, **text.pop("rope", {})}
    tokens = tokens or dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
                            vision_end_token_id=VISION_END)
    model = auto(family, text_config={**TEXT, "head_dim": 8, "rope_parameters": rope, "rope_scaling": rope, **text},
                 vision_config=vision, **tokens)
    if strong:
        boost(model)
    image = dict(pixel_values=torch.randn(16, *patch), image_grid_thw=torch.tensor([[1, 4, 4]]))
    return model, prompt(image, image_tokens(model, image, framed=True, n=4), takes(model, "mm_token_type_ids"))


def qwen2_5_vl():
    return mrope("qwen2_5_vl", {**QWEN_VISION, "depth": 2, "window_size": 56, "fullatt_block_indexes": [1]},
                 strong=True)


def qwen3_vl_moe():
    vision = {**QWEN_VISION, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    return mrope("qwen3_vl_moe", vision, rope={"mrope_interleaved": True}, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, decoder_sparse_step=1)


def glm(family: str):
    moe = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
               n_shared_experts=1, n_group=1, topk_group=1, head_dim=16)  # head_dim 16: partial rotary 0.5
    return mrope(family, {**QWEN_VISION, "image_size": 56}, GLM_TOKENS, strong=family == "glm4v",
                 **(moe if family == "glm4v_moe" else {}))


def paddleocr_vl():
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=14,
                  spatial_merge_size=2, image_size=56)
    return mrope("paddleocr_vl", vision, patch=(3, 14, 14), strong=True)


def qwen3_5():
    vision = {**QWEN_VISION, "num_position_embeddings": 16}
    return mrope("qwen3_5", vision, rope={"mrope_interleaved": True, "partial_rotary_factor": 1.0},
                 linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2,
                 layer_types=["linear_attention", "full_attention"])


def hunyuan_vl():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 1, 1]}
    vision = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=1,
                  out_hidden_size=32, patch_size=4, spatial_merge_size=2, text_hidden_size=32)
    model = auto("hunyuan_vl", text_config={**TEXT, "head_dim": 8, "rope_parameters": rope}, vision_config=vision,
                 image_token_id=IMAGE)
    image = dict(pixel_values=torch.randn(16, 3 * 4 * 4), image_grid_thw=torch.tensor([[1, 4, 4]]))
    return model, prompt(image, image_tokens(model, image), mm_token_types=True)


CLIP = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, image_size=28, patch_size=14, projection_dim=16)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=56, patch_size=14)
PINPOINTS = [[28, 56], [56, 28], [56, 56]]


def llava_next():
    model = auto("llava_next", text_config={**TEXT, "model_type": "llama"}, vision_config=CLIP,
                 image_token_index=IMAGE, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1)
    # anyres: a 28x56 image is a base tile and 2 tiles of 28x28
    image = dict(pixel_values=torch.randn(1, 3, 3, 28, 28), image_sizes=torch.tensor([[28, 56]]))
    return model, prompt(image, image_tokens(model, image))


def llava_onevision():
    model = auto("llava_onevision", text_config={**TEXT, "model_type": "qwen2"},
                 vision_config={**SIGLIP, "num_hidden_layers": 2, "image_size": 28}, image_token_index=IMAGE,
                 video_token_index=VIDEO, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1)
    image = dict(pixel_values=torch.randn(1, 3, 3, 28, 28), image_sizes=torch.tensor([[28, 56]]))
    return model, prompt(image, image_tokens(model, image))


def vipllava():
    vision = {**CLIP, "num_hidden_layers": 3}
    model = auto("vipllava", text_config={**TEXT, "model_type": "llama"}, vision_config=vision, image_token_index=IMAGE,
                 vision_feature_layers=[-2, -1])
    image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    return model, prompt(image, image_tokens(model, image))


def video_llava():
    model = auto("video_llava", text_config={**TEXT, "model_type": "llama"}, vision_config=CLIP,
                 image_token_index=IMAGE, video_token_index=VIDEO, vision_feature_layer=-1, image_seq_length=4)
    return model, prompt(dict(pixel_values_images=torch.randn(1, 3, 28, 28)), [IMAGE] * 4)


def deepseek_vl():
    model = auto("deepseek_vl", vision_config={**SIGLIP, "image_size": 28}, image_token_id=IMAGE,
                 text_config={**TEXT, "model_type": "llama"})
    image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    return model, prompt(image, image_tokens(model, image))


def got_ocr2():
    vision = dict(hidden_size=16, output_channels=16, num_hidden_layers=1, num_attention_heads=2, image_size=64,
                  patch_size=16, mlp_dim=32, global_attn_indexes=[0], window_size=2)
    model = boost(auto("got_ocr2", vision_config=vision, text_config={**TEXT, "model_type": "qwen2"},
                       image_token_index=IMAGE))
    image = dict(pixel_values=torch.randn(1, 3, 64, 64))
    return model, prompt(image, image_tokens(model, image))


def internvl():
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                  patch_size=14)
    model = auto("internvl", vision_config=vision, text_config={**TEXT, "model_type": "qwen2"}, image_token_id=IMAGE,
                 downsample_ratio=0.5, image_seq_length=4)
    image = dict(pixel_values=torch.randn(1, 3, 56, 56))
    return model, prompt(image, image_tokens(model, image, framed=True))


def aya_vision(family: str):
    text = {**TEXT, "model_type": "cohere2", "head_dim": 8, "sliding_window": 5,
            "layer_types": ["sliding_attention", "full_attention"]}
    token = "image_token_index" if family == "aya_vision" else "image_token_id"
    model = auto(family, vision_config=SIGLIP, text_config=text, downsample_factor=2, **{token: IMAGE})
    image = dict(pixel_values=torch.randn(1, 3, 56, 56))
    return model, prompt(image, image_tokens(model, image, framed=True))


def janus():
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14,
                  mlp_ratio=2, projection_dim=32, num_image_tokens=4, depth=1)
    vq = dict(embed_dim=8, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, num_patches=2, projection_dim=32, image_token_embed_dim=32, num_hidden_layers=1)
    model = auto("janus", vision_config=vision, vq_config=vq, text_config={**TEXT, "model_type": "llama"},
                 image_token_id=IMAGE)
    image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    return model, prompt(image, image_tokens(model, image, framed=True))


def idefics(family: str):
    """Idefics 2 (a perceiver resampler to 4 latents), Idefics 3 and SmolVLM (16 patches pixel-shuffled to 4)."""
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                  patch_size=14)
    if family == "idefics2":
        perceiver = dict(hidden_size=32, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                         resampler_head_dim=8, num_key_value_heads=1)
        model = auto(family, vision_config=vision, perceiver_config=perceiver, image_token_id=IMAGE,
                     text_config={**TEXT, "model_type": "mistral"})
        boost(model, 0.3, "perceiver")  # latents all ones, weights std 0.02: every image looked the same
    else:
        model = auto(family, vision_config=vision, text_config={**TEXT, "model_type": "llama"}, image_token_id=IMAGE,
                     scale_factor=2)
    image = dict(pixel_values=torch.randn(1, 1, 3, 56, 56),
                 pixel_attention_mask=torch.ones(1, 1, 56, 56, dtype=torch.bool))
    return model, prompt(image, image_tokens(model, image, framed=True, n=4))


def mistral3(family: str):
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                  patch_size=14, head_dim=8)
    text = {**TEXT, "model_type": "mistral" if family == "mistral3" else "qwen3", "head_dim": 8}
    token = "image_token_index" if family == "mistral3" else "image_token_id"
    model = auto(family, vision_config=vision, text_config=text, spatial_merge_size=2, **{token: IMAGE})
    image = dict(pixel_values=torch.randn(1, 3, 56, 56), image_sizes=torch.tensor([[56, 56]]))
    return model, prompt(image, image_tokens(model, image))


def gemma4(bidirectional: bool):
    """Gemma 4: KV-shared layers, per-layer inputs; with ``bidirectional``, the image tokens (marked by
    ``mm_token_type_ids``, as Gemma4Processor returns them) attend to each other."""
    text = {**TEXT, "head_dim": 8, "sliding_window": 5, "num_hidden_layers": 4, "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2, "hidden_size_per_layer_input": 8,
            "vocab_size_per_layer_input": VOCAB, "use_bidirectional_attention": "vision" if bidirectional else None}
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8, pooling_kernel_size=2, patch_size=4, position_embedding_size=64)
    model = auto("gemma4", text_config=text, vision_config=vision, audio_config=None, image_token_id=IMAGE,
                 boi_token_id=VISION_START, eoi_token_id=VISION_END, video_token_id=VIDEO, audio_token_id=SPARE[0],
                 boa_token_id=SPARE[1], eoa_token_index=SPARE[2])
    # a 16x16 image: 4x4 patches of 4x4 pixels, pooled 2x2 into 4 soft tokens
    gy, gx = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    image = dict(pixel_values=torch.rand(1, 16, 4 * 4 * 3),
                 image_position_ids=torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=-1)[None])
    return model, prompt(image, image_tokens(model, image, framed=True, n=4), mm_token_types=bidirectional)


def llama4(chunk: int | None):
    text = {**TEXT, "head_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 64,
            "interleave_moe_layer_step": 1, "no_rope_layers": [1, 0], "attention_chunk_size": chunk,
            "layer_types": None}
    vision = dict(hidden_size=16, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                  patch_size=14, pixel_shuffle_ratio=0.5, projector_input_dim=32, projector_output_dim=32,
                  vision_output_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = auto("llama4", text_config=text, vision_config=vision, image_token_index=IMAGE,
                 boi_token_index=VISION_START, eoi_token_index=VISION_END)
    image = dict(pixel_values=torch.randn(1, 3, 56, 56))
    return model, prompt(image, image_tokens(model, image, framed=True))


def lfm2_vl():
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=4,
                  num_patches=16)
    model = auto("lfm2_vl", vision_config=vision, text_config={**TEXT, "layer_types": ["conv", "full_attention"],
                                                                "conv_L_cache": 3},
                 image_token_id=IMAGE, projector_hidden_size=32, downsample_factor=2)
    image = dict(pixel_values=torch.randn(1, 16, 3 * 4 * 4), spatial_shapes=torch.tensor([[4, 4]]),
                 pixel_attention_mask=torch.ones(1, 16, dtype=torch.long))
    return model, prompt(image, image_tokens(model, image, framed=True))


ROWS = [  # (model type, variant, builder)
    ("qwen2_vl", "", lambda: tested("qwen2_vl")),
    ("qwen2_vl", "the prompt ends with the image", lambda: tested("qwen2_vl", after=0)),
    ("qwen2_5_vl", "", qwen2_5_vl),
    ("qwen3_vl", "", lambda: tested("qwen3_vl")),
    ("qwen3_vl_moe", "", qwen3_vl_moe),
    ("qwen3_5", "", qwen3_5),
    ("glm4v", "", lambda: glm("glm4v")),
    ("glm46v", "", lambda: glm("glm46v")),
    ("glm4v_moe", "", lambda: glm("glm4v_moe")),
    ("glm_ocr", "", lambda: glm("glm_ocr")),
    ("paddleocr_vl", "", paddleocr_vl),
    ("hunyuan_vl", "", hunyuan_vl),
    ("llava", "", lambda: tested("llava")),
    ("llava_next", "", llava_next),
    ("llava_onevision", "", llava_onevision),
    ("vipllava", "", vipllava),
    ("video_llava", "", video_llava),
    ("deepseek_vl", "", deepseek_vl),
    ("got_ocr2", "", got_ocr2),
    ("internvl", "", internvl),
    ("aya_vision", "", lambda: aya_vision("aya_vision")),
    ("cohere2_vision", "", lambda: aya_vision("cohere2_vision")),
    ("janus", "", janus),
    ("idefics2", "", lambda: idefics("idefics2")),
    ("idefics3", "", lambda: idefics("idefics3")),
    ("smolvlm", "", lambda: idefics("smolvlm")),
    ("mistral3", "", lambda: mistral3("mistral3")),
    ("lighton_ocr", "", lambda: mistral3("lighton_ocr")),
    ("gemma3", "", gemma3),
    ("paligemma", "", paligemma),
    ("gemma4", "", lambda: gemma4(bidirectional=False)),
    ("gemma4", "mm_token_type_ids, bidirectional vision attention", lambda: gemma4(bidirectional=True)),
    ("mllama", "", lambda: tested("mllama")),
    ("mllama", "2 tiles", mllama_two_tiles),
    ("llama4", "", lambda: llama4(chunk=64)),
    ("llama4", "attention_chunk_size=None", lambda: llama4(chunk=None)),
    ("lfm2_vl", "", lfm2_vl),
]


# --------------------------------------------------------------------------------------------------------- run


def message(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def failure(exc: Exception, show_traceback: bool) -> str:
    """``REFUSED ValueError: ...`` for hf_jetspec's own refusals, else ``CRASH Type: ... @ innermost hf_jetspec
    frame``."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, ValueError) and "/hf_jetspec/" in frames[-1].filename:
        return f"REFUSED {message(exc)}"
    if show_traceback:
        traceback.print_exception(exc, file=sys.stderr)
    ours = [f for f in frames if "/hf_jetspec/" in f.filename]
    where = f"{ours[-1].filename.split('/hf_jetspec/')[-1]}:{ours[-1].lineno} ({ours[-1].name})" if ours else \
        "no hf_jetspec frame"
    return f"CRASH {message(exc)} @ {where}"


@torch.no_grad()
def greedy(model, inputs: dict, **kwargs) -> torch.Tensor:
    torch.manual_seed(9)
    return model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)


def compare(reference: torch.Tensor, out: torch.Tensor, prompt_length: int) -> str:
    if torch.equal(out, reference):
        return "SAME"
    ref, got = reference[0].tolist(), out[0].tolist()
    first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    return f"DIFF at new token {first - prompt_length}"


def classify(results: dict, image_matters: bool) -> tuple[str, str]:
    kinds = {result.split()[0] for result in results.values()}
    findings = "; ".join(f"{name}: {result}" for name, result in results.items() if result != "SAME")
    if "DIFF" in kinds or "CRASH" in kinds:
        return "DIFF" if "DIFF" in kinds else "CRASH", findings
    if kinds == {"SAME"}:
        return ("lossless", "") if image_matters else ("image-inert", "other pixels give the same greedy tokens")
    if kinds == {"REFUSED"}:
        return "refused", next(iter(results.values())).split(" ", 1)[1]
    return "partly refused", findings


def sweep_row(build, show_traceback: bool) -> dict:
    try:
        model, inputs = build()
        reference = greedy(model, inputs)
    except Exception as exc:  # noqa: BLE001 (the tiny model itself: not a finding about hf_jetspec)
        return {"outcome": "not built", "detail": message(exc)}
    torch.manual_seed(0)
    other = {k: torch.randn_like(v) if k.startswith("pixel_values") else v for k, v in inputs.items()}
    image_matters = not torch.equal(reference, greedy(model, other))
    results = {}
    try:
        runs = strategies(model, reference, seed=9)
    except Exception as exc:  # noqa: BLE001 (the head's for_target refusing, say)
        runs, results["strategies()"] = {}, failure(exc, show_traceback)
    for name, kwargs in runs.items():
        try:
            results[name] = compare(reference, greedy(model, inputs, **kwargs), inputs["input_ids"].shape[1])
        except Exception as exc:  # noqa: BLE001
            results[name] = failure(exc, show_traceback)
    outcome, detail = classify(results, image_matters)
    return {"outcome": outcome, "class": type(model).__name__, "detail": detail}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("families", nargs="*", help="model types (default: all); each runs with its variant rows")
    p.add_argument("--traceback", action="store_true", help="print the traceback of each CRASH to stderr")
    args = p.parse_args(argv)
    unknown = set(args.families) - {family for family, _, _ in ROWS}
    if unknown:
        p.error(f"no rows for {', '.join(sorted(unknown))}")
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    results = {}
    for family, variant, build in ROWS:
        if args.families and family not in args.families:
            continue
        row = f"{family} ({variant})" if variant else family
        start = time.perf_counter()
        results[row] = sweep_row(build, args.traceback) if family in CONFIG_MAPPING else \
            {"outcome": "not in this transformers", "detail": ""}
        print(f"{row}: {results[row]['outcome']} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    order = ["DIFF", "CRASH", "image-inert", "lossless", "partly refused", "refused", "not built",
             "not in this transformers"]
    print("# Vision-language models: an image in the prompt, every strategy\n")
    command = " ".join([".venv/bin/python docs/vlm_sweep.py", *args.families])
    print(f"`{command}` on {time.strftime('%-d %B %Y')} (CPU, float32): transformers {transformers.__version__}, "
          f"hf_jetspec {hf_jetspec.__version__}, {len(results)} rows, {MAX_NEW} new tokens, one image per prompt.\n")
    print("| outcome | count | rows |\n|---|---|---|")
    for outcome in order:
        rows = [row for row, r in results.items() if r["outcome"] == outcome]
        if rows:
            print(f"| {outcome} | {len(rows)} | {', '.join(rows)} |")
    print("\n| row | model | outcome | detail |\n|---|---|---|---|")
    for row, r in results.items():
        print(f"| {row} | {r.get('class', '')} | {r['outcome']} | {r['detail'].replace('|', '/')} |")
    return 1 if any(r["outcome"] in ("DIFF", "CRASH") for r in results.values()) else 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
