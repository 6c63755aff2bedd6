"""The layering of docs/architecture.md, enforced: the import-linter contracts of pyproject.toml (maths imports only
the standard library, numpy, scipy and torch; the library never imports the CLI; the package never imports the
studies; no import cycles), plus
checks that the contracts can fail and that importing the maths does not load the glue."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

MATHS = ["adaptguard.talr.losses", "adaptguard.muscle.losses", "adaptguard.muscle.masks", "adaptguard.compat.stats.metrics",
         "adaptguard.drift.bsc", "adaptguard.drift.theory", "adaptguard.selection.coverage", "adaptguard.utils.labels"]


def lint_imports(root, config) -> subprocess.CompletedProcess:
    # grimp reads the source tree from sys.path; the editable install maps adaptguard through an import hook
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}  # root: the studies
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(config_filename=sys.argv[1]))"
    return subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, cwd=root,
                          env=env, timeout=300)


def test_import_contracts_hold():
    proc = lint_imports(ROOT, ROOT / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "7 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("culprit, contract", [
    ("talr/losses.py", "The paper maths imports only"),       # maths reaching for a trainer library
    ("muscle/masks.py", "The package never imports the studies"),
    ("update/config.py", "The package never imports the studies"),  # the product's own homes
    ("demo/run.py", "The package never imports the studies"),
    ("data/bigbench.py", "The package never imports the studies"),
    ("models/embedded.py", "The library never imports the CLI"),
    ("utils/labels.py", "No import cycles"),                   # utils -> talr while talr imports utils
    ("compat/reading/runs.py", "compat by concern"),           # reading runs reaching up for the decisions
    ("compat/stats/replicates.py", "compat by concern"),       # the statistics reaching for a run reader
    ("compat/gate.py", "The gate imports no training stack"),  # the gate reaching for torch
    ("cli/compare.py", "The gate imports no training stack"),  # compare's command through a model loader
    ("testing/plugin.py", "The gate imports no training stack"),
    ("compat/decide.py", "lm-eval is imported by the harness glue alone"),
    ("cli/evaluate.py", "lm-eval is imported by the harness glue alone"),
])
def test_a_bad_import_breaks_a_contract(tmp_path, culprit, contract):
    """The same contracts on a copy of the source with one bad import added: lint-imports must fail, naming it."""
    import shutil

    for folder in ("src", "studies"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = {"talr/losses.py": "import transformers  # noqa\n",
           "muscle/masks.py": "from studies import common  # noqa\n",
           "update/config.py": "import studies.common  # noqa\n",
           "demo/run.py": "from studies.real_update import E1  # noqa\n",
           "data/bigbench.py": "from studies.talr_vs_sft import E2  # noqa\n",
           "models/embedded.py": "from ..cli import main  # noqa\n",
           "utils/labels.py": "from ..talr import losses  # noqa\n",
           "compat/reading/runs.py": "from ..decide import churn  # noqa\n",
           "compat/stats/replicates.py": "from ..reading import formats  # noqa\n",
           "compat/gate.py": "import torch  # noqa\n",
           "cli/compare.py": "from ..models.embedded import default_model  # noqa\n",
           "testing/plugin.py": "import pandas  # noqa\n",
           "compat/decide.py": "import lm_eval  # noqa\n",
           "cli/evaluate.py": "from lm_eval.api.registry import get_model  # noqa\n"}[culprit]
    path = tmp_path / "src" / "adaptguard" / culprit
    path.write_text(path.read_text() + bad)
    proc = lint_imports(tmp_path, tmp_path / "pyproject.toml")
    assert proc.returncode != 0
    broken = proc.stdout[proc.stdout.index("Broken contracts"):]
    assert contract in broken, proc.stdout[-3000:]


def test_only_the_cli_may_import_the_cli():
    """The "never imports the CLI" contract names every subpackage and module of adaptguard but the CLI itself, so a
    new package (a new product home) cannot slip past it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    sources = set(next(c for c in contracts if c["name"] == "The library never imports the CLI")["source_modules"])
    package = ROOT / "src" / "adaptguard"
    library = {f"adaptguard.{p.stem}" for p in package.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert library - {"adaptguard.cli"} == sources


def test_importing_the_maths_loads_no_glue():
    """At run time too: the maths modules pull in neither TRL, transformers, datasets, lm-eval nor matplotlib."""
    code = textwrap.dedent(f"""
        import importlib, sys
        for name in {MATHS!r}:
            importlib.import_module(name)
        heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'trl', 'transformers', 'datasets', 'lm_eval',
                        'matplotlib', 'peft', 'accelerate', 'pluggy'}})
        print(','.join(heavy))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ""


def test_ruff_passes():
    """The code passes the ruff configuration of pyproject.toml."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "studies", "tests", "lm_eval_tasks",
                           "examples", "benchmarks", "plugins"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
