"""Model cards and Hub uploads for draft heads (huggingface_hub ``ModelCard`` / ``HfApi``)."""

from __future__ import annotations

import tempfile

from huggingface_hub import HfApi, ModelCard, ModelCardData

from .config import JetSpecConfig

LIBRARY_NAME = "hf-jetspec"
TAGS = ["speculative-decoding", "jetspec", "draft-model", "dflash"]

_BODY = """
# JetSpec draft head{for_base}

A causal parallel draft head for lossless speculative decoding with the `hf-jetspec` library. It reads the frozen target's hidden states after layers
{taps}, drafts {depth} future tokens in one forward pass, and the target verifies a token tree of those drafts
in one forward pass. Greedy outputs are identical to plain `generate()`; sampling keeps the target's distribution.

The head stores no embeddings and no LM head: it uses the target's own.

```python
import hf_jetspec
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{base}")
tokenizer = AutoTokenizer.from_pretrained("{base}")
head = hf_jetspec.JetSpecHead.from_pretrained("<this repo>")
hf_jetspec.enable(model)
inputs = tokenizer.apply_chat_template([{{"role": "user", "content": "Hi!"}}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)
out = model.generate(**inputs, assistant_model=head, max_new_tokens=256)
```

## Architecture

| field | value |
|---|---|
| head layers | {layers} |
| hidden / intermediate | {hidden} / {intermediate} |
| attention heads (query / key-value) | {heads} / {kv_heads} |
| block size | {block} |
| in-block attention | {attention} |
| tapped target layers | {taps} |
| mask token id | {mask} |
| default tree budget / width | {budget} / {width} |
| draft vocabulary | {draft_vocab} |

## Training
{training}{retrieval}"""


def _training_section(summary: dict | None) -> str:
    if not summary:
        return "\nNo training information recorded (an untrained or externally trained head).\n"
    lines = [f"- **{key.replace('_', ' ')}**: {value}" for key, value in summary.items()]
    return "\n" + "\n".join(lines) + "\n"


def _retrieval_section(datastore, calibration) -> str:
    if datastore is None and calibration is None:
        return ""
    lines = ["", "## Retrieval", "",
             "`jetspec_generate` merges this head's drafts with continuations retrieved from the prompt, the output so "
             "far and the datastore below into one tree (`retrieval=False`: the head alone).", ""]
    if datastore is not None:
        lines.append(f"- **datastore** (`datastore.safetensors`): {datastore.num_tokens:,} tokens in "
                     f"{datastore.num_documents:,} documents, with their suffix array")
    if calibration is not None:
        fitted = ", ".join(f"{kind} {count:,}" for kind, count in sorted(calibration.fitted_on.items()))
        lines.append("- **calibration** (`calibration.json`): acceptance estimates of merged trees, "
                     + (f"fitted on verification records ({fitted})" if fitted else "the library's defaults")
                     + ("" if calibration.node_cost is None else f"; node cost {calibration.node_cost:g}"))
    return "\n".join(lines) + "\n"


def model_card(config: JetSpecConfig, datastore=None, calibration=None) -> ModelCard:
    """A model card for a head: base model, library, tags, training data and measured tau when recorded, and its
    retrieval datastore (a `CorpusIndex`) and calibration (a `Calibration`) when it has them."""
    summary = config.training_summary or {}
    datasets = summary.get("datasets")
    data = ModelCardData(
        base_model=config.base_model or None,
        library_name=LIBRARY_NAME,
        tags=list(TAGS),
        datasets=list(datasets) if datasets else None,
        license=summary.get("license"),
    )
    body = _BODY.format(
        for_base=f" for {config.base_model}" if config.base_model else "",
        base=config.base_model or "<target model>",
        taps=config.target_layer_ids,
        depth=config.block_size - 1,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        block=config.block_size,
        attention="causal" if config.causal else "bidirectional (DFlash)",
        mask=config.mask_token_id,
        budget=config.tree_budget,
        width=config.tree_width,
        draft_vocab="the whole target vocabulary" if config.draft_vocab is None
        else f"{len(config.draft_vocab)} most frequent tokens (of {config.vocab_size})",
        training=_training_section(config.training_summary),
        retrieval=_retrieval_section(datastore, calibration),
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def push_head(head, repo_id: str, *, private: bool | None = None, token: str | None = None,
              commit_message: str = "Upload JetSpec draft head", revision: str | None = None):
    """Upload ``head.save_pretrained`` output (config, safetensors weights, model card) to ``repo_id``."""
    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        head.save_pretrained(folder)
        return api.upload_folder(
            repo_id=repo.repo_id, folder_path=folder, commit_message=commit_message, revision=revision
        )
