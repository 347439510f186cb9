"""Images, videos and audio in the prompts of tiny random multimodal models, through every hf_jetspec strategy.

    .venv/bin/python docs/vlm_sweep.py                      # every family, a Markdown table on stdout
    .venv/bin/python docs/vlm_sweep.py mllama gemma4        # some families (with their variant rows)
    .venv/bin/python docs/vlm_sweep.py > docs/results/vlm_sweep.md

A regression net for transformers upgrades: rerun it after each one (a release changes how models place media
tokens, position them, mask them, or cache them; docs/family_sweep.py covers text prompts). For each multimodal
family: build a tiny random model (a text decoder of two to four layers of width 32, vision and audio encoders of
one or two), a prompt of text, one image and more text (placeholder tokens and extra inputs as the family's
processor gives them), run plain greedy ``generate()`` for 20 tokens, then every strategy of
``tests/test_architectures.py::strategies`` (JetSpec with oracle-fed branching trees, merged retrieval trees and an
untrained head; suffix; Jacobi; speculative Jacobi). Rows labelled with other media put those in the prompt
instead: a video (frames, timestamps and temporal positions as the family's processor lays them out), a video and
an image, two images, an audio clip, an audio clip and an image. It also runs plain greedy with each image, video
or audio clip redrawn alone: the check only sees how a strategy handles a medium if that medium changes the greedy
tokens. Some tiny models start with media paths that barely reach the text (zero-initialised projections or gates,
small encoder weights); their builders redraw those weights larger (seeded).

Outcomes per row: ``lossless`` (every strategy returned plain greedy's tokens, and each medium changes them),
``media-inert`` (lossless, but redrawing a medium gives the same tokens: the check is weak, boost the row's
builder), ``refused`` (every strategy raised hf_jetspec's ValueError naming the problem: linear-attention, conv or
chunked attention layers), ``partly refused`` (some lossless, the others refused by name), ``not built`` (building
the model or plain ``generate()`` failed: not a finding about hf_jetspec), ``not in this transformers``, and the
findings ``DIFF`` (other tokens: which strategies, at which new token) and ``CRASH`` (any other exception: type,
message, innermost hf_jetspec frame), which must not occur; ``main()`` returns 1 when one does.

Not covered: gemma3n (its vision tower is a timm MobileNetV5, and timm is not a dependency); chameleon and emu3
(a VQ tokenizer turns the image into codebook tokens of the text vocabulary: another kind of image input, whose
tiny random configs this script does not build); encoder-decoder speech models (Whisper and the like: hf_jetspec
targets decoder-only LMs).
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
from transformers import AutoConfig, AutoModelForMultimodalLM, AutoModelForSeq2SeqLM
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
SPARE = [VOCAB - 5 - i for i in range(6)]  # further special tokens: video start and end, audio's, a timestamp
AUDIO, AUDIO_START, AUDIO_END = SPARE[2:5]
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


def features(model, kind: str, **media) -> int:
    """How many feature vectors ``get_{kind}_features`` makes of ``media``: one placeholder token each."""
    with torch.no_grad():
        return count_features(getattr(getattr(model, "model", model), f"get_{kind}_features")(**media))


def image_tokens(model, image: dict, framed: bool = False, n: int | None = None) -> list[int]:
    """The image's placeholder tokens, one per feature vector (``n``, or counted), between start and end tokens
    when ``framed``."""
    n = features(model, "image", **image) if n is None else n
    return [VISION_START] * framed + [IMAGE] * n + [VISION_END] * framed


def audio_tokens(model, clip: dict, framed: bool = False, n: int | None = None) -> list[int]:
    """The audio clip's placeholder tokens, as ``image_tokens``."""
    n = features(model, "audio", **clip) if n is None else n
    return [AUDIO_START] * framed + [AUDIO] * n + [AUDIO_END] * framed


