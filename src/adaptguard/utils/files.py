"""Writing outputs so that a reader never sees half a file or directory: write aside, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def atomic_write(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False) -> Path:
    """Call `write(f)` on a temporary file next to `path`, then rename it to `path`: readers never see half a
    file, and a failure (an exception in `write`) leaves neither the temporary file nor a changed `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; an output should be as readable as any written file
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically (see `atomic_write`)."""
    return atomic_write(path, lambda f: f.write(text))


def replace_dir(tmp: Path, target: Path) -> None:
    """Move the finished directory `tmp` to `target`, replacing an older one only once `tmp` is complete."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_dataset(dataset, path: str | os.PathLike) -> Path:
    """Save `dataset` to `path` atomically: a `.jsonl` file (one row per line), else a `save_to_disk`
    directory (reload with `datasets.load_from_disk`). An existing output is replaced only once the
    new one is complete. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        if path.is_dir():
            raise ValueError(f"path: {path} is a directory; a .jsonl path must name a file")
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            dataset.to_json(tmp, lines=True, force_ascii=False)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the data from the jobs that train on it
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path
    if path.exists() and not path.is_dir():
        raise ValueError(f"path: {path} is a file; use a .jsonl path or a directory for save_to_disk")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        dataset.save_to_disk(str(tmp))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700, likewise
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
