"""The GitHub Action (issue 89.1), its script run here with the inputs a workflow passes (INPUT_* variables, the job
summary and the step outputs in temporary files, GitHub's API replaced by a fake): on the shipped pair
(`example:fp32` → `example:int8`) `nfr>10%` fails the step, `nfr>30%` is undecided and `nfr>50%` clear; bad input is
one line; one pull-request comment is posted, then updated; action.yml passes every input the script reads."""

import json
import os
import re
import urllib.error
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from conftest import ROOT
from shipped_lines import BREACH as SHIPPED_BREACH
from shipped_lines import UNDECIDED as SHIPPED_UNDECIDED
from shipped_lines import decides_at

from adaptguard.compat import action

BREACH = f"- breach: {SHIPPED_BREACH}"  # the gate's lines, from the runs' counts (shipped_lines)
UNDECIDED = re.compile("- undecided: " + SHIPPED_UNDECIDED.pattern)


def run_action(tmp_path, inputs: dict, http=None, event: dict | None = None):
    """The step as GitHub runs it: inputs as INPUT_<NAME> (`INPUT_FAIL-ON`), in the workspace; returns its exit
    status, its outputs and what it appended to the job summary."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INPUT_", "GITHUB_"))}
    env.update({f"INPUT_{name.upper()}": value for name, value in inputs.items()})
    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs.txt"
    summary.write_text(""), outputs.write_text("")  # this step's alone
    env.update(GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(outputs), RUNNER_TEMP=str(tmp_path),
               GITHUB_REPOSITORY="my-org/model", GITHUB_RUN_ID="7", GITHUB_SERVER_URL="https://github.com")
    if event is not None:
        (tmp_path / "event.json").write_text(json.dumps(event))
        env["GITHUB_EVENT_PATH"] = str(tmp_path / "event.json")
    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    cwd = os.getcwd()
    os.chdir(workspace)
    try:
        status = action.main(env, http)
    finally:
        os.chdir(cwd)
    written = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    return status, written, summary.read_text()


class FakeGitHub:
    """GitHub's issue-comment endpoints over a list of comments, 100 a page, oldest first."""

    def __init__(self, comments=()):
        self.comments, self.calls = [dict(c) for c in comments], []

    def __call__(self, method, path, payload):
        self.calls.append((method, path.split("?")[0]))
        url = "https://github.com/my-org/model/pull/5#issuecomment-{}"
        if method == "GET":
            page = int(parse_qs(urlparse(path).query)["page"][0])
            return [dict(c) for c in self.comments[100 * (page - 1):100 * page]]
        if method == "PATCH":
            found = next(c for c in self.comments if c["id"] == int(path.rsplit("/", 1)[1]))
            found["body"] = payload["body"]
            return {**found, "html_url": url.format(found["id"])}
        self.comments.append({"id": 1000 + len(self.comments), "body": payload["body"]})
        return {**self.comments[-1], "html_url": url.format(self.comments[-1]["id"])}


SHIPPED = {"old": "example:fp32", "new": "example:int8"}


