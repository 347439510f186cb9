"""Where a target computes: the device its inputs and activations live on."""

from __future__ import annotations

import torch


def execution_device(model) -> torch.device:
    """The device ``model``'s forwards run on: that of its first parameter, or, when accelerate offloads the
    weights (``cpu_offload`` / ``disk_offload`` / a ``device_map`` with offloading leaves parameters on ``meta``),
    the device its hooks move them to for each forward."""
    device = next(model.parameters()).device
    if device.type != "meta":
        return device
    for module in (model, model.get_input_embeddings(), *model.modules()):
        hooked = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if hooked is not None:
            return torch.device(hooked) if not isinstance(hooked, int) else torch.device("cuda", hooked)
    return device


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one (``cuda`` and ``cuda:0`` are, with the default device 0)."""
    return (a.type, a.index or 0) == (b.type, b.index or 0)
