"""Training a JetSpec draft head: self-distilled data (``data``) and the training loop."""