@pytest.mark.parametrize("rule, undecided_fails, status, decision, exit_status, counts", [
    ("nfr>10%", "false", 1, "breach", "1", ("2", "0", "0")),
    ("nfr>30%", "false", 0, "undecided", "3", ("0", "1", "1")),
    ("nfr>30%", "true", 3, "undecided", "3", ("0", "1", "1")),
    ("nfr>50%", "false", 0, "clear", "0", ("0", "0", "2")),
])
def test_the_shipped_pair_through_the_action(tmp_path, capsys, rule, undecided_fails, status, decision, exit_status,
                                             counts):
    inputs = {**SHIPPED, "fail-on": f"\n{rule}\n", "undecided-fails": undecided_fails, "markdown": "gate.md",
              "html": "gate.html"}
    got, outputs, summary = run_action(tmp_path, inputs)
    assert got == status
    headline = {"breach": "gate: FAILED, a breach the data support (2 breach, 0 undecided, 0 clear)",
                "undecided": "gate: UNDECIDED, no breach but not every threshold could be decided (0 breach, 1 undecided, "
                             "1 clear)",
                "clear": "gate: passed, every threshold clear (0 breach, 0 undecided, 2 clear)"}[decision]
    assert outputs == {"decision": decision, "exit-status": exit_status, "breaches": counts[0], "undecided": counts[1],
                       "clear": counts[2], "left-out": "0", "headline": headline, "markdown": "gate.md",
                       "html": "gate.html", "comment": ""}
    page = tmp_path / "workspace" / "gate.html"
    assert page.stat().st_size > 10_000 and summary.startswith((tmp_path / "workspace" / "gate.md").read_text())
    assert f"**G{headline[1:]}; breach: its one-sided test at p < 0.05; clear: the opposite test at p < 0.05" in summary
    printed = capsys.readouterr()
    if decision == "breach":
        assert BREACH in summary and BREACH[2:] in printed.err  # compare's own lines, in the summary and the log
    if decision == "undecided":
        assert decides_at(UNDECIDED.search(summary))
        note = "An undecided gate fails this check" if undecided_fails == "true" else "An undecided gate does not fail"
        assert summary.split("\n\n")[-1].startswith(note)
        assert ("::warning::the gate is undecided" in printed.out) is (undecided_fails == "false")
    # the headline as an annotation, the last line of the step's output: it shows in the pull request's checks
    level = {"breach": "error", "clear": "notice"}.get(decision, "error" if undecided_fails == "true" else "warning")
    last = printed.out.splitlines()[-1]
    assert last.startswith(f"::{level}::") and last.endswith(headline) and "\n" not in last


@pytest.mark.parametrize("inputs, refusal", [
    ({"fail-on": "nfr>10"}, "adaptguard compare: error: argument --fail-on: 'nfr>10': nfr is a rate (the table "
                            "prints it in %): write 10% or 0.1 (--help for usage)"),
    ({"fail-on": "nfr>10%", "new": "{tmp}/no_such_run"}, "adaptguard compare: error: {tmp}/no_such_run: no such file or "
                                                         "directory"),
    ({"fail-on": " \n"}, "adaptguard action: fail-on: give the gate's rules, one a line, e.g. nfr>2%"),
    ({"fail-on": "nfr>10%", "undecided-fails": "yes"}, "adaptguard action: undecided-fails: expected true or false, got 'yes'"),
    ({"fail-on": "nfr>10%", "args": "--json=x.json"}, "adaptguard action: args: --json is set by the action's inputs "
                                                      "(fail-on, significance, markdown, html); give it there"),
])
def test_bad_input_is_one_line(tmp_path, capsys, inputs, refusal):
    inputs = {**SHIPPED, **{k: v.replace("{tmp}", str(tmp_path)) for k, v in inputs.items()}}
    refusal = refusal.replace("{tmp}", str(tmp_path))
    status, outputs, summary = run_action(tmp_path, inputs)
    printed = capsys.readouterr()
    annotation = "::error::" + refusal.replace("%", "%25")  # the protocol's escape: a bare % could start one
    assert status == 2 and printed.err == refusal + "\n" and printed.out == annotation + "\n"
    assert outputs["decision"] == "bad-input" and outputs["exit-status"] == "2" and outputs["headline"] == refusal
    assert summary == f"### Compatibility gate: bad input (nothing decided)\n\n{refusal}\n"


