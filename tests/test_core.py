"""The core (`pip install adaptguard`, no extra) is the gate: `compare --fail-on`, the Action's module, the pytest
plugin and `assert_compatible` run in processes where importing the training stack raises, and what needs an extra
says which in one line. The packages are hidden as if not installed (a finder that refuses them, in every
subprocess through sitecustomize); `.ci/run` also builds a real core venv and runs the same gate there."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

import adaptguard
from adaptguard import extras

STACK = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "pandas", "pyarrow", "lm_eval",
         "tokenizers", "safetensors", "sklearn")  # matplotlib is [plots]: the page draws its figure where it is

HIDE = textwrap.dedent("""
    import os, sys

    HIDDEN = set(os.environ["HIDE_PACKAGES"].split(","))
    LOG = os.environ["HIDE_LOG"]

    class _NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HIDDEN:
                with open(LOG, "a") as f:
                    f.write(name + "\\n")
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


@pytest.fixture
def core_env(tmp_path):
    """An environment whose Python processes (and theirs) cannot import STACK; the log lists every attempt."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HIDE)
    log = tmp_path / "hidden-imports.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_", "PYTEST_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(hooks), str(ROOT / "tests")]), HIDE_PACKAGES=",".join(STACK),
               HIDE_LOG=str(log))
    return env, log


def _run(args, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, **kw)


def _attempts(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_the_hiding_works(core_env):
    env, log = core_env
    proc = _run([sys.executable, "-c", "import torch"], env)
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr
    assert _attempts(log) == ["torch"]


def test_compare_gates_the_shipped_pair_without_the_training_stack(core_env, tmp_path):
    env, log = core_env
    report = tmp_path / "report.json"
    proc = _run([sys.executable, "-m", "adaptguard.cli", "compare", "example:fp32", "example:int8",
                 "--fail-on", "nfr>10%", "--json", str(report), "--markdown", str(tmp_path / "r.md"),
                 "--html", str(tmp_path / "r.html")], env)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the shipped pair breaches nfr>10%
    assert json.loads(report.read_text())["gate"]["status"] == "breach"
    assert (tmp_path / "r.html").stat().st_size > 0
    assert _attempts(log) == [], "the gate tried to import the training stack"


def test_the_actions_module_runs_without_the_training_stack(core_env, tmp_path):
    env, log = core_env
    outputs, summary = tmp_path / "out.txt", tmp_path / "summary.md"
    env = {**env, "INPUT_OLD": "example:fp32", "INPUT_NEW": "example:int8", "INPUT_FAIL_ON": "nfr>10%",
           "INPUT_HTML": str(tmp_path / "gate.html"), "INPUT_MARKDOWN": str(tmp_path / "gate.md"),
           "GITHUB_OUTPUT": str(outputs), "GITHUB_STEP_SUMMARY": str(summary), "RUNNER_TEMP": str(tmp_path)}
    proc = _run([sys.executable, "-m", "adaptguard.compat.action"], env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "decision=breach\n" in outputs.read_text()
    assert _attempts(log) == []


def test_the_pytest_plugin_and_assert_compatible_run_without_the_training_stack(core_env, tmp_path):
    env, log = core_env
    (tmp_path / "test_gate.py").write_text(textwrap.dedent("""
        import pytest
        from adaptguard.testing import assert_compatible

        def test_loose_gate_passes():
            assert_compatible("example:fp32", "example:int8", "nfr>50%")

        def test_tight_gate_fails(adaptguard_gate):
            with pytest.raises(AssertionError, match="nfr"):
                adaptguard_gate("nfr>10%")
    """))
    proc = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--adaptguard-old", "example:fp32",
                 "--adaptguard-new", "example:int8", str(tmp_path / "test_gate.py")], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout and "adaptguard gates" in proc.stdout
    assert _attempts(log) == []


@pytest.mark.parametrize("name, extra", [("TALRTrainer", "train"), ("MUSCLEConfig", "train"),
                                         ("LMEvalCallback", "eval")])
def test_a_name_that_needs_an_extra_says_which(core_env, name, extra):
    env, _ = core_env
    proc = _run([sys.executable, "-c", f"from adaptguard import {name}"], env)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("adaptguard.extras.MissingExtraError: ") and f"adaptguard.{name} needs " in last
    assert last.endswith(f"pip install 'adaptguard[{extra}]'"), last


@pytest.mark.parametrize("argv, package, extra", [
    (["demo", "--quick", "--out", "demo-out"], "torch", "train"),
    (["update", "--preset", "tiny", "--out", "update-out"], "torch", "train"),
    (["evaluate", "example:fp32", "--model-args", "pretrained=x", "--fail-on", "nfr>2%", "--output-path", "ev"],
     "lm_eval", "eval"),
    (["lm-eval", "--tasks", "x", "--output_path", "lm"], "lm_eval", "eval"),
    (["drift", "risk", "--finetune", "a", "--keep", "b"], "torch", "train"),
])
def test_a_command_that_needs_an_extra_is_one_line_and_exit_2(core_env, tmp_path, argv, package, extra):
    env, _ = core_env
    work = tmp_path / "work"
    work.mkdir()
    proc = _run([sys.executable, "-m", "adaptguard.cli", *argv], env, cwd=work)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == "" and list(work.iterdir()) == []  # nothing said or written before the refusal
    command = "drift risk" if argv[0] == "drift" else argv[0]
    assert proc.stderr == (f"adaptguard {command}: error: adaptguard {command} needs {package}, which adaptguard's "
                           f"core does not install: pip install 'adaptguard[{extra}]'\n")


def test_help_needs_no_extra(core_env):
    env, _ = core_env
    for argv in (["--help"], ["demo", "--help"], ["evaluate", "--help"], ["compare", "--help"]):
        proc = _run([sys.executable, "-m", "adaptguard.cli", *argv], env)
        assert proc.returncode == 0 and "usage: adaptguard" in proc.stdout, (argv, proc.stderr[-2000:])


def test_the_extras_map_agrees_with_pyproject():
    """Every package adaptguard.extras names is a requirement of its extra in pyproject.toml (or brought by one,
    named here), every extra it says brings another does, and the core requires none of them."""
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]

    def names(requirements):
        return {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
                for r in requirements}

    distribution = {"lm_eval": "lm-eval", "rouge_score": "rouge-score", "optimum": "optimum-quanto",
                    "cut_cross_entropy": "cut-cross-entropy", "medcalc_bench": "medcalc-bench",
                    "inspect_ai": "inspect-ai"}
    brought = {"yaml": "lm-eval", "tqdm": "transformers"}  # not listed: the extra's own packages require them
    for package, extra in extras.EXTRA_OF.items():
        wanted = brought.get(package, distribution.get(package, package))
        assert wanted in names(optional[extra]), (package, extra)
    for extra, other in extras.BRINGS.items():
        assert f"adaptguard[{other}]" in optional[extra], extra
    core = names(project["dependencies"])
    assert core == {"numpy", "scipy", "msgspec", "pluggy"}
    assert not core & {distribution.get(p, p) for p in extras.EXTRA_OF}
    assert "train" in optional and "eval" in optional
    assert {"adaptguard[train,eval,plots,real,quant,medcalc,inspect,lighteval]"} == set(optional["all"])


def test_a_missing_package_of_no_extra_is_not_dressed_up():
    err = ModuleNotFoundError("No module named 'nothing_like_this'", name="nothing_like_this")
    assert extras.missing_extra(err) is None
    broken = ModuleNotFoundError("No module named 'torch.nothing'", name="torch.nothing")  # installed, a part missing
    assert extras.missing_extra(broken) is None
    absent = ModuleNotFoundError("No module named 'submitit'", name="submitit")
    if not extras.installed("submitit"):
        assert "pip install 'adaptguard[distributed]'" in str(extras.missing_extra(absent, "x"))
    assert adaptguard.__version__
