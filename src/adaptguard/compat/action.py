"""The GitHub Action's logic (`action.yml` at the repository root runs `python -m adaptguard.compat.action`): the
gate run as `adaptguard compare OLD NEW --fail-on ...`, its Markdown appended to the job summary, one pull-request
comment posted or updated when asked, and the step's outputs.

Inputs come as GitHub passes an action's inputs, environment variables `INPUT_<NAME>` (`INPUT_FAIL-ON`, or
`INPUT_FAIL_ON` as action.yml sets them), so the tests run this module with the inputs a workflow gives:

- `old`, `new`: a run each, anything `compare` reads; several runs, one a line (or `RUN1,RUN2`), are replicate runs;
- `fail-on`: the rules, one a line (`nfr>2%`, `overall:acc_drop>1%`); `significance` (default 0.05, or `off`);
- `undecided-fails`: `true` fails the step on an undecided gate (compare's exit 3); `false` (default) passes it
  with a warning, as "not known" is not a regression;
- `markdown`, `html`: where `compare` writes its Markdown and its page (absent: `adaptguard-gate.md` and
  `adaptguard-gate.html`, action.yml's defaults, so a run by hand does what the action does; `html` empty: no page);
- `comment`: `true` posts the Markdown on the pull request, or updates the comment this action posted before (found
  by its hidden marker; `comment-key` keeps one comment per key, e.g. per matrix job), with `github-token`;
  `pr-number` when the event is not a pull request's;
- `args`: more `compare` options (`--tasks 'mmlu_*' --common-tasks`), split as a shell would.

Outputs (`$GITHUB_OUTPUT`): `decision` (clear, breach, undecided, bad-input, error), `exit-status` (compare's: 0, 1,
3 or 2), `breaches`, `undecided`, `clear`, `left-out` (counts of (task, threshold) pairs), `headline`, `markdown`,
`html` (the paths written), `comment` (the comment's address). The step's own exit status: 1 on a breach, 3 on an
undecided gate that fails, 2 on bad input (one line: compare's own, or the input's name), else 0. Each decision is
also an annotation with the headline, so it shows in the pull request's checks: `::error::` on a breach, bad input,
a crash or an undecided gate that fails; `::warning::` on one that does not; `::notice::` on a clear gate. A comment
GitHub refuses (a fork's read-only token) is a warning: the decision stands.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .verdicts import EXIT_BAD_INPUT, OUTCOMES, Decision, Gate

# the inputs this module reads (action.yml passes each to it; tests/compat/test_action.py holds the two lists equal)
INPUTS = ("old", "new", "fail-on", "significance", "undecided-fails", "markdown", "html", "comment", "comment-key",
          "pr-number", "github-token", "args")
OUTPUTS = ("decision", "exit-status", "breaches", "undecided", "clear", "left-out", "headline", "markdown", "html",
           "comment")
# the inputs' defaults where a variable is absent, as action.yml declares them (tests/compat/test_action.py holds the
# two equal), so `python -m adaptguard.compat.action` run by hand does what the action does
DEFAULTS = {"significance": "0.05", "undecided-fails": "false", "markdown": "adaptguard-gate.md",
            "html": "adaptguard-gate.html", "comment": "false", "comment-key": "", "pr-number": "", "args": ""}
MARKER = "<!-- adaptguard-compat-gate{key} -->"
COMMENT_LIMIT = 65536  # GitHub's limit on a comment's body, in characters
# compare's options that are the action's own inputs: given in `args` they would write where the action does not read
OWN_FLAGS = ("--fail-on", "--significance", "--markdown", "--json", "--html")
Http = Callable[[str, str, "dict | None"], Any]  # (method, path under the API, JSON payload) -> the parsed answer


class InputError(ValueError):
    """An input the action cannot use; the message names it (exit status 2)."""


def read_input(env: Mapping[str, str], name: str, default: str = "") -> str:
    """An input as GitHub passes it (`INPUT_FAIL-ON`), or as a composite action's env can name it (`INPUT_FAIL_ON`);
    absent, action.yml's default (`DEFAULTS`); given empty, `default`."""
    assert name in INPUTS, name  # an input read here but not passed by action.yml would always be empty there
    key = "INPUT_" + name.upper().replace(" ", "_")
    value = env.get(key, env.get(key.replace("-", "_")))
    if value is None:
        value = DEFAULTS.get(name, "")
    return value.strip() or default