def prompt(media: dict, *placeholders: list[int], mm_token_types: bool = False) -> dict:
    """``generate()`` kwargs: 3 text tokens, each medium's ``placeholders`` (2 text tokens between two), 4 text
    tokens."""
    n = len(placeholders)
    text = torch.randint(3, VOCAB - 12, (2 * n + 5,), generator=torch.Generator().manual_seed(4)).tolist()
    ids = text[:3]
    for i, tokens in enumerate(placeholders):
        ids += tokens + (text[2 * i + 3:2 * i + 5] if i < n - 1 else text[-4:])
    ids = torch.tensor([ids])
    inputs = dict(input_ids=ids, **media)
    if mm_token_types:  # what the processors of transformers >= 5.25 return alongside the ids: 1 image, 2 video
        inputs["mm_token_type_ids"] = ((ids == IMAGE) + 2 * (ids == VIDEO)).int()
    return inputs


# ---------------------------------------------------------------------------------------------------- builders
# Each returns (model, generate() kwargs) and, where one tensor holds two images, which part is each: (key, index).


def auto(family: str, **config):
    torch.manual_seed(9)
    # AudioFlamingo 3, a decoder-only LM with an audio encoder, is in transformers' seq2seq LM mapping only
    loader = AutoModelForSeq2SeqLM if family == "audioflamingo3" else AutoModelForMultimodalLM
    model = loader.from_config(AutoConfig.for_model(family, **config))
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


def token_types(family: str, inputs: dict) -> dict:
    """The ``token_type_ids`` of Gemma3Processor (image tokens see each other) and PaliGemmaProcessor (a
    bidirectional prefix)."""
    if family == "gemma3":
        inputs["token_type_ids"] = (inputs["input_ids"] == IMAGE).long()
    elif family == "paligemma":
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    return inputs


def tested(family: str, after: int = 4):
    """The builder and prompt of ``tests/test_architectures.py``."""
    model, image = vision_language_model(family)
    return model, token_types(family, image_prompt(model, image, before=3, after=after, seed=4))


def two_images(family: str):
    """The test model of ``tests/test_architectures.py`` with two images (of its image's size) in one tensor."""
    model, image = vision_language_model(family)
    pixels = image["pixel_values"]
    tokens = image_tokens(model, image, framed=True)
    inputs = prompt(dict(pixel_values=torch.cat([pixels, torch.randn_like(pixels)])), tokens, tokens)
    return model, token_types(family, inputs), [("pixel_values", 0), ("pixel_values", 1)]


def mllama_two_tiles():
    model, image = vision_language_model("mllama")
    image.update(aspect_ratio_ids=torch.tensor([[2]]), aspect_ratio_mask=torch.tensor([[[1, 1]]]))  # ratio [2, 1]
    inputs = image_prompt(model, image, before=3, after=4, seed=4)
    cross = inputs["cross_attention_mask"]
    cross[..., 1] = cross[..., 0]  # the tokens from the image token on attend to both tiles
    return model, inputs


def mllama_two_images():
    """Two images of one tile each; as MllamaProcessor masks them, the tokens from each image token up to the next
    attend to that image's tile."""
    model, _ = vision_language_model("mllama")
    images = dict(pixel_values=torch.randn(1, 2, 2, 3, 28, 28), aspect_ratio_ids=torch.tensor([[1, 1]]),
                  aspect_ratio_mask=torch.tensor([[[1, 0], [1, 0]]]))
    inputs = prompt(images, [VOCAB], [VOCAB])  # the image token is the first of 8 extra embeddings
    first, second = (inputs["input_ids"][0] == VOCAB).nonzero()[:, 0].tolist()
    cross = torch.zeros(1, inputs["input_ids"].shape[1], 2, 2, dtype=torch.long)
    cross[:, first:second, 0, 0] = cross[:, second:, 1, 0] = 1
    inputs["cross_attention_mask"] = cross
    return model, inputs, [("pixel_values", (0, 0)), ("pixel_values", (0, 1))]


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
    return model, prompt(image, image_tokens(model, image, framed=True, n=4),
                         mm_token_types=takes(model, "mm_token_type_ids"))


def qwen2_5_vl():
    return mrope("qwen2_5_vl", {**QWEN_VISION, "depth": 2, "window_size": 56, "fullatt_block_indexes": [1]},
                 strong=True)


