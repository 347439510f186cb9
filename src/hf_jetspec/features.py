"""Capture the target's hidden states after chosen decoder layers with forward hooks.

Hooks on ``decoder_layers(model)[i]`` are stable across transformers versions, unlike ``output_hidden_states``
indexing (which changed between 5.17 and 5.23).
"""

from __future__ import annotations

import threading

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's decoder layer list (works through PEFT wrappers and multimodal text towers)."""
    for owner in (model, getattr(model, "base_model", None)):
        if owner is None:
            continue
        inner = owner.get_decoder() if hasattr(owner, "get_decoder") else None
        # the decoder itself, or a causal LM wrapping it (Llama 4's language model)
        for candidate in (inner, getattr(inner, "model", None), getattr(owner, "model", None),
                          getattr(owner, "transformer", None), owner):
            for name in ("layers", "h", "blocks"):  # most models; GPT-2, Falcon, Bloom, GPT-J; DBRX
                layers = getattr(candidate, name, None)
                if isinstance(layers, nn.ModuleList):
                    return layers
    # BERT-style stacks used as decoders (BertLMHeadModel, RoBERTa, ELECTRA, ...): `<base>.encoder.layer`
    count = getattr(model.config.get_text_config(), "num_hidden_layers", None)
    for name, module in model.named_modules():
        if name.endswith("encoder.layer") and isinstance(module, nn.ModuleList) and len(module) == count:
            return module
    stacks = [f"`{name}` ({len(module)})" for name, module in model.named_modules()
              if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]
    if stacks and count:
        raise ValueError(f"{type(model).__name__} runs its decoder layers several times per token (layer stacks "
                         f"{', '.join(stacks)} against num_hidden_layers={count}, as recurrent-depth models cycle "
                         "them): a head taps the hidden state after one pass of one layer, which this model does "
                         "not have. The training-free strategies (suffix, jacobi) need no taps.")
    raise ValueError(f"Cannot find the decoder layers of {type(model).__name__} (expected a `.layers`, `.h` or "
                     "`.blocks` ModuleList)")


def compiled(model: nn.Module) -> bool:
    """``model`` (or its decoder) runs torch.compile'd code: ``model.compile()`` or ``forward = torch.compile(...)``."""
    modules = [model, getattr(model, "get_decoder", lambda: None)()]
    return any(m is not None and (getattr(m, "_compiled_call_impl", None) is not None
                                  or hasattr(getattr(m, "forward", None), "_torchdynamo_orig_callable"))
               for m in modules)


class FeatureTap:
    """Context manager recording the outputs of ``layer_ids`` during every forward inside it.

    ``features()`` takes the concatenation ``[b, T, len(layer_ids) * H]`` of the outputs of the forward since the
    last call, in ``layer_ids`` order (None when no layers are tapped); a forward whose hooks did not run is an
    error, never the previous forward's states again.
    """

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        self.model = model
        self.layer_ids = list(layer_ids)
        self.layers = decoder_layers(model) if self.layer_ids else None
        # layers with several residual streams output 4D states: hyper-connections (HY V4's `hc_mult`) as
        # [b, T, streams, H], Gemma 3n's AltUp as [streams, b, T, H]; the first stream is tapped
        self.stream_dim = 2 if getattr(model.config.get_text_config(), "hc_mult", None) else 0
        self._outputs: dict[int, torch.Tensor] = {}
        self._handles: list = []
        self._thread: int | None = None

    def __enter__(self) -> "FeatureTap":
        # the hooks sit on the model's shared layers: another thread generating with the same model at the same
        # time runs them too, so a tap records only the forwards of the thread that opened it
        self._thread = threading.get_ident()
        for i in self.layer_ids:
            self._handles.append(self.layers[i].register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._outputs.clear()

    def _hook(self, index: int):
        def hook(module, args, output):
            if threading.get_ident() != self._thread:
                return
            hidden = output[0] if isinstance(output, tuple) else output
            if hidden.dim() == 4:  # several residual streams (`stream_dim`)
                hidden = hidden.select(self.stream_dim, 0)
            self._outputs[index] = hidden

        return hook

    def features(self) -> torch.Tensor | None:
        if not self.layer_ids:
            return None
        missing = [i for i in self.layer_ids if i not in self._outputs]
        if missing and compiled(self.model):
            raise ValueError(
                f"{type(self.model).__name__} runs torch.compile'd code that skips the forward hooks through which a "
                f"JetSpec head reads target layers {missing} (code compiled before the hooks were added does not call "
                "them). Generate with a head on a model that is not compiled (tree steps change shape every step "
                "and would recompile anyway), or use the training-free strategies (suffix, jacobi), which read no "
                "hidden states.")
        if missing:
            raise RuntimeError(f"No hidden states were captured from target layers {missing}")
        outputs, self._outputs = self._outputs, {}
        return torch.cat([outputs[i] for i in self.layer_ids], dim=-1)
