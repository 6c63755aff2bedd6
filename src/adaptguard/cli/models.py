"""What the commands that load a model share: the default model, a dtype by name, the embedding options, and
`embedded:`/`built:` names in `--model_args` (the [train] extra)."""

from __future__ import annotations

from .common import positive_int


def default_model(name: str | None) -> str:
    """The embedded default when no model is named: every command runs offline. `embedded:<name>` or
    `built:<name>` names one of ours."""
    from ..models.embedded import embedded_model_path, resolve_model

    if name:
        name = resolve_model(name)
        from ..utils.data import check_local_path

        check_local_path(name, "model")
        return name
    return str(embedded_model_path("tiny"))


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def add_embedding_options(parser) -> None:
    """The options of the commands that embed datasets (`drift risk`, `select`)."""
    parser.add_argument("--model", help="embedding model, Hub id or path (default: the embedded tiny model)")
    parser.add_argument("--embedder", default="mean_pooled", help="registered embedder (mean_pooled, sentence, ...)")
    parser.add_argument("--max-examples", type=positive_int, default=256, help="rows embedded per dataset (seeded sample)")
    parser.add_argument("--text-column", default="text", help="column holding the text (default text)")
    parser.add_argument("--split", default="train", help="dataset split (default train)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row sample and ablations (default 0)")
    parser.add_argument("--device", default="cpu", help="torch device for the embedder (default cpu)")


def resolve_model_names(arg: str) -> str:
    """`--model_args pretrained=built:smollm2,...`: each `embedded:<name>` or `built:<name>` value becomes that
    model's local path."""
    import re

    from ..models.embedded import resolve_model

    return re.sub(r"(?<==)(?:embedded|built):[\w-]+", lambda m: resolve_model(m.group(0)), arg)

