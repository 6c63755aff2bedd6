"""The model names every command accepts besides Hub ids and paths: `embedded:tiny` and `embedded:tiny-v2` (toy
bases shipped in `embedded_models/`, with their recipe and `--rebuild`: `embedded`), and `built:smollm2`
(SmolLM2-135M-Instruct, built once on this machine from its PyPI wheel: `smollm2`, `wheels`)."""

from .embedded import (
    BUILT_NAMES,
    EMBEDDED_NAMES,
    built_model_path,
    check_model_name,
    embedded_model_path,
    load_embedded,
    resolve_model,
)

__all__ = ["BUILT_NAMES", "EMBEDDED_NAMES", "built_model_path", "check_model_name", "embedded_model_path",
           "load_embedded", "resolve_model"]
