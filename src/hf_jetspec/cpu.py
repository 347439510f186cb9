"""CPU BLAS tuning for multi-token verification forwards.

Speculative decoding verifies several tokens per target forward: its matrix products have 2-64 rows where plain
decoding multiplies single rows. Intel MKL (PyTorch's BLAS on x86) dispatches those small matrix-matrix products
to generic kernels on non-Intel CPUs; pinning MKL's code path to the CPU's own vector ISA with ``MKL_CBWR`` makes
them about twice as fast there (SmolLM2-135M on an AMD EPYC: an 8-token forward ~2.0x a one-token forward by
default, ~1.3x pinned; see docs/results.md) and leaves one-row products as they were. The setting applies to a
whole process and must be made before its first matrix product, so the ``hf-jetspec`` command does it at start;
library users call `tune_mkl()` first thing (or export ``MKL_CBWR`` themselves).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

MKL_BRANCHES = ("AVX512", "AVX2")  # torch CPU capabilities that are also MKL_CBWR branch names


def cpu_vendor() -> str | None:
    """The x86 vendor string (``GenuineIntel``, ``AuthenticAMD``, ...) on Linux, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def mkl_code_path(vendor: str | None = None, capability: str | None = None) -> str | None:
    """The ``MKL_CBWR`` value worth setting here: the CPU's vector ISA on a non-Intel x86 CPU whose PyTorch uses
    MKL; None where MKL already picks its own fast kernels (Intel) or is not in use."""
    vendor = cpu_vendor() if vendor is None else vendor
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if not torch.backends.mkl.is_available() or vendor in (None, "GenuineIntel"):
        return None
    return capability if capability in MKL_BRANCHES else None


def tune_mkl() -> str | None:
    """Set ``MKL_CBWR`` to `mkl_code_path()` for this process unless it is set already (the user's choice wins).
    Returns the value in effect. Call it before the process's first matrix product; later calls change nothing in
    an MKL that has already started."""
    if os.environ.get("MKL_CBWR"):
        return os.environ["MKL_CBWR"]
    value = mkl_code_path()
    if value is not None:
        os.environ["MKL_CBWR"] = value
    return value
