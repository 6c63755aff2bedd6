"""action.yml's steps run here as a GitHub runner runs a composite action: every `${{ }}` substituted (inputs with
their defaults, github, runner, steps' outputs; `||`, `&&`, `==`, `!=`, `always()`), each `run:` in bash with its
env, a `$GITHUB_OUTPUT` file per step read back into `steps.<id>.outputs`, `$GITHUB_STEP_SUMMARY`, a pull-request
event, and the action's outputs evaluated at the end. `uses:` steps cannot run here: `actions/cache` is a miss and
`actions/upload-artifact` is recorded with the path it would upload.

Used by tests/compat/test_action.py (install: false, this Python) and by `.ci/run` (install: true: the action builds
its own venv from PyPI, and `--check-core` lists what it installed):

    python tests/action_steps.py --input old=example:fp32 --input new=example:int8 --input fail-on='nfr>10%'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}")
TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>&&|\|\||==|!=|\(|\))|(?P<call>always\(\)|success\(\)|"
                   r"failure\(\))|(?P<name>[A-Za-z_][\w.-]*))")


@dataclass
class Run:
    """What the steps did: the composite's exit status, its outputs, each step's outputs and outcome, the job
    summary, the uploads it would make, and the lines it printed."""

    status: int = 0
    outputs: dict[str, str] = field(default_factory=dict)
    steps: dict[str, dict] = field(default_factory=dict)
    summary: str = ""
    uploads: list[dict] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    substituted: list[str] = field(default_factory=list)  # every string after substitution

    def annotations(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(("::error", "::warning", "::notice"))]


class Context:
    def __init__(self, values: dict, failed: bool = False):
        self.values, self.failed = values, failed

    def lookup(self, path: str) -> str:
        node = self.values
        for part in path.split("."):
            node = node.get(part, "") if isinstance(node, dict) else ""
        return "" if isinstance(node, dict) else str(node)

    def evaluate(self, text: str):
        text, items, pos = text.strip(), [], 0
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"expression not understood at {text[pos:]!r}: {text!r}")
            items.append(next((k, v) for k, v in m.groupdict().items() if v is not None))
            pos = m.end()
        value, rest = self._or(items)
        if rest:
            raise ValueError(f"expression not understood: {text!r}")
        return value

    def _or(self, items):
        value, items = self._and(items)
        while items and items[0] == ("op", "||"):
            right, items = self._and(items[1:])
            value = value if value not in ("", False) else right
        return value, items

    def _and(self, items):
        value, items = self._compare(items)
        while items and items[0] == ("op", "&&"):
            right, items = self._compare(items[1:])
            value = right if value not in ("", False) else value
        return value, items

    def _compare(self, items):
        left, items = self._atom(items)
        if items and items[0] in (("op", "=="), ("op", "!=")):
            op = items[0][1]
            right, items = self._atom(items[1:])
            same = str(left).lower() == str(right).lower()  # GitHub compares strings ignoring case
            return (same if op == "==" else not same), items
        return left, items

    def _atom(self, items):
        kind, text = items[0]
        if kind == "str":
            return text[1:-1].replace("''", "'"), items[1:]
        if kind == "call":
            return {"always()": True, "success()": not self.failed, "failure()": self.failed}[text], items[1:]
        if kind == "name":
            return self.lookup(text), items[1:]
        if text == "(":
            value, items = self._or(items[1:])
            return value, items[1:]
        raise ValueError(f"unexpected {text!r}")

    def substitute(self, text: str) -> str:
        def one(m):
            value = self.evaluate(m.group(1))
            return str(value).lower() if isinstance(value, bool) else str(value)

        return EXPRESSION.sub(one, text)


def _read_outputs(path: Path) -> dict[str, str]:
    """`name=value` lines and `name<<DELIM` … `DELIM` blocks, as the runner reads $GITHUB_OUTPUT."""
    out, lines = {}, path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[name], i = "\n".join(lines[i + 1 : j]), j + 1
            continue
        name, value = line.split("=", 1)
        out[name], i = value, i + 1
    return out


def run_action(inputs: dict[str, str], workspace: Path, runner_temp: Path, event: dict | None = None,
               action_path: Path = ROOT, env: dict | None = None) -> Run:
    """action.yml's steps with `inputs` (the rest their defaults), in `workspace`."""
    spec = yaml.safe_load((action_path / "action.yml").read_text())
    event = {"pull_request": {"number": 5}} if event is None else event
    event_path = runner_temp / "event.json"
    event_path.write_text(json.dumps(event))
    summary = runner_temp / "step_summary.md"
    summary.write_text("")
    github = {"action_path": str(action_path), "token": "a-token", "action_ref": "", "sha": "0" * 40,
              "repository": "OWNER/model", "event_name": "pull_request" if "pull_request" in event else "push",
              "workspace": str(workspace), "server_url": "https://github.com", "run_id": "7"}
    runner = {"temp": str(runner_temp), "os": "Linux", "arch": "X64"}
    context = Context({"github": github, "runner": runner, "steps": {}, "inputs": {}})
    unknown = set(inputs) - set(spec["inputs"])
    if unknown:
        raise ValueError(f"not inputs of action.yml: {', '.join(sorted(unknown))}")
    context.values["inputs"] = {name: inputs[name] if name in inputs else context.substitute(str(i.get("default", "")))
                                for name, i in spec["inputs"].items()}
    missing = [n for n, i in spec["inputs"].items() if i.get("required") and not context.values["inputs"][n]]
    if missing:
        raise ValueError(f"required inputs missing: {', '.join(missing)}")
    base_env = {**(os.environ if env is None else env),
                "GITHUB_ACTIONS": "true", "GITHUB_ACTION_PATH": str(action_path), "GITHUB_WORKSPACE": str(workspace),
                "GITHUB_EVENT_PATH": str(event_path), "GITHUB_EVENT_NAME": github["event_name"],
                "GITHUB_REPOSITORY": github["repository"], "GITHUB_RUN_ID": github["run_id"],
                "GITHUB_SERVER_URL": github["server_url"], "GITHUB_STEP_SUMMARY": str(summary),
                "RUNNER_TEMP": str(runner_temp), "RUNNER_OS": runner["os"], "RUNNER_ARCH": runner["arch"]}
    run = Run()
    for index, step in enumerate(spec["runs"]["steps"]):
        sid = step.get("id", f"__{index}")
        condition = step.get("if", "success()")
        condition = condition if re.search(r"always\(\)|success\(\)|failure\(\)", condition) else f"success() && ({condition})"
        if not context.evaluate(EXPRESSION.sub(lambda m: m.group(1), condition)):
            run.steps[sid] = {"outcome": "skipped", "outputs": {}}
            context.values["steps"][sid] = {"outputs": {}, "outcome": "skipped"}
            continue
        with_ = {k: context.substitute(str(v)) for k, v in (step.get("with") or {}).items()}
        step_env = {k: context.substitute(str(v)) for k, v in (step.get("env") or {}).items()}
        run.substituted += [*with_.values(), *step_env.values()]
        outputs: dict[str, str] = {}
        if "uses" in step:
            name = step["uses"].split("@")[0]
            if name == "actions/cache":
                outputs = {"cache-hit": ""}  # a miss: the first run of a ref
            elif name == "actions/upload-artifact":
                run.uploads.append(with_)
            else:
                raise ValueError(f"a step uses {step['uses']}, which this runner does not know")
            outcome = "success"
        else:
            output_file = runner_temp / f"output_{index}"
            output_file.write_text("")
            script = context.substitute(step["run"])
            run.substituted.append(script)
            assert step.get("shell") == "bash", f"step {sid}: shell {step.get('shell')!r}"
            proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=workspace,
                                  env={**base_env, **step_env, "GITHUB_OUTPUT": str(output_file)},
                                  capture_output=True, text=True)
            run.stdout += proc.stdout
            run.stderr += proc.stderr
            outputs = _read_outputs(output_file)
            outcome = "success" if proc.returncode == 0 else "failure"
            if proc.returncode:
                run.status = run.status or proc.returncode
                context.failed = True
        run.steps[sid] = {"outcome": outcome, "outputs": outputs}
        context.values["steps"][sid] = {"outputs": outputs, "outcome": outcome}
    run.outputs = {name: context.substitute(str(o["value"])) for name, o in spec.get("outputs", {}).items()}
    run.summary = summary.read_text()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--workspace", help="default: a new temporary folder")
    parser.add_argument("--expect-status", type=int, help="fail unless the composite exits with this status")
    parser.add_argument("--check-core", action="store_true",
                        help="fail unless the venv the action built holds adaptguard's core alone")
    ns = parser.parse_args(argv)
    inputs = dict(item.split("=", 1) for item in ns.input)
    temp = Path(tempfile.mkdtemp(prefix="adaptguard-action-runner-"))
    workspace = Path(ns.workspace) if ns.workspace else temp / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    run = run_action(inputs, workspace, temp)
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    print(f"status {run.status}; outputs {json.dumps(run.outputs)}")
    print(f"annotations: {run.annotations()}")
    failures = []
    if ns.expect_status is not None and run.status != ns.expect_status:
        failures.append(f"exit status {run.status}, expected {ns.expect_status}")
    if any("${{" in s for s in run.substituted):
        failures.append("an expression was left unsubstituted")
    if ns.check_core:
        venv_python = run.steps["install"]["outputs"]["python"]
        listed = json.loads(subprocess.run([venv_python, "-m", "pip", "list", "--format=json"], check=True,
                                           capture_output=True, text=True).stdout)
        names = sorted(p["name"].lower() for p in listed)
        extra = set(names) - {"adaptguard", "numpy", "scipy", "msgspec", "pluggy", "pip", "setuptools"}
        print(f"the action's venv: {', '.join(names)}")
        if extra:
            failures.append(f"the action installed more than the core: {', '.join(sorted(extra))}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
