"""Writing outputs so that a reader never sees half a file or directory: write aside, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
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


def check_replaceable(target: str | os.PathLike, ours: Callable[[Path], bool], what: str, name: str = "path") -> None:
    """Refuse to replace `target` unless it is absent, an empty directory, or `ours(target)`: a directory this
    library wrote before (`what` names it, `name` the argument, in the message). Never delete what we did not write."""
    target = Path(target)
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"{name}: {target} is a file, not {what}; refusing to replace it (choose another path)")
    if any(target.iterdir()) and not ours(target):
        raise ValueError(f"{name}: {target} is a non-empty directory that is not {what}; refusing to replace it, "
                         "nothing was written (choose a new path, or remove it yourself)")


def replace_dir(tmp: Path, target: Path, ours: Callable[[Path], bool] | None = None, what: str = "an output") -> None:
    """Move the finished directory `tmp` to `target`, replacing an older one only once `tmp` is complete, and only
    when `ours(target)` says the older one is this library's output (see `check_replaceable`; None: any)."""
    if ours is not None:
        check_replaceable(target, ours, what)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` holds only what `datasets.save_to_disk` writes (a Dataset, or a DatasetDict of them)."""
    entries = list(path.iterdir())
    if not any(e.name in DATASET_FILES for e in entries):
        return False
    return all((e.is_file() and (e.name in DATASET_FILES or (e.name.startswith("data-") and e.suffix == ".arrow")))
               or (e.is_dir() and is_saved_dataset(e)) for e in entries)


def check_dataset_output(path: str | os.PathLike, name: str = "path") -> None:
    """Fail now (before any work) when `write_dataset(..., path)` would have to replace something not ours;
    `name` is the argument the message names."""
    path = Path(path)
    if path.suffix == ".jsonl":
        if path.is_dir():
            raise ValueError(f"{name}: {path} is a directory; a .jsonl path must name a file")
        return
    check_replaceable(path, is_saved_dataset, "a dataset saved by save_to_disk", name)


def write_dataset(dataset, path: str | os.PathLike) -> Path:
    """Save `dataset` to `path` atomically: a `.jsonl` file (one row per line), else a `save_to_disk`
    directory (reload with `datasets.load_from_disk`). An existing output is replaced only once the
    new one is complete, and a directory only when it is an earlier `save_to_disk` output (anything else:
    ValueError, nothing deleted). Returns the path."""
    path = Path(path)
    check_dataset_output(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            dataset.to_json(tmp, lines=True, force_ascii=False)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the data from the jobs that train on it
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        dataset.save_to_disk(str(tmp))
        os.chmod(tmp, 0o755)  # mkdtemp's 0700, likewise
        replace_dir(tmp, path, is_saved_dataset, "a dataset saved by save_to_disk")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


@contextmanager
def finished_dir(target: Path):
    """A temporary sibling of `target` to write into, renamed to `target` only when the block completes: an
    interrupted or failed training leaves no half-trained adapter folder (the temporary one is removed)."""
    tmp = target.with_name(f".{target.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, target)
