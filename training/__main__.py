"""``python -m hf_jetspec.training`` / ``accelerate launch -m hf_jetspec.training``: same as ``hf-jetspec train``."""

import sys

from .trainer import main

sys.exit(main())
