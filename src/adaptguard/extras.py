"""Which extra installs which package: `pip install adaptguard` is the gate (compare, the Action, the pytest plugin),
and a name that needs more fails with one line naming the extra to install (`pip install 'adaptguard[train]'`).

One place holds the map; the lazy exports of `adaptguard`, the CLI and the plugin manager read it.
"""

from __future__ import annotations

import importlib.util

# top-level import name -> the extra of pyproject.toml that installs it
EXTRA_OF = {
    "torch": "train", "transformers": "train", "trl": "train", "peft": "train", "accelerate": "train",
    "datasets": "train", "tokenizers": "train", "safetensors": "train", "filelock": "train", "tqdm": "train",
    "lm_eval": "eval", "rouge_score": "eval", "sacrebleu": "eval", "jiwer": "eval", "yaml": "eval",
    "matplotlib": "plots", "gguf": "real", "bitsandbytes": "quant", "torchao": "schemes", "optimum": "schemes",
    "cut_cross_entropy": "cce", "medcalc_bench": "medcalc", "inspect_ai": "inspect", "pyarrow": "lighteval",
    "ray": "distributed", "submitit": "distributed",
}


# an extra that installs another (pyproject.toml: eval = ["adaptguard[train]", ...]); tests/test_extras.py holds
# both maps to pyproject.toml
BRINGS = {"eval": "train", "real": "train", "quant": "train", "schemes": "quant"}


def installed(package: str) -> bool:
    """Whether the top-level `package` can be imported here (found on the path; not imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module left in sys.modules without a spec
        return False


class MissingExtraError(ImportError):
    """A package of an extra that is not installed; the message is the one line to act on."""


def missing_extra(err: BaseException, what: str = "this", extra: str | None = None) -> MissingExtraError | None:
    """The one-line error for `err` when it is a missing package of one of adaptguard's extras (the package itself
    absent, not a broken install of it), else None. `what` names what needed it (a command, a class); `extra` the
    extra to name when it is not the package's own (evaluate needs [eval], which brings torch with it)."""
    if isinstance(err, MissingExtraError):
        return err
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    package = err.name.split(".")[0]
    if package not in EXTRA_OF or installed(package):
        return None
    extra = extra or EXTRA_OF[package]
    return MissingExtraError(f"{what} needs {package}, which adaptguard's core does not install: "
                             f"pip install 'adaptguard[{extra}]'", name=err.name)


def require(extra: str, what: str) -> None:
    """Raise `MissingExtraError` naming `extra` when a package it installs (or one of the extra it brings) is not
    installed: checked before a command starts, so it fails in one line before it prints or writes anything."""
    needed, current = [], extra
    while current:
        needed += [package for package, owner in EXTRA_OF.items() if owner == current]
        current = BRINGS.get(current)
    for package in needed:
        if not installed(package):
            raise MissingExtraError(f"{what} needs {package}, which adaptguard's core does not install: "
                                    f"pip install 'adaptguard[{extra}]'", name=package)
