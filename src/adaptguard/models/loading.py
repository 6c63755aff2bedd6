"""Loading a causal LM as a user ships it: full precision, or quantized by a kept library given in that library's own
config words (`{"library": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}`), which is what
`adaptguard update` calls "quantization as an update"."""

from __future__ import annotations

import importlib.util

# library -> (transformers' config class, the module that must be importable, what to install)
QUANTIZATION_LIBRARIES = {
    "bitsandbytes": ("BitsAndBytesConfig", "bitsandbytes", "pip install 'adaptguard[quant]'"),
    "torchao": ("TorchAoConfig", "torchao", "pip install torchao"),
    "quanto": ("QuantoConfig", "optimum.quanto", "pip install optimum-quanto"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (optimum) is missing
        return False


def check_quantization(spec: dict, where: str = "quantization") -> None:
    """Fail before any work on a spec that cannot load: not a dict, no or an unknown `library` (the error lists the
    known ones), or the library not installed (ImportError naming what to install)."""
    if not isinstance(spec, dict) or "library" not in spec:
        raise ValueError(f"{where}: a dict with 'library' ({', '.join(QUANTIZATION_LIBRARIES)}) and that library's "
                         f"own config fields, got {spec!r}")
    library = spec["library"]
    if library not in QUANTIZATION_LIBRARIES:
        raise ValueError(f"{where}.library: unknown {library!r}; known: {', '.join(QUANTIZATION_LIBRARIES)}")
    _, module, install = QUANTIZATION_LIBRARIES[library]
    if not _installed(module):
        raise ImportError(f"{where}: {library} is not installed: {install}")


def quantization_config(spec: dict):
    """transformers' config object for `spec` (its fields but `library` passed as they are). torchao's schemes are
    config objects, so a spec names one as transformers saves it in a model's config.json:
    `{"library": "torchao", "quant_type": {"_type": "Int8WeightOnlyConfig", "_version": 2, "_data": {}}}` (the
    `{"default": ...}` wrapper transformers writes is accepted too)."""
    import transformers

    check_quantization(spec)
    cls = getattr(transformers, QUANTIZATION_LIBRARIES[spec["library"]][0])
    fields = {k: v for k, v in spec.items() if k != "library"}
    quant_type = fields.get("quant_type")
    if spec["library"] == "torchao" and isinstance(quant_type, dict):
        try:
            return cls.from_dict({**fields, "quant_type": quant_type if "default" in quant_type
                                  else {"default": quant_type}})
        except (ValueError, TypeError, KeyError, AssertionError) as e:
            raise ValueError(f"quantization.quant_type: torchao cannot build {quant_type!r}: {e}") from e
    return cls(**fields)


def load_causal_lm(path: str, quantization: dict | None = None, *, use_cpu: bool = False, prequantized: bool = False):
    """`AutoModelForCausalLM` from `path`, quantized by `quantization` when given, or as saved quantized
    (`prequantized`: its config.json says how); a quantized model is placed on the CPU when `use_cpu` or no GPU is
    present, else on the current GPU, as QLoRA scripts place it."""
    import torch
    from transformers import AutoModelForCausalLM

    if quantization is None and not prequantized:
        return AutoModelForCausalLM.from_pretrained(path)
    from ..utils.quiet import note_4bit_kernel

    device_map = "cpu" if use_cpu or not torch.cuda.is_available() else {"": torch.cuda.current_device()}
    extra = {} if quantization is None else {"quantization_config": quantization_config(quantization)}
    model = AutoModelForCausalLM.from_pretrained(path, device_map=device_map, **extra)
    if prequantized or quantization["library"] == "bitsandbytes":
        note_4bit_kernel()  # (says something only where bitsandbytes' kernel warning was hidden)
    return model