def test_one_comment_posted_then_updated(tmp_path, capsys):
    """The first push posts the comment (after 120 others: the search reads every page); the next updates it, found
    by its marker, whatever the decision; a keyed gate keeps its own comment."""
    github = FakeGitHub({"id": i, "body": f"review {i}"} for i in range(120))
    event = {"pull_request": {"number": 5}}
    first = {**SHIPPED, "fail-on": "nfr>10%", "comment": "true", "github-token": "t"}
    status, outputs, _ = run_action(tmp_path, first, github, event)
    assert status == 1 and outputs["comment"] == "https://github.com/my-org/model/pull/5#issuecomment-1120"
    assert github.calls[-1] == ("POST", "/repos/my-org/model/issues/5/comments")
    body = github.comments[-1]["body"]
    assert body.startswith("<!-- adaptguard-compat-gate -->\n# Compatibility: `example:fp32` → `example:int8`")
    assert BREACH in body and body.endswith("[The run](https://github.com/my-org/model/actions/runs/7): its job "
                                            "summary, and the page as an artifact when one was uploaded.\n")
    status, outputs, _ = run_action(tmp_path, {**first, "fail-on": "nfr>50%"}, github, event)
    assert status == 0 and outputs["comment"] == "https://github.com/my-org/model/pull/5#issuecomment-1120"
    assert github.calls[-3:] == [("GET", "/repos/my-org/model/issues/5/comments")] * 2 + [
        ("PATCH", "/repos/my-org/model/issues/comments/1120")]
    assert len(github.comments) == 121 and "**Gate: passed, every threshold clear" in github.comments[-1]["body"]
    # bad input updates it too (the comment must not keep the last push's decision); a keyed gate posts its own
    status, _, _ = run_action(tmp_path, {**first, "fail-on": "nfr>10"}, github, event)
    assert status == 2 and "bad input (nothing decided)" in github.comments[-1]["body"] and len(github.comments) == 121
    run_action(tmp_path, {**first, "fail-on": "", "comment-key": "int4", "pr-number": "5"}, github)
    assert len(github.comments) == 122 and github.comments[-1]["body"].startswith("<!-- adaptguard-compat-gate:int4 -->")
    capsys.readouterr()


def test_the_latest_marked_comment_is_updated_and_others_left_alone():
    github = FakeGitHub([{"id": 1, "body": "<!-- adaptguard-compat-gate -->\nold"}, {"id": 2, "body": "lgtm"},
                         {"id": 3, "body": "<!-- adaptguard-compat-gate:int4 -->\nx"},
                         {"id": 4, "body": "<!-- adaptguard-compat-gate -->\nnewer"}])
    marker = action.MARKER.format(key="")
    assert action.post_or_update(github, "o/r", 5, f"{marker}\nnew", marker)["id"] == 4
    assert [c["body"] for c in github.comments] == ["<!-- adaptguard-compat-gate -->\nold", "lgtm",
                                                    "<!-- adaptguard-compat-gate:int4 -->\nx",
                                                    "<!-- adaptguard-compat-gate -->\nnew"]


def test_a_refused_comment_is_a_warning_and_the_decision_stands(tmp_path, capsys):
    def refuse(method, path, payload):
        raise urllib.error.HTTPError("https://api.github.com" + path, 403, "Forbidden", {}, None)

    # fail-on left empty: the refusal needs no compare run, and bad input still updates (here: tries to) the comment
    status, outputs, summary = run_action(tmp_path, {**SHIPPED, "comment": "true", "github-token": "t"}, refuse,
                                          {"pull_request": {"number": 5}})
    printed = capsys.readouterr()
    assert status == 2 and outputs["comment"] == "" and summary.startswith("### Compatibility gate: bad input")
    refused = "::error::adaptguard action: fail-on: give the gate's rules, one a line, e.g. nfr>2%25\n"
    assert printed.out == ("::warning::comment: GitHub refused it (403 Forbidden); a pull request from a fork gets a "
                           "read-only token, so the report is in the job summary only. The gate's decision stands.\n"
                           + refused)
    run_action(tmp_path, {**SHIPPED, "comment": "true", "github-token": "t"}, refuse, {"push": {}})
    assert capsys.readouterr().out == ("::warning::comment: no pull request to comment on (the event is not a pull "
                                       "request's; give pr-number)\n" + refused)


def test_a_long_report_is_cut_at_a_line_to_githubs_limit():
    text = "".join(f"| task {i} | {'x' * 90} |\n" for i in range(1000))
    body = action.comment_body(text, "<!-- m -->", {})
    kept = body.split("\n\n… cut here")[0]
    assert len(body) <= action.COMMENT_LIMIT < len(text) and kept.endswith("|") and kept.count("\n") > 500
    assert body.endswith("the whole report is in the job summary.\n")