def flag(env: Mapping[str, str], name: str, default: str = "false") -> bool:
    value = read_input(env, name, default).lower()
    if value not in ("true", "false"):
        raise InputError(f"{name}: expected true or false, got {value!r}")
    return value == "true"


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def gate_command(env: Mapping[str, str], markdown: str, json_path: str, html: str) -> list[str]:
    """`adaptguard compare` with the inputs, in this Python (the one the action installed adaptguard into)."""
    old, new = (",".join(lines(read_input(env, side))) for side in ("old", "new"))
    for side, runs in (("old", old), ("new", new)):
        if not runs:
            raise InputError(f"{side}: give the {side} model's run (a folder, log or JSONL compare reads, or "
                             f"example:{'fp32' if side == 'old' else 'int8'}); replicate runs one a line")
    rules = lines(read_input(env, "fail-on"))
    if not rules:
        raise InputError("fail-on: give the gate's rules, one a line, e.g. nfr>2%")
    try:
        args = shlex.split(read_input(env, "args"))
    except ValueError as err:
        raise InputError(f"args: {err}") from None
    own = next((a for a in args if a.split("=")[0] in OWN_FLAGS), None)
    if own:
        raise InputError(f"args: {own.split('=')[0]} is set by the action's inputs (fail-on, significance, markdown, "
                         "html); give it there")
    cmd = [sys.executable, "-m", "adaptguard.cli", "compare", old, new, *(f"--fail-on={r}" for r in rules),
           "--significance", read_input(env, "significance", "0.05"), "--markdown", markdown, "--json", json_path]
    return cmd + (["--html", html] if html else []) + args


def run_gate(env: Mapping[str, str], workdir: Path) -> dict:
    """Run compare; returns {decision, exit_status, gate (its dict, or None), refusal (compare's one line on exit 2),
    markdown, html}. Its table and decisions go to this step's log."""
    given = read_input(env, "markdown")
    markdown = given or str(workdir / "gate.md")  # the summary and the comment need it; kept only where asked
    html = read_input(env, "html")
    json_path = workdir / "gate.json"
    cmd = gate_command(env, markdown, str(json_path), html)
    secret = ("INPUT_GITHUB-TOKEN", "INPUT_GITHUB_TOKEN")  # compare has no use for the token
    proc = subprocess.run(cmd, capture_output=True, text=True, env={k: v for k, v in env.items() if k not in secret})
    sys.stdout.write(proc.stdout)
    out = {"exit_status": proc.returncode, "gate": None, "refusal": None, "markdown": None, "html": None}
    if proc.returncode == EXIT_BAD_INPUT:  # bad input: compare's own one line, its last
        refusal = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), "adaptguard compare: exit 2")
        return {**out, "decision": "bad-input", "refusal": refusal}
    sys.stderr.write(proc.stderr)
    gate = json.loads(json_path.read_text()).get("gate") if json_path.exists() else None
    expected = None if gate is None else OUTCOMES[Gate.of(gate).status].exit_code
    if expected != proc.returncode:  # a crash (a traceback above), not a decision
        return {**out, "decision": "error"}
    return {**out, "decision": gate["status"], "gate": gate, "markdown": markdown, "kept": given or None,
            "html": html or None}


def counts(gate: dict | None) -> dict[str, int]:
    decisions = (gate or {}).get("decisions", [])
    out = {key: len([d for d in decisions if d["decision"] == kind])
           for key, kind in (("breaches", Decision.BREACH), ("undecided", Decision.UNDECIDED), ("clear", Decision.CLEAR))}
    return {**out, "left-out": len((gate or {}).get("left_out", []))}


def report_text(result: dict, undecided_fails: bool) -> str:
    """What the summary and the comment say: compare's Markdown, or the refusal; and what an undecided gate does."""
    if result["decision"] == "bad-input":
        return f"### Compatibility gate: bad input (nothing decided)\n\n{result['refusal']}\n"
    if result["decision"] == "error":
        return f"### Compatibility gate: error (exit {result['exit_status']}, nothing decided): see the step's log\n"
    text = Path(result["markdown"]).read_text()
    if result["decision"] == Decision.UNDECIDED:
        text += ("\nAn undecided gate fails this check (`undecided-fails: true`): add items or runs, or choose "
                 "thresholds the data can resolve (each undecided line says how far they reach).\n" if undecided_fails
                 else "\nAn undecided gate does not fail this check (`undecided-fails: false`): not known is not a "
                 "regression; each undecided line says how far the data reach.\n")
    return text


def comment_body(text: str, marker: str, env: Mapping[str, str]) -> str:
    """The comment: the marker (how the next run finds it), the report, a link to the run; cut to GitHub's limit."""
    run = ""
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        url = f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        run = f"\n[The run]({url}): its job summary, and the page as an artifact when one was uploaded.\n"
    body = f"{marker}\n{text}{run}"
    if len(body) <= COMMENT_LIMIT:
        return body
    cut = "\n… cut here: the comment is limited to 65,536 characters; the whole report is in the job summary.\n" + run
    keep = body[: COMMENT_LIMIT - len(cut)]
    return keep[: keep.rfind("\n") + 1] + cut  # at a line's end: no half row of the table


def post_or_update(http: Http, repo: str, pr: int, body: str, marker: str) -> dict:
    """Update the latest comment on the pull request that starts with `marker`, or post one; returns it."""
    found, page = None, 1
    while True:  # oldest first, 100 a page
        batch = http("GET", f"/repos/{repo}/issues/{pr}/comments?per_page=100&page={page}", None)
        found = next((c for c in reversed(batch) if (c.get("body") or "").startswith(marker)), found)
        if len(batch) < 100:
            break
        page += 1
    if found is not None:
        return http("PATCH", f"/repos/{repo}/issues/comments/{found['id']}", {"body": body})
    return http("POST", f"/repos/{repo}/issues/{pr}/comments", {"body": body})


