"""Training a JetSpec draft head: self-distilled data (``data``), feature stores (``features``), the loss (``loss``),
the ``Trainer`` subclass (``trainer``), draft vocabularies (``vocab``) and diagnosis (``diagnose``).

This folder sits at the top of the repository and installs as ``hf_jetspec.training``; it imports from the package
(``hf_jetspec.models``, ``hf_jetspec.head``, ...), and the package never imports it at import time."""
