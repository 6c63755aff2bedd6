"""Task selection's built-in embedders, registered through the `adaptguard_embedders` hook (listed in
`adaptguard.plugins.manager.BUILTIN_PLUGINS`)."""

from __future__ import annotations

from ..plugins.hookspecs import hookimpl
from .embedders import mean_pooled, sentence


@hookimpl
def adaptguard_embedders() -> dict:
    return {"mean_pooled": mean_pooled, "sentence": sentence}