def test_inputs_are_read_as_github_passes_them():
    assert action.read_input({"INPUT_FAIL-ON": " nfr>2% "}, "fail-on") == "nfr>2%"  # a JavaScript action's form
    assert action.read_input({"INPUT_FAIL_ON": "nfr>2%"}, "fail-on") == "nfr>2%"  # as action.yml sets them
    assert action.read_input({}, "significance", "0.05") == "0.05"


def test_action_yml_passes_every_input_and_output_the_script_has():
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    steps = {s.get("id", s.get("name")): s for s in spec["runs"]["steps"]}
    env = steps["gate"]["env"]
    passed = {k.removeprefix("INPUT_").lower().replace("_", "-"): v for k, v in env.items() if k.startswith("INPUT_")}
    assert set(passed) == set(action.INPUTS) and set(passed) <= set(spec["inputs"])
    assert all(v == f"${{{{ inputs.{name} }}}}" for name, v in passed.items())
    assert set(spec["outputs"]) == set(action.OUTPUTS)
    assert all(o["value"] == f"${{{{ steps.gate.outputs.{name} }}}}" for name, o in spec["outputs"].items())
    assert steps["gate"]["run"] == '"$ADAPTGUARD_PYTHON" -m adaptguard.compat.action'
    # the action's own checkout, its core alone, at the versions its tests passed with; no torch
    assert '-m pip install -q -c "$ACTION_PATH/constraints.txt" "$ACTION_PATH${EXTRAS:+[$EXTRAS]}"' in steps["install"]["run"]
    assert "torch" not in steps["install"]["run"] and "index-url" not in steps["install"]["run"]
    upload = next(s for s in spec["runs"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"].startswith("always()")  # the page of a failing gate is the one to look at


@pytest.mark.parametrize("example", ["compat-gate.yml", "compat-gate-evaluate.yml"])
def test_the_example_workflows_use_the_action_with_its_inputs(example):
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    flow = yaml.safe_load((ROOT / "examples/ci" / example).read_text())
    (job,) = flow["jobs"].values()
    gate = next(s for s in job["steps"] if s.get("uses", "").split("@")[0].endswith("/adaptguard"))
    required = {name for name, i in spec["inputs"].items() if i.get("required")}
    assert required <= set(gate["with"]) <= set(spec["inputs"])
    assert gate["with"]["comment"] is True and flow["permissions"]["pull-requests"] == "write"
    if example == "compat-gate-evaluate.yml":
        assert any("adaptguard evaluate runs/old" in s.get("run", "") for s in job["steps"])


def test_the_scripts_defaults_are_action_ymls():
    """Run by hand (`python -m adaptguard.compat.action`), an input left out means what it means in action.yml."""
    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    declared = {name: str(i["default"]).lower() if isinstance(i["default"], bool) else str(i["default"])
                for name, i in spec["inputs"].items() if "default" in i and name in action.INPUTS}
    declared.pop("github-token")  # ${{ github.token }}: only GitHub has it
    assert action.DEFAULTS == declared
    assert action.read_input({}, "html") == "adaptguard-gate.html" and action.read_input({"INPUT_HTML": ""}, "html") == ""


def test_the_shipped_pair_by_hand_writes_the_actions_files(tmp_path, capsys):
    status, outputs, _ = run_action(tmp_path, {**SHIPPED, "fail-on": "nfr>10%"})
    assert status == 1 and outputs["markdown"] == "adaptguard-gate.md" and outputs["html"] == "adaptguard-gate.html"
    assert (tmp_path / "workspace" / "adaptguard-gate.html").stat().st_size > 10_000
    capsys.readouterr()


def test_a_crash_is_an_error_not_a_decision(tmp_path, capsys, monkeypatch):
    """compare dying with a traceback (exit 1 and no report) is the decision `error`: the step fails with an error
    annotation, and neither the summary nor the outputs claim a breach."""
    import sys

    crash = [sys.executable, "-c", "raise RuntimeError('boom')"]
    monkeypatch.setattr(action, "gate_command", lambda env, markdown, json_path, html: crash)
    status, outputs, summary = run_action(tmp_path, {**SHIPPED, "fail-on": "nfr>10%"})
    printed = capsys.readouterr()
    assert status == 1 and outputs["decision"] == "error" and outputs["exit-status"] == "1"
    assert outputs["breaches"] == "0" and outputs["headline"] == ""
    assert summary == "### Compatibility gate: error (exit 1, nothing decided): see the step's log\n"
    assert "RuntimeError: boom" in printed.err
    assert printed.out.splitlines()[-1] == ("::error::adaptguard compare exited 1 without a decision (its traceback "
                                            "is in the step's log); nothing decided")


@pytest.mark.parametrize("rule, status, decision, annotation", [
    ("nfr>10%", 1, "breach", "::error::gate: FAILED, a breach the data support (2 breach, 0 undecided, 0 clear)"),
    ("nfr>50%", 0, "clear", "::notice::gate: passed, every threshold clear (0 breach, 0 undecided, 2 clear)"),
    ("nfr>10", 2, "bad-input", "::error::adaptguard compare: error: argument --fail-on: 'nfr>10': nfr is a rate (the "
                               "table prints it in %25): write 10%25 or 0.1 (--help for usage)"),
])
def test_action_ymls_steps_as_github_runs_them(tmp_path, rule, status, decision, annotation):
    """action.yml itself, step by step (tests/action_steps.py: every ${{ }} substituted, $GITHUB_OUTPUT per step, the
    job summary, a pull-request event), with install: false on this Python: the decision reaches the action's
    outputs, the summary and one annotation; the page is uploaded whatever the decision. (`.ci/run` runs it with
    install: true: the action's own venv from PyPI holds the core alone.)"""
    import sys

    from action_steps import run_action as run_steps

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    run = run_steps({**SHIPPED, "fail-on": rule, "install": "false", "python": sys.executable}, workspace, tmp_path)
    assert run.status == status and run.outputs["decision"] == decision and run.outputs["exit-status"] == str(status)
    assert run.annotations() == [annotation]
    assert not any("${{" in s for s in run.substituted)
    assert run.steps["install"]["outcome"] == "skipped" and run.steps["gate"]["outcome"] == (
        "success" if status == 0 else "failure")
    if decision == "bad-input":
        assert run.summary.startswith("### Compatibility gate: bad input") and run.uploads == []
    else:
        assert run.summary.startswith("# Compatibility: `example:fp32` → `example:int8`")
        assert run.uploads == [{"name": "adaptguard-gate", "path": "adaptguard-gate.html", "if-no-files-found": "ignore"}]
        assert (workspace / "adaptguard-gate.html").stat().st_size > 10_000


def test_the_comment_goes_over_http_as_githubs_api_asks(capsys):
    """The real client (`github_http`) against a server on loopback standing in for GITHUB_API_URL: the token as a
    bearer, GitHub's media type and API version, the comment as a JSON body, the answer read back; a 403 is the
    warning a fork's read-only token gets, and the decision stands."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen, refuse = [], []

    class Api(BaseHTTPRequestHandler):
        def answer(self):
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size)) if size else None
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if refuse:
                self.send_error(403, "Forbidden")
                return
            reply = [] if self.command == "GET" else {"id": 9, "html_url": "https://github.com/o/r/pull/5#c9"}
            data = json.dumps(reply).encode()
            self.send_response(200 if self.command == "GET" else 201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = answer

        def log_message(self, *args):  # the test's output stays the action's
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"GITHUB_API_URL": f"http://127.0.0.1:{server.server_port}/", "GITHUB_REPOSITORY": "o/r",
               "INPUT_GITHUB-TOKEN": "s3cret", "INPUT_PR-NUMBER": "5"}
        assert action.comment(env, "the report", None) == "https://github.com/o/r/pull/5#c9"
        (get, post) = seen
        assert (get[0], get[1], get[3]) == ("GET", "/repos/o/r/issues/5/comments?per_page=100&page=1", None)
        assert "content-length" not in get[2]  # a GET sends no body
        assert (post[0], post[1]) == ("POST", "/repos/o/r/issues/5/comments")
        assert post[3] == {"body": action.comment_body("the report", action.MARKER.format(key=""), env)}
        for method, _, headers, _ in seen:
            assert (headers["authorization"], headers["accept"], headers["x-github-api-version"],
                    headers["content-type"]) == ("Bearer s3cret", "application/vnd.github+json", "2022-11-28",
                                                 "application/json"), method
        refuse.append(True)
        assert action.comment(env, "the report", None) is None
        assert capsys.readouterr().out == (
            "::warning::comment: GitHub refused it (403 Forbidden); a pull request from a fork gets a read-only "
            "token, so the report is in the job summary only. The gate's decision stands.\n")
    finally:
        server.shutdown()
        server.server_close()


def test_the_inputs_left_out_take_action_ymls_defaults_and_compare_never_sees_the_token(tmp_path, monkeypatch):
    """With only old, new and fail-on given, compare runs at significance 0.05 (action.yml's default) and no HTML;
    the token, given for the comment, is kept out of compare's environment."""
    import subprocess
    import sys

    env = {"INPUT_OLD": "example:fp32", "INPUT_NEW": "example:int8", "INPUT_FAIL-ON": "nfr>2%"}
    assert action.gate_command(env, "g.md", "g.json", "") == [
        sys.executable, "-m", "adaptguard.cli", "compare", "example:fp32", "example:int8", "--fail-on=nfr>2%",
        "--significance", "0.05", "--markdown", "g.md", "--json", "g.json"]
    seen = {}

    def fake_run(cmd, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(cmd, 2, "", "adaptguard compare: error: stop here\n")

    monkeypatch.setattr(action.subprocess, "run", fake_run)
    result = action.run_gate({**env, "INPUT_GITHUB-TOKEN": "s3cret", "INPUT_GITHUB_TOKEN": "s3cret", "HOME": "/h"},
                             tmp_path)
    assert result["decision"] == "bad-input" and result["refusal"] == "adaptguard compare: error: stop here"
    assert seen["HOME"] == "/h" and "s3cret" not in seen.values()


def test_a_refused_comment_flag_posts_nothing_and_githubs_default_address_is_used(tmp_path, capsys, monkeypatch):
    """`comment: maybe` is refused as bad input, and no comment is tried (the flag never read as true); with
    GITHUB_API_URL absent (GitHub Enterprise sets it) the client talks to https://api.github.com; a connection that
    fails without an HTTP status says why in the warning — a URLError's reason, or the error itself."""
    github = FakeGitHub()
    status, outputs, _ = run_action(tmp_path, {**SHIPPED, "comment": "maybe", "github-token": "t"}, github,
                                    {"pull_request": {"number": 5}})
    assert status == 2 and github.calls == [] and outputs["comment"] == ""
    assert "comment: expected true or false, got 'maybe'" in capsys.readouterr().err
    made = []

    def client(token, api):
        made.append((token, api))

        def fail(method, path, payload):
            raise failures.pop(0)
        return fail

    monkeypatch.setattr(action, "github_http", client)
    failures = [urllib.error.URLError("Connection refused"), OSError("Network is unreachable")]
    env = {"GITHUB_REPOSITORY": "o/r", "INPUT_GITHUB-TOKEN": "s3cret", "INPUT_PR-NUMBER": "5"}
    for why in ("Connection refused", "Network is unreachable"):
        assert action.comment(env, "the report", None) is None
        assert capsys.readouterr().out == (
            f"::warning::comment: GitHub refused it ({why}); a pull request from a fork gets a read-only token, so "
            "the report is in the job summary only. The gate's decision stands.\n")
    assert made == [("s3cret", "https://api.github.com")] * 2