def video(build, timestamps: bool = False, with_image: bool = False, **extra):
    """A multimodal-RoPE family's model (``build``'s) with a video of 2 frames of 4x4 patches, 4 video tokens each
    (Qwen3-VL with ``timestamps``: per frame, a timestamp's text token and the frame framed; the others frame the
    whole video), ``extra`` inputs (seconds per frame) and, ``with_image``, the builder's image before it."""
    model, image = build()
    clip = dict(pixel_values_videos=torch.randn(32, 3 * 2 * 14 * 14), video_grid_thw=torch.tensor([[2, 4, 4]]), **extra)
    if timestamps:
        tokens = [token for frame in range(2) for token in [10 + frame, VISION_START, *[VIDEO] * 4, VISION_END]]
    else:
        tokens = [VISION_START, *[VIDEO] * 8, VISION_END]
    placeholders = [image_tokens(model, image, framed=True, n=4), tokens] if with_image else [tokens]
    return model, prompt({**image, **clip} if with_image else clip, *placeholders,
                         mm_token_types=takes(model, "mm_token_type_ids"))


def qwen_two_images(family: str):
    """The test model of ``tests/test_architectures.py`` with two images in one tensor of patches: 4x4 patches (4
    image tokens) and 4x6 (6 image tokens)."""
    model, _ = vision_language_model(family)
    images = dict(pixel_values=torch.randn(40, 3 * 2 * 14 * 14), image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 6]]))
    first, second = (image_tokens(model, images, framed=True, n=n) for n in (4, 6))
    inputs = prompt(images, first, second, mm_token_types=takes(model, "mm_token_type_ids"))
    return model, inputs, [("pixel_values", slice(0, 16)), ("pixel_values", slice(16, 40))]


def qwen3_vl_moe():
    vision = {**QWEN_VISION, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
    return mrope("qwen3_vl_moe", vision, rope={"mrope_interleaved": True}, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, decoder_sparse_step=1)


def glm(family: str):
    moe = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
               n_shared_experts=1, n_group=1, topk_group=1, head_dim=16)  # head_dim 16: partial rotary 0.5
    return mrope(family, {**QWEN_VISION, "image_size": 56}, GLM_TOKENS, strong=family == "glm4v",
                 **(moe if family == "glm4v_moe" else {}))


def glm4v_video():
    """GLM-4V's video: between video start and end, per frame, its tokens framed as an image's and a timestamp's
    text token; the frames' tokens are video tokens in ``mm_token_type_ids``."""
    model, _ = glm("glm4v")
    clip = dict(pixel_values_videos=torch.randn(32, 3 * 2 * 14 * 14), video_grid_thw=torch.tensor([[2, 4, 4]]))
    frames = [token for frame in range(2) for token in [VISION_START, *[IMAGE] * 4, VISION_END, 20 + frame]]
    inputs = prompt(clip, [SPARE[0], *frames, SPARE[1]])
    inputs["mm_token_type_ids"] = 2 * (inputs["input_ids"] == IMAGE).int()
    return model, inputs


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


def llava_onevision(with_video: bool = False):
    """LLaVA-OneVision with an anyres image, or ``with_video`` a video of 2 frames instead."""
    model = auto("llava_onevision", text_config={**TEXT, "model_type": "qwen2"},
                 vision_config={**SIGLIP, "num_hidden_layers": 2, "image_size": 28}, image_token_index=IMAGE,
                 video_token_index=VIDEO, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1)
    if with_video:
        frames = torch.randn(1, 2, 3, 28, 28)
        n = features(model, "video", pixel_values_videos=frames, vision_feature_layer=-1,
                     vision_feature_select_strategy=model.config.vision_feature_select_strategy)
        return model, prompt(dict(pixel_values_videos=frames), [VIDEO] * n)
    image = dict(pixel_values=torch.randn(1, 3, 3, 28, 28), image_sizes=torch.tensor([[28, 56]]))
    return model, prompt(image, image_tokens(model, image))


def vipllava():
    vision = {**CLIP, "num_hidden_layers": 3}
    model = auto("vipllava", text_config={**TEXT, "model_type": "llama"}, vision_config=vision, image_token_index=IMAGE,
                 vision_feature_layers=[-2, -1])
    image = dict(pixel_values=torch.randn(1, 3, 28, 28))
    return model, prompt(image, image_tokens(model, image))


