"""Atomic file writes: the content goes to a temporary file beside the target, which is then
renamed onto it (``os.replace``), so a reader never sees a half-written file and a failure
leaves the old file (or none) in place. The one implementation for every writer of fedpriv."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_with(path: str | os.PathLike, write: Callable[[str], None], *, mode: int | None = None) -> Path:
    """``write(tmp_path)`` fills a temporary file next to ``path``; it is then renamed onto
    ``path`` (``mode``: its permissions, e.g. 0o600). The temporary file is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text(path: str | os.PathLike, text: str, *, mode: int | None = None) -> Path:
    """``text`` (UTF-8) written atomically to ``path``."""
    return write_with(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), mode=mode)


def write_bytes(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """``data`` written atomically to ``path``."""
    return write_with(path, lambda tmp: Path(tmp).write_bytes(data), mode=mode)


def write_folder(path: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """``fill(tmp)`` writes every file of a folder into a temporary folder beside ``path``, which
    then replaces ``path`` (an earlier folder there is removed first): all files appear at once
    or none; the temporary folder is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        fill(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
