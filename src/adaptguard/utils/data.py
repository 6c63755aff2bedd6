"""Loading datasets named on the command line or in configs."""

from __future__ import annotations

from pathlib import Path

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def check_local_path(spec: str, name: str) -> None:
    """Fail with "no such file or directory" when `spec` is written as a local path (absolute, ./ ../ ~, a data
    file suffix, or more slashes than a Hub id's org/name) and does not exist — rather than a Hub lookup error."""
    text = str(spec)
    path = Path(text).expanduser()
    looks_local = (path.is_absolute() or text.startswith((".", "~")) or path.suffix in DATA_SUFFIXES
                   or text.count("/") > 1)
    if looks_local and not path.exists():
        raise ValueError(f"{name}: {text}: no such file or directory")


def load_any_dataset(spec: str, split: str = "train"):
    """A `datasets.Dataset` from a `save_to_disk` directory, a .json/.jsonl/.csv/.parquet file, or a Hub name."""
    import datasets

    check_local_path(spec, "dataset")
    path = Path(spec)
    if path.is_dir():
        if not any((path / f).exists() for f in ("dataset_dict.json", "state.json", "dataset_info.json")):
            raise ValueError(f"{path}: a directory, but not a dataset saved with Dataset.save_to_disk")
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"{path}: no split {split!r} (splits: {sorted(data)})")
            return data[split]
        return data
    if path.is_file():
        kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(path.suffix)
        if kind is None:
            raise ValueError(f"{path}: unsupported dataset file type (use .json, .jsonl, .csv or .parquet)")
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    return datasets.load_dataset(spec, split=split)