def video_llava(with_video: bool = False):
    """Video-LLaVA with an image, or ``with_video`` a video of 2 frames instead."""
    model = auto("video_llava", text_config={**TEXT, "model_type": "llama"}, vision_config=CLIP,
                 image_token_index=IMAGE, video_token_index=VIDEO, vision_feature_layer=-1, image_seq_length=4)
    if with_video:
        frames = torch.randn(1, 2, 3, 28, 28)
        n = features(model, "video", pixel_values_videos=frames, vision_feature_layer=-1)
        return model, prompt(dict(pixel_values_videos=frames), [VIDEO] * n)
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


WHISPER = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
               max_source_positions=16)
AUDIO_ENCODER = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_mel_bins=16,
                     max_source_positions=16)


def speech(family: str, frames: int = 32, mask: str = "", strong: float = 0.0, n: int | None = None, **config):
    """An audio-language family (its encoder's weights redrawn with std ``strong``): a clip of ``frames`` frames of
    16 mel bins (and a frame mask named ``mask``), its placeholder tokens (``n``, or counted)."""
    model = auto(family, **config)
    if strong:
        boost(model, strong)
    clip = dict(input_features=torch.randn(1, 16, frames))
    if mask:
        clip[mask] = torch.ones(1, frames, dtype=torch.long)
    return model, prompt(clip, audio_tokens(model, clip, n=n))


def qwen2_audio():
    """32 frames: a stride-2 convolution and pooling by 2 leave 8 audio tokens (it has no get_audio_features)."""
    return speech("qwen2_audio", mask="feature_attention_mask", n=8, audio_config=WHISPER,
                  text_config={**TEXT, "model_type": "qwen2"}, audio_token_index=AUDIO)


def voxtral():
    return speech("voxtral", audio_config={**AUDIO_ENCODER, "intermediate_size": 64}, audio_token_id=AUDIO,
                  text_config={**TEXT, "model_type": "llama", "head_dim": 8})


def audioflamingo3():
    return speech("audioflamingo3", mask="input_features_mask", audio_config=AUDIO_ENCODER, audio_token_id=AUDIO,
                  text_config={**TEXT, "model_type": "qwen2"})


def glmasr():
    audio = {**AUDIO_ENCODER, "intermediate_size": 64, "max_position_embeddings": 64, "head_dim": 8}
    return speech("glmasr", mask="input_features_mask", audio_config=audio, audio_token_id=AUDIO,
                  text_config={**TEXT, "model_type": "llama", "head_dim": 8})


def granite_speech():
    encoder = dict(input_dim=16, num_layers=1, hidden_dim=16, feedforward_mult=2, num_heads=2, dim_head=8,
                   output_dim=8, context_size=8, max_pos_emb=16, conv_kernel_size=3)
    projector = dict(model_type="blip_2_qformer", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, encoder_hidden_size=16)
    # its input_features are [batch, frames, input_dim]: 16 frames of 16
    return speech("granite_speech", frames=16, text_config={**TEXT, "model_type": "granite"},
                  encoder_config=encoder, projector_config=projector, audio_token_index=AUDIO,
                  has_lora_adapter=False, downsample_rate=2, window_size=4)


def qwen3_asr():
    audio = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                 output_dim=32, downsample_hidden_size=8)
    # 200 frames: 2 chunks of 100 (n_window 50), 13 audio tokens each
    return speech("qwen3_asr", frames=200, mask="input_features_mask", strong=0.3, audio_config=audio,
                  text_config={**TEXT, "model_type": "qwen3", "head_dim": 8}, audio_token_id=AUDIO,
                  timestamp_token_id=SPARE[5])


def phi4_multimodal():
    """Phi-4-multimodal (a causal LM whose embedding layer holds the vision and audio encoders): audio features of
    32 frames, reduced 4x to 8 audio tokens."""
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=14, crop_size=28, image_token_id=IMAGE)
    audio = dict(hidden_size=16, intermediate_size=32, num_blocks=1, num_attention_heads=2, ext_pw_out_channel=16,
                 depthwise_separable_out_channel=16, input_size=16, nemo_conv_channels=16, time_reduction=4,
                 bias_max_distance=16, audio_token_id=AUDIO, left_chunk=4, chunk_size=-1)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    model = auto("phi4_multimodal", vision_config=vision, audio_config=audio, rope_parameters=rope,
                 original_max_position_embeddings=512, **TEXT)
    clip = dict(audio_input_features=torch.randn(1, 32, 16), audio_embed_sizes=torch.tensor([8]),
                audio_attention_mask=torch.ones(1, 32, dtype=torch.bool))
    return model, prompt(clip, audio_tokens(model, clip, n=8))


