"""The pytest plugin (entry point `pytest11: adaptguard`; `-p no:adaptguard` turns it off): a suite's gate tests
pointed at their runs from the command line, and a terminal section listing every gate checked.

    pytest --adaptguard-old runs/old --adaptguard-new runs/new [--adaptguard-undecided skip]

    def test_update_keeps_the_answers(adaptguard_gate):
        adaptguard_gate("nfr>2%", "overall:acc_drop>1%")   # assert_compatible(old, new, ...) on the runs given

The fixtures `adaptguard_old` and `adaptguard_new` are the runs given (a test that needs one skips, saying which
option to give, when it is not); `adaptguard_gate` calls `assert_compatible` with both. Every `assert_compatible`
call, in any test, is listed in the section "adaptguard gates" with its decision (with `-n`, too: each line travels
on the test's report). A refusal of bad input (`GateInputError`) is reported as its one line at the test's line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import UNDECIDED, GateInputError, assert_compatible, take_checked

KEY = "adaptguard"  # the user property each gate's line travels under (also in --junitxml)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("adaptguard", "adaptguard compatibility gate")
    runs = ("anything `adaptguard compare` reads: an lm-eval folder, Inspect logs, JSONL, example:fp32; "
            "RUN1,RUN2 for replicate runs")
    group.addoption("--adaptguard-old", metavar="RUN", help=f"the old model's run for the adaptguard_old fixture: {runs}")
    group.addoption("--adaptguard-new", metavar="RUN", help=f"the new model's run for the adaptguard_new fixture: {runs}")
    group.addoption("--adaptguard-undecided", choices=UNDECIDED, default="fail",
                    help="what adaptguard_gate does with an undecided gate: fail (default), skip or pass")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GateReport(), "adaptguard-gates")


def _run(request: pytest.FixtureRequest, side: str) -> str:
    run = request.config.getoption(f"adaptguard_{side}")
    if not run:
        pytest.skip(f"no --adaptguard-{side} given: give the {side} model's run to check this gate")
    return run


@pytest.fixture
def adaptguard_old(request: pytest.FixtureRequest) -> str:
    """The run given with --adaptguard-old (the test skips, naming the option, without one)."""
    return _run(request, "old")


@pytest.fixture
def adaptguard_new(request: pytest.FixtureRequest) -> str:
    """The run given with --adaptguard-new (the test skips, naming the option, without one)."""
    return _run(request, "new")


@pytest.fixture
def adaptguard_gate(adaptguard_old: str, adaptguard_new: str, request: pytest.FixtureRequest):
    """`gate(*fail_on, **options)`: `assert_compatible` on the runs given, undecided as --adaptguard-undecided says
    unless `undecided=` is passed."""
    undecided = request.config.getoption("adaptguard_undecided")

    def gate(*fail_on, **options) -> dict:
        __tracebackhide__ = True
        options.setdefault("undecided", undecided)
        return assert_compatible(adaptguard_old, adaptguard_new, *fail_on, **options)

    return gate


@pytest.hookimpl(hookwrapper=True)  # the old style: pytest 7 has no wrapper=True, and this plugin loads in every run
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # the gates this phase checked go on the item's properties before its report is made from them
    item.user_properties.extend((KEY, line) for line in take_checked())
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(GateInputError):  # one line, at the test's line
        entry = next((e for e in reversed(call.excinfo.traceback) if Path(e.path) == item.path), None)
        where = f"{item.location[0]}:{entry.lineno + 1}" if entry is not None else item.nodeid
        report.longrepr = f"{where}: {call.excinfo.value}"


class GateReport:
    """Collects the gates from the reports (under xdist, the workers' reports) and prints them at the end."""

    def __init__(self):
        self.gates: dict[str, list[str]] = {}  # nodeid -> its gates' lines, in the order the tests ran

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        lines = [value for key, value in report.user_properties if key == KEY]
        if len(lines) > len(self.gates.get(report.nodeid, [])):  # each phase's report carries the earlier ones
            self.gates[report.nodeid] = lines

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.gates:
            return
        terminalreporter.section("adaptguard gates")
        for nodeid, lines in self.gates.items():
            for line in lines:
                terminalreporter.write_line(f"{nodeid}: {line}")
