"""The compatibility metrics' built-ins, registered through adaptguard's hooks (listed in
`adaptguard.plugins.manager.BUILTIN_PLUGINS`): the similarity functions of generative flips and the directory of
adaptguard's own lm-eval tasks."""

from __future__ import annotations

from pathlib import Path

from ...plugins.hookspecs import hookimpl
from .similarities import SIMILARITIES


@hookimpl
def adaptguard_similarities() -> dict:
    return dict(SIMILARITIES)


@hookimpl
def adaptguard_lm_eval_task_dirs() -> list:
    from ... import lm_eval_tasks  # the YAML folder, installed as a data package

    return [Path(lm_eval_tasks.__file__).parent]
