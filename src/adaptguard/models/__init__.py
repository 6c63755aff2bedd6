"""The model names every command accepts besides Hub ids and paths: `embedded:tiny` and `embedded:tiny-v2` (toy
bases shipped in `embedded_models/`, with their recipe and `--rebuild`: `embedded`), `embedded:smollm2`
(SmolLM2-135M-Instruct built from its PyPI wheel: `smollm2`, `wheels`)."""

from .embedded import EMBEDDED_NAMES, embedded_model_path, load_embedded, resolve_model

__all__ = ["EMBEDDED_NAMES", "embedded_model_path", "load_embedded", "resolve_model"]