def github_http(token: str, api: str = "https://api.github.com") -> Http:
    def call(method: str, path: str, payload: dict | None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(api.rstrip("/") + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    return call


def pr_number(env: Mapping[str, str]) -> int | None:
    given = read_input(env, "pr-number")
    if given:
        if not given.isdigit():
            raise InputError(f"pr-number: expected a pull request's number, got {given!r}")
        return int(given)
    try:
        event = json.loads(Path(env["GITHUB_EVENT_PATH"]).read_text())
    except (KeyError, OSError, ValueError):
        return None
    return (event.get("pull_request") or {}).get("number")


def comment(env: Mapping[str, str], text: str, http: Http | None) -> str | None:
    """Post or update the gate's comment; returns its address, or None after saying (a warning) why not."""
    key = read_input(env, "comment-key")
    marker = MARKER.format(key=f":{key}" if key else "")
    pr, repo = pr_number(env), env.get("GITHUB_REPOSITORY")
    if pr is None or not repo:
        print("::warning::comment: no pull request to comment on (the event is not a pull request's; give pr-number)")
        return None
    if http is None:
        token = read_input(env, "github-token")
        if not token:
            print("::warning::comment: no github-token given; nothing posted")
            return None
        http = github_http(token, env.get("GITHUB_API_URL", "https://api.github.com"))
    try:
        return post_or_update(http, repo, pr, comment_body(text, marker, env), marker).get("html_url", "")
    except OSError as err:  # urllib's HTTPError and URLError; a fork's read-only token answers 403
        why = f"{err.code} {err.reason}" if hasattr(err, "code") else str(getattr(err, "reason", err))
        print(f"::warning::comment: GitHub refused it ({why}); a pull request from a fork gets a read-only token, "
              "so the report is in the job summary only. The gate's decision stands.")
        return None


def annotate(level: str, message: str) -> None:
    """A workflow command GitHub shows as an annotation on the run and in the pull request's checks (`error`,
    `warning`, `notice`), the message on one line as the protocol escapes it."""
    escaped = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    print(f"::{level}::{escaped}", flush=True)


def append(path: str | None, text: str) -> None:
    """Append to a file GitHub reads after the step ($GITHUB_STEP_SUMMARY, $GITHUB_OUTPUT): its protocol is to
    append, as other steps and actions write to the same file."""
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def main(env: Mapping[str, str] | None = None, http: Http | None = None) -> int:
    """The action's step; returns its exit status. `http` stands in for GitHub's API (the tests')."""
    env = os.environ if env is None else env
    workdir = Path(tempfile.mkdtemp(prefix="adaptguard-action-", dir=env.get("RUNNER_TEMP") or None))
    wants_comment = undecided_fails = False
    try:
        wants_comment = flag(env, "comment")  # first: a refusal of any other input still updates the comment
        undecided_fails = flag(env, "undecided-fails")
        result = run_gate(env, workdir)
    except InputError as err:
        result = {"decision": "bad-input", "exit_status": 2, "gate": None, "refusal": f"adaptguard action: {err}",
                  "markdown": None, "html": None}
    try:
        if result["decision"] == "bad-input":
            print(result["refusal"], file=sys.stderr)
        text = report_text(result, undecided_fails)
        append(env.get("GITHUB_STEP_SUMMARY"), text)
        url = comment(env, text, http) if wants_comment else None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    gate = result["gate"]
    outputs = {"decision": result["decision"], "exit-status": result["exit_status"], **counts(gate),
               "headline": _headline(gate) if gate else result["refusal"] or "", "markdown": result.get("kept") or "",
               "html": result["html"] or "", "comment": url or ""}
    append(env.get("GITHUB_OUTPUT"), "".join(f"{k}={' '.join(str(outputs[k]).splitlines())}\n" for k in OUTPUTS))
    decision = result["decision"]
    if decision == Decision.UNDECIDED and not undecided_fails:
        annotate("warning", "the gate is undecided (no breach; the data cannot show every threshold either way); "
                 f"it does not fail this check (undecided-fails: false): {outputs['headline']}")
        return 0
    if decision == "error":
        annotate("error", f"adaptguard compare exited {result['exit_status']} without a decision (its traceback is "
                 "in the step's log); nothing decided")
        return result["exit_status"] or 1
    annotate("notice" if decision == Decision.CLEAR else "error", outputs["headline"])  # breach, undecided, bad input
    return EXIT_BAD_INPUT if decision == "bad-input" else result["exit_status"]


def _headline(gate: dict) -> str:
    from .render.decisions import headline

    return headline(gate)


if __name__ == "__main__":
    sys.exit(main())
