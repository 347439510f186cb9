"""custom_generate entry point: ``model.generate(**inputs, custom_generate=<this repo or folder>,
trust_remote_code=True, draft_head=head)`` runs JetSpec decoding (``strategy="jacobi"`` / ``"spec-jacobi"`` for the
Jacobi loops). transformers hands this function every ``generate()`` argument and prepares nothing itself, so it
calls ``model.generate`` again with the matching hf_jetspec decoding function, which gets the full preparation
(cache, logits processors, stopping criteria)."""

import hf_jetspec


def generate(model, *args, strategy="jetspec", **kwargs):
    spec = hf_jetspec.STRATEGIES.get(strategy)
    if spec is None or spec.function is None or "reference" in spec.needs:
        runnable = [name for name, s in hf_jetspec.STRATEGIES.items() if s.function and "reference" not in s.needs]
        why = "is unknown" if spec is None else "is benchmark-only (no custom_generate entry)"
        raise ValueError(f"strategy {strategy!r} {why}; choose from {runnable}")
    streamer = kwargs.pop("streamer", None)
    if streamer is not None:  # generate() does not forward `streamer` to callables: hand it over explicitly
        kwargs["token_streamer"] = streamer
    return model.generate(*args, custom_generate=spec.function, **(spec.options | kwargs))
