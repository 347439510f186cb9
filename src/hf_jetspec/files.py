"""Output files of long runs: checked before the run, written atomically, and saved elsewhere if a write still fails.

A benchmark takes minutes to hours; an output path that cannot be written must be refused before the first forward,
not after the last one. `check_file_path` / `check_folder_path` do that without creating anything. `write_atomic`
writes a sibling temporary file and renames it over the target, so a reader never sees half a file and a failed
write leaves the old file in place. `fallback_file` picks where results go when the intended path fails anyway.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable


def _existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest existing ancestor."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_creatable(path: Path, label: str) -> None:
    """Files can be created at ``path`` (an absent path): its nearest existing ancestor is a writable folder."""
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        raise NotADirectoryError(f"{label} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"{label} {path}: cannot create files in {ancestor} (no write permission)")


def check_file_path(path: str | os.PathLike, label: str = "output") -> Path:
    """Refuse a file path that cannot be written (a folder, an unwritable file, a file as a parent folder, a parent
    without write permission). Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{label} {path}: is a folder, expected a file name")
    if path.exists():
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{label} {path}: not writable")
    else:
        _check_creatable(path, label)
    return path


def check_folder_path(path: str | os.PathLike, label: str = "output folder") -> Path:
    """Refuse a folder path where files cannot be written (an existing file, no write permission). Creates
    nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{label} {path}: is a file, expected a folder")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{label} {path}: not writable")
    else:
        _check_creatable(path, label)
    return path


def refuse_foreign_files(folder: str | os.PathLike, names, ours: Callable[[Path], bool], label: str) -> None:
    """Refuse to write the files ``names`` into ``folder`` when one of them is already there and the folder is not
    one this library wrote (``ours(folder)``, e.g. an earlier export): a user's model, card or notes are never
    overwritten without asking. Creates nothing."""
    folder = Path(folder)
    present = sorted(name for name in names if (folder / name).exists())
    if present and not ours(folder):
        raise FileExistsError(f"{label} {folder} already holds {', '.join(present)}, which hf_jetspec did not write "
                              "there: choose a new or empty folder (nothing was written)")


def json_field(path: Path, *keys: str):
    """``path``'s JSON object's value at ``keys`` (nested), or None when the file is missing, not JSON or lacks it."""
    try:
        value = json.loads(path.read_text())
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value
    except (OSError, ValueError):
        return None


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Create ``path``'s folder, let ``write(temporary_path)`` fill a temporary sibling, then rename it over
    ``path``. On any error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def fallback_file(name: str, folders: list[str | os.PathLike]) -> Path:
    """A new path ``<folder>/<stem>-<time>.<suffix>`` in the first of ``folders`` (then the system's temporary
    folder) where a file can be created."""
    stem, dot, suffix = name.rpartition(".")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in [*folders, tempfile.gettempdir()]:
        try:
            check_folder_path(folder)
        except OSError:
            continue
        return Path(folder) / f"{stem or name}-{stamp}-{os.getpid()}{dot}{suffix if stem else ''}"
    raise OSError(f"no writable folder for {name}")
