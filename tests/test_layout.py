"""The package's import direction (docs/how-it-works.md): the CLI is the top, nothing else imports it; the engine's
building blocks (tree, acceptance, verify, suffix indexes, candidate tries) never import a decoding loop, the benchmark or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("src/hf_jetspec", "training", "kernels") for p in (ROOT / folder).rglob("*.py"))
TOP = {"cli", "cli_parser", "bench"}  # user-facing layers
BLOCKS = {"tree", "acceptance", "verify", "suffix_index", "candidates", "calibration", "cache", "attention", "tokens",
          "limits"}


def imported_modules(path: Path) -> set[str]:
    """The hf_jetspec modules ``path`` imports, as their last dotted component (``hf_jetspec.cli`` -> ``cli``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and not module.startswith("hf_jetspec"):
                continue
            if module in ("", "hf_jetspec") or module.endswith("hf_jetspec"):
                names.update(alias.name for alias in node.names)  # from . import cli
            else:
                names.add(module.split(".")[-1])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[-1] for a in node.names if a.name.startswith("hf_jetspec."))
    return names


def test_sources_found():
    assert len(SOURCES) > 30 and any(p.name == "cli.py" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_import_direction(path):
    imports = imported_modules(path)
    if path.name not in ("cli.py", "cli_parser.py"):
        cli = imports & {"cli", "cli_parser"}
        assert not cli, f"{path.relative_to(ROOT)} imports the CLI's {sorted(cli)} (move what it needs below it)"
    if path.parent.name == "hf_jetspec" and path.stem in BLOCKS:
        upward = imports & (TOP | {"decoding", "jetspec", "jacobi", "spec_jacobi", "suffix", "session", "strategies"})
        assert not upward, f"{path.relative_to(ROOT)} (a building block) imports {sorted(upward)}"


def _run_from_root(code: str, *flags: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_top_level_kernels_name_is_handed_over():
    """From the repository root, ``kernels/`` is importable as a top-level ``kernels`` package; that name belongs to
    the Hub ``kernels`` package, which transformers >= 5.25 imports while importing itself (it failed with "cannot
    import name 'CUDAProperties' from 'kernels' (<repo>/kernels/__init__.py)" for ``python -m`` from the root)."""
    import sys
    from importlib.machinery import PathFinder

    installed = PathFinder.find_spec("kernels", [p for p in sys.path if Path(p or ".").resolve() != ROOT])
    hub_kernels = installed is not None
    code = (
        "import sys, kernels\n"
        "print(kernels.__file__)\n"
        "from transformers import PreTrainedModel\n"  # imports the Hub package where transformers probes for it
        "import hf_jetspec.kernels as ours\n"
        "print(ours.__file__, callable(ours.register), sys.modules['kernels'] is kernels)\n"
    )
    result = _run_from_root(code)
    if hub_kernels:
        assert result.returncode == 0, result.stderr[-2000:]
        first, second = result.stdout.split("\n")[:2]
        assert first == str(installed.origin)
        assert second == f"{ROOT / 'kernels' / '__init__.py'} True True"
    else:  # no Hub package (transformers < 5.25): the folder imports as itself and transformers ignores it
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split("\n")[0] == str(ROOT / "kernels" / "__init__.py")