def omni(family: str, with_image: bool = False):
    """A Qwen omni thinker (Qwen2.5-Omni; Qwen3-Omni: MoE text, interleaved multimodal RoPE, deepstack vision): an
    audio clip of 32 (Qwen3-Omni: 200) frames between audio start and end and, ``with_image``, then an image."""
    audio = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                 max_source_positions=64, output_dim=32)
    if family == "qwen2_5_omni_thinker":
        frames, rope, text = 32, MROPE, {}
        audio["n_window"] = 16
        vision = {**QWEN_VISION, "window_size": 56, "fullatt_block_indexes": [0]}
        tokens = dict(audio_token_index=AUDIO, image_token_index=IMAGE, video_token_index=VIDEO)
    else:
        frames, rope = 200, {**MROPE, "mrope_interleaved": True}
        text = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
        audio["downsample_hidden_size"] = 8
        vision = {**QWEN_VISION, "num_position_embeddings": 16, "deepstack_visual_indexes": [0]}
        tokens = dict(audio_token_id=AUDIO, image_token_id=IMAGE, video_token_id=VIDEO)
    model = auto(family, audio_config=audio, vision_config=vision, audio_start_token_id=AUDIO_START,
                 audio_end_token_id=AUDIO_END, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                 text_config={**TEXT, "head_dim": 8, "rope_parameters": rope, "rope_scaling": rope, **text}, **tokens)
    boost(model, 0.2, "audio_tower")  # with HF's init, Qwen3-Omni's clips do not change the greedy tokens
    media = dict(input_features=torch.randn(1, 16, frames),
                 feature_attention_mask=torch.ones(1, frames, dtype=torch.long))
    placeholders = [audio_tokens(model, media, framed=True)]
    if with_image:
        media.update(pixel_values=torch.randn(16, 3 * 2 * 14 * 14), image_grid_thw=torch.tensor([[1, 4, 4]]))
        placeholders.append(image_tokens(model, media, framed=True, n=4))
    return model, prompt(media, *placeholders)


