"""``model.generate(**inputs, assistant_model=head)`` with a `JetSpecHead`, enabled per model instance.

``enable(model)`` gives this one model object a subclass of its own class whose ``_assisted_decoding`` (the method
``generate()`` dispatches to when ``assistant_model`` is set) runs JetSpec tree decoding when the assistant is a
`JetSpecHead`, and HF's own assisted decoding otherwise; its ``_validate_generation_mode`` first checks that the
head was made for this target (generate()'s own check would otherwise ask a mismatched head for a second tokenizer).
``generate`` itself is not touched, other instances and the class are not touched, and the class name is kept
(``save_pretrained`` writes the same ``architectures``). Tree settings come from the head's config
(``head.config.tree_budget`` / ``tree_width``).
"""

from __future__ import annotations

import copy

import torch

from .decoding.jetspec import jetspec_generate
from .head import JetSpecHead

_SUBCLASSES: dict[type, type] = {}


def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                       streamer=None, inputs_tensor=None, assistant_model=None, **model_kwargs):
    if isinstance(assistant_model, JetSpecHead):
        for key in ("assistant_tokenizer", "tokenizer"):
            model_kwargs.pop(key, None)
        if model_kwargs.pop("draft_head", None) is not None:  # generate() lets None values through
            raise ValueError("assistant_model= already is the draft head: drop draft_head=")
        return jetspec_generate(
            self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
            draft_head=assistant_model, **model_kwargs,
        )
    return super(type(self), self)._assisted_decoding(
        input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=synced_gpus,
        streamer=streamer, inputs_tensor=inputs_tensor, assistant_model=assistant_model, **model_kwargs,
    )


def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs):
    assistant = generation_mode_kwargs.get("assistant_model") if isinstance(generation_mode_kwargs, dict) else None
    if isinstance(assistant, JetSpecHead):  # before generate()'s own check, which would ask for two tokenizers
        assistant.check_target(self)
        # a head drafts in the target's vocabulary: an assistant tokenizer (a pipeline passes one for a head saved
        # without the target's special token ids) has nothing to translate, and generate() would refuse it
        generation_mode_kwargs.pop("assistant_tokenizer", None)
        if generation_config.num_return_sequences > 1:  # HF's assisted decoding takes one; heads decode any rows
            generation_config = copy.copy(generation_config)
            generation_config.num_return_sequences = 1
    return super(type(self), self)._validate_generation_mode(generation_mode, generation_config,
                                                             generation_mode_kwargs, *args, **kwargs)


def _reduce_ex(self, protocol):
    """Pickle (``torch.save(model)``) an enabled model as its transformers class plus state: pickle finds classes
    by name, and the enabled subclass shares its base's name, so the default failed ("not the same object")."""
    return _rebuild, (type(self).__mro__[1], self.__getstate__())


def _rebuild(cls, state):
    model = cls.__new__(cls)
    model.__setstate__(state)
    return enable(model)


def enable(model):
    """Let ``model.generate(..., assistant_model=head)`` accept `JetSpecHead` s. Returns ``model`` (idempotent).
    A PEFT wrapper (``PeftModelForCausalLM``) is enabled through the transformers model it wraps, whose
    ``generate()`` its own calls."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "generate"):
        raise ValueError(f"enable() takes a loaded transformers model (whose generate() then accepts heads), got "
                         f"{type(model).__name__}")
    if hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None)):
        base = model.get_base_model()
        if base is not model:
            enable(base)
            return model
    cls = type(model)
    if cls in _SUBCLASSES.values():
        return model
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {"_assisted_decoding": _assisted_decoding, "_validate_generation_mode": _validate_generation_mode,
             "__reduce_ex__": _reduce_ex, "__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
    model.__class__ = _SUBCLASSES[cls]
    return model
