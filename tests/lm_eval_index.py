"""lm-eval's index of its own ~14,000 task YAMLs, built once per test session instead of once per lm-eval process.

Every `lm_eval` and `adaptguard lm-eval` run of the suite (about twenty processes, plus the tests' own TaskManagers)
would otherwise walk and parse lm-eval's task folder anew: 11-20 s each on 2 cores. Only that part of
`TaskIndex.build` is cached (as JSON, in a folder of this session named by ADAPTGUARD_TEST_LM_EVAL_INDEX); the
folders a test gives are indexed as lm-eval indexes them, and merged over the defaults as lm-eval merges them.
Installed in pytest's processes by conftest, and in every subprocess by `subprocess_hooks/sitecustomize.py`.
Standard library only: a subprocess that must not import lm-eval does not."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

MODULE = "lm_eval.tasks._index"
log = logging.getLogger(MODULE)  # lm-eval's own logger for the override warning below


def install() -> None:
    """Cache the defaults' part of lm-eval's `TaskIndex.build`, now or when lm-eval is imported."""
    if not os.environ.get("ADAPTGUARD_TEST_LM_EVAL_INDEX"):
        return
    if MODULE in sys.modules:
        _patch(sys.modules[MODULE])
    elif not any(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path):  # (sitecustomize's copy, or ours)
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_and_patch(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _patch(module) -> None:
    index_cls = module.TaskIndex
    if getattr(index_cls.build, "adaptguard_cached", False):
        return
    original = index_cls.build
    defaults = (Path(module.__file__).parent).resolve()  # lm_eval/tasks, what TaskManager adds first

    def build(paths, *, resolve_includes=True):
        paths = [Path(p) for p in paths]
        if not resolve_includes or not paths or paths[0].resolve() != defaults:
            return original(paths, resolve_includes=resolve_includes)
        index = _default_entries(module, original, defaults)
        for name, entry in original(paths[1:]).items():  # the given folders, over the defaults as lm-eval does
            if name in index:
                log.warning("Task '%s' from %s overrides existing task from %s", name, entry.yaml_path,
                            index[name].yaml_path)
            index[name] = entry
        return index

    build.adaptguard_cached, build.original = True, original
    index_cls.build = staticmethod(build)


def _default_entries(module, original, root: Path) -> dict:
    from filelock import FileLock  # lm-eval is being imported here: its dependencies are too

    cache = Path(os.environ["ADAPTGUARD_TEST_LM_EVAL_INDEX"]) / "defaults.json"
    with FileLock(str(cache) + ".lock"):
        if not cache.exists():
            rows = {name: {"name": e.name, "kind": e.kind.name, "cfg": e.cfg, "tags": sorted(e.tags),
                           "yaml_path": None if e.yaml_path is None else str(e.yaml_path)}
                    for name, e in original([root]).items()}
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(rows))
            tmp.replace(cache)
    rows = json.loads(cache.read_text())
    return {name: module.Entry(name=r["name"], kind=module.Kind[r["kind"]], cfg=r["cfg"], tags=set(r["tags"]),
                               yaml_path=None if r["yaml_path"] is None else Path(r["yaml_path"]))
            for name, r in rows.items()}