ROWS = [  # (model type, variant: its media where not one image, or what else differs, builder)
    ("qwen2_vl", "", lambda: tested("qwen2_vl")),
    ("qwen2_vl", "the prompt ends with the image", lambda: tested("qwen2_vl", after=0)),
    ("qwen2_vl", "video", lambda: video(lambda: vision_language_model("qwen2_vl"))),
    ("qwen2_vl", "video + image", lambda: video(lambda: vision_language_model("qwen2_vl"), with_image=True)),
    ("qwen2_vl", "2 images", lambda: qwen_two_images("qwen2_vl")),
    ("qwen2_5_vl", "", qwen2_5_vl),
    ("qwen2_5_vl", "video", lambda: video(qwen2_5_vl, second_per_grid_ts=torch.tensor([0.5]))),
    ("qwen3_vl", "", lambda: tested("qwen3_vl")),
    ("qwen3_vl", "video", lambda: video(lambda: vision_language_model("qwen3_vl"), timestamps=True)),
    ("qwen3_vl", "2 images", lambda: qwen_two_images("qwen3_vl")),
    ("qwen3_vl_moe", "", qwen3_vl_moe),
    ("qwen3_5", "", qwen3_5),
    ("glm4v", "", lambda: glm("glm4v")),
    ("glm4v", "video", glm4v_video),
    ("glm46v", "", lambda: glm("glm46v")),
    ("glm4v_moe", "", lambda: glm("glm4v_moe")),
    ("glm_ocr", "", lambda: glm("glm_ocr")),
    ("paddleocr_vl", "", paddleocr_vl),
    ("hunyuan_vl", "", hunyuan_vl),
    ("llava", "", lambda: tested("llava")),
    ("llava", "2 images", lambda: two_images("llava")),
    ("llava_next", "", llava_next),
    ("llava_onevision", "", llava_onevision),
    ("llava_onevision", "video", lambda: llava_onevision(with_video=True)),
    ("vipllava", "", vipllava),
    ("video_llava", "", video_llava),
    ("video_llava", "video", lambda: video_llava(with_video=True)),
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
    ("gemma3", "", lambda: tested("gemma3")),
    ("gemma3", "2 images", lambda: two_images("gemma3")),
    ("paligemma", "", lambda: tested("paligemma")),
    ("paligemma", "2 images", lambda: two_images("paligemma")),
    ("gemma4", "", lambda: gemma4(bidirectional=False)),
    ("gemma4", "mm_token_type_ids, bidirectional vision attention", lambda: gemma4(bidirectional=True)),
    ("mllama", "", lambda: tested("mllama")),
    ("mllama", "2 tiles", mllama_two_tiles),
    ("mllama", "2 images", mllama_two_images),
    ("llama4", "", lambda: llama4(chunk=64)),
    ("llama4", "attention_chunk_size=None", lambda: llama4(chunk=None)),
    ("lfm2_vl", "", lfm2_vl),
    ("qwen2_audio", "audio", qwen2_audio),
    ("voxtral", "audio", voxtral),
    ("audioflamingo3", "audio", audioflamingo3),
    ("glmasr", "audio", glmasr),
    ("granite_speech", "audio", granite_speech),
    ("qwen3_asr", "audio", qwen3_asr),
    ("phi4_multimodal", "audio", phi4_multimodal),
    ("qwen2_5_omni_thinker", "audio", lambda: omni("qwen2_5_omni_thinker")),
    ("qwen2_5_omni_thinker", "audio + image", lambda: omni("qwen2_5_omni_thinker", with_image=True)),
    ("qwen2_5_omni_thinker", "video", lambda: video(lambda: omni("qwen2_5_omni_thinker"),
                                                    video_second_per_grid=torch.tensor([0.5]))),
    ("qwen3_omni_moe_thinker", "audio", lambda: omni("qwen3_omni_moe_thinker")),
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


def classify(results: dict, inert: list[str]) -> tuple[str, str]:
    kinds = {result.split()[0] for result in results.values()}
    findings = "; ".join(f"{name}: {result}" for name, result in results.items() if result != "SAME")
    if "DIFF" in kinds or "CRASH" in kinds:
        return "DIFF" if "DIFF" in kinds else "CRASH", findings
    if kinds == {"SAME"} and inert:
        return "media-inert", f"the same greedy tokens with {' or '.join(inert)} redrawn"
    if kinds == {"SAME"}:
        return "lossless", ""
    if kinds == {"REFUSED"}:
        return "refused", next(iter(results.values())).split(" ", 1)[1]
    return "partly refused", findings


def redrawn(inputs: dict, key: str, index) -> dict:
    """``inputs`` with ``inputs[key][index]`` (one image, video or audio clip) redrawn."""
    torch.manual_seed(0)
    value = inputs[key].clone()
    value[index] = torch.randn_like(value[index])
    return {**inputs, key: value}


def sweep_row(build, show_traceback: bool) -> dict:
    try:
        model, inputs, *parts = build()
        reference = greedy(model, inputs)
    except Exception as exc:  # noqa: BLE001 (the tiny model itself: not a finding about hf_jetspec)
        return {"outcome": "not built", "detail": message(exc)}
    media = parts[0] if parts else [(key, ...) for key in inputs if key.startswith("pixel_values")
                                    or key.endswith("input_features")]
    inert = [key if index is ... else f"image {i + 1} of {key}" for i, (key, index) in enumerate(media)
             if torch.equal(reference, greedy(model, redrawn(inputs, key, index)))]
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
    outcome, detail = classify(results, inert)
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
    order = ["DIFF", "CRASH", "media-inert", "lossless", "partly refused", "refused", "not built",
             "not in this transformers"]
    print("# Multimodal models: images, videos and audio in the prompt, every strategy\n")
    command = " ".join([".venv/bin/python docs/vlm_sweep.py", *args.families])
    print(f"`{command}` on {time.strftime('%-d %B %Y')} (CPU, float32): transformers {transformers.__version__}, "
          f"hf_jetspec {hf_jetspec.__version__}, {len(results)} rows, {MAX_NEW} new tokens, one image per prompt "
          "unless the row names other media.\n")
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
