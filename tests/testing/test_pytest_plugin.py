"""The pytest plugin and `assert_compatible` (issue 89), run as a user's suite would run them, through pytester: on
the shipped pair (`example:fp32` → `example:int8`) `nfr>10%` is a breach, `nfr>30%` undecided, `nfr>50%` clear —
each test fails, skips or passes as the gate decides, with the gate's own lines; bad input is one line."""

import sys

import pytest
from shipped_lines import BREACH, N_ITEMS, P_BREACH, UNDECIDED, K, decides_at

from adaptguard.testing import GateInputError, assert_compatible, take_checked

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def compare_imported():
    """compare's modules imported here first: pytester's in-process runs drop the modules each run imported, and
    numpy's and scipy's extensions cannot be loaded twice in one process."""
    assert_compatible("example:fp32", "example:int8", "nfr>50%")
    take_checked()  # not a gate of this suite's

BAD_RULE = "adaptguard: --fail-on 'nfr>10': nfr is a rate (the table prints it in %): write 10% or 0.1"

SUITE = """
from adaptguard.testing import assert_compatible

def test_breach():
    assert_compatible("example:fp32", "example:int8", "nfr>10%")

def test_undecided_fails():
    assert_compatible("example:fp32", "example:int8", "nfr>30%")

def test_undecided_skips():
    assert_compatible("example:fp32", "example:int8", "nfr>30%", undecided="skip")

def test_undecided_passes():
    assert_compatible("example:fp32", "example:int8", "nfr>30%", undecided="pass")

def test_clear():
    gate = assert_compatible("example:fp32", "example:int8", "nfr>50%")
    assert [d["decision"] for d in gate["decisions"]] == ["clear", "clear"]
"""


def failure(result, name: str) -> list[str]:
    """The lines of one test's failure section (between its ____ header and the next)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and f" {name} " in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(("_", "=")))
    return [line for line in lines[start + 1:end] if line.strip()]


def test_each_decision_fails_skips_or_passes_the_test_with_the_gates_lines(pytester):
    pytester.makepyfile(test_gates=SUITE)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(failed=2, skipped=1, passed=2)
    breach = failure(result, "test_breach")
    assert "E       AssertionError: gate: FAILED, a breach the data support (2 breach, 0 undecided, 0 clear); breach: its " \
           "one-sided test at p < 0.05; clear: the opposite test at p < 0.05:" in breach
    assert f"E         breach: {BREACH}" in breach
    assert "E       AssertionError: gate: UNDECIDED, no breach but not every threshold could be decided (0 breach, 1 " \
           "undecided, 1 clear); breach: its one-sided test at p < 0.05; clear: the opposite test at p < 0.05:" \
           in failure(result, "test_undecided_fails")
    # the skip names the test's line (not the library's) and says how far the data reach: the items at which the
    # rate seen would be shown below 30 % (to the 1 % the plan is rounded to)
    (skip,) = [x for x in result.stdout.lines if x.startswith("SKIPPED [1] test_gates.py:10: undecided: ")]
    assert decides_at(UNDECIDED.fullmatch(skip.removeprefix("SKIPPED [1] test_gates.py:10: undecided: ")))
    # every gate checked, in the order run, with its decision and what it did to the test
    section = result.stdout.lines[result.stdout.lines.index(next(x for x in result.stdout.lines if "adaptguard gates" in x)) + 1:]
    assert section[:5] == [
        "test_gates.py::test_breach: [nfr>10%] example:fp32 → example:int8: breach (2 breach, 0 undecided, 0 clear), failed",
        "test_gates.py::test_undecided_fails: [nfr>30%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, "
        "1 clear), failed",
        "test_gates.py::test_undecided_skips: [nfr>30%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, "
        "1 clear), skipped",
        "test_gates.py::test_undecided_passes: [nfr>30%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, "
        "1 clear), passed",
        "test_gates.py::test_clear: [nfr>50%] example:fp32 → example:int8: clear (0 breach, 0 undecided, 2 clear), passed",
    ]


def test_the_options_point_the_fixtures_at_the_runs(pytester):
    pytester.makepyfile(test_suite="""
        def test_int8(adaptguard_gate):
            adaptguard_gate("nfr>30%")

        def test_int8_clear(adaptguard_gate, adaptguard_old, adaptguard_new):
            assert (adaptguard_old, adaptguard_new) == ("example:fp32", "example:int8")
            adaptguard_gate("nfr>50%")
    """)
    runs = ["--adaptguard-old", "example:fp32", "--adaptguard-new", "example:int8"]
    pytester.runpytest(*runs).assert_outcomes(failed=1, passed=1)  # undecided fails by default
    pytester.runpytest(*runs, "--adaptguard-undecided", "skip").assert_outcomes(skipped=1, passed=1)
    pytester.runpytest(*runs, "--adaptguard-undecided=pass").assert_outcomes(passed=2)
    # no runs given: the gate tests skip, saying what to give
    result = pytester.runpytest("-rs", "--adaptguard-new", "example:int8")
    result.assert_outcomes(skipped=2)
    assert [line for line in result.stdout.lines if line.startswith("SKIPPED")] == [
        f"SKIPPED [1] test_suite.py:{n}: no --adaptguard-old given: give the old model's run to check this gate" for n in (1, 4)]


def test_a_bad_rule_and_a_missing_run_fail_in_one_line(pytester, tmp_path):
    missing = tmp_path / "no_such_run"
    pytester.makepyfile(test_bad=f"""
        from adaptguard.testing import assert_compatible

        def test_bad_rule():
            assert_compatible("example:fp32", "example:int8", "nfr>10")

        def test_missing_run():
            assert_compatible("example:fp32", {str(missing)!r}, "nfr>10%")
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=2)
    assert failure(result, "test_bad_rule") == [f"test_bad.py:4: {BAD_RULE}"]
    assert failure(result, "test_missing_run") == [f"test_bad.py:7: adaptguard: {missing}: no such file or directory"]
    assert (f"test_bad.py::test_bad_rule: [nfr>10] example:fp32 → example:int8: bad input: "
            f"{BAD_RULE.removeprefix('adaptguard: ')}") in result.stdout.lines


def test_assert_compatible_reads_what_compare_reads(tmp_path):
    """Replicate runs (a list, or RUN1,RUN2 as on the command line) and compare's options go through compare's own
    code path: excess_nfr, which compare refuses without replicates, is decided; a task glob restricts the gate."""
    import shutil

    from adaptguard.compat.reading.runs import example_run_path

    for copy, run in (("a", "fp32"), ("b", "fp32"), ("c", "int8")):  # two reruns of the old model, as a seed pair
        shutil.copytree(example_run_path(f"example:{run}"), tmp_path / copy)
    a, b, c = (str(tmp_path / x) for x in "abc")
    take_checked()
    for old in ([a, b], f"{a},{b}"):
        gate = assert_compatible(old, c, "excess_nfr>50%")
        assert [(d["task"], d["decision"]) for d in gate["decisions"]] == [
            ("bb_date_understanding", "clear"), ("bb_general_knowledge", "clear")]
    # the section's line names both replicates, as compare's command line would
    assert take_checked() == [f"[excess_nfr>50%] {a},{b} → {c}: clear (0 breach, 0 undecided, 2 clear), passed"] * 2
    with pytest.raises(GateInputError) as err:
        assert_compatible(a, c, "excess_nfr>50%")
    assert str(err.value).startswith("adaptguard: --fail-on 'excess_nfr>50%': excess_nfr needs replicate runs")
    gate = assert_compatible("example:fp32", "example:int8", ["nfr>50%"], tasks="bb_general_*")
    assert [d["task"] for d in gate["decisions"]] == ["bb_general_knowledge"]
    with pytest.raises(GateInputError) as err:
        assert_compatible("example:fp32", "example:int8", "nfr>50%", undecided="maybe")
    assert str(err.value) == "adaptguard: undecided='maybe': give one of fail, skip, pass"
    with pytest.raises(TypeError, match="unknown option colour"):
        assert_compatible("example:fp32", "example:int8", "nfr>50%", colour="red")
    take_checked()  # this test's gates are not the suite's


def test_the_significance_argument_is_the_tests_level():
    """`nfr>10%` on bb_general_knowledge has p = P_BREACH (scipy's binomtest on its counts): a breach at a level
    above it, undecided below it; "off" and None compare raw values (28.99 % > 10 %: beyond); a level outside (0, 1)
    is refused in one line."""
    one = {"tasks": "bb_general_*"}
    with pytest.raises(AssertionError, match=r"^gate: FAILED, a breach the data support \(1 breach"):
        assert_compatible("example:fp32", "example:int8", "nfr>10%", significance=P_BREACH * 1.5, **one)
    gate = assert_compatible("example:fp32", "example:int8", "nfr>10%", significance=P_BREACH / 1.5,
                             undecided="pass", **one)
    (d,) = gate["decisions"]
    assert (d["decision"], d["p_value"]) == ("undecided", pytest.approx(P_BREACH, rel=1e-9))
    for off in ("off", "OFF", None):
        with pytest.raises(AssertionError, match=r"^gate: FAILED, a value beyond its threshold \(raw values, no test"):
            assert_compatible("example:fp32", "example:int8", "nfr>10%", significance=off, **one)
    gate = assert_compatible("example:fp32", "example:int8", "nfr>50%", significance="off", **one)
    assert [(d["decision"], d["why"], d["p_value"]) for d in gate["decisions"]] == [
        ("clear", "within the threshold", None)]
    for bad in (0, 1, 1.5, -0.1, "0.05"):
        with pytest.raises(GateInputError) as err:
            assert_compatible("example:fp32", "example:int8", "nfr>10%", significance=bad)
        assert str(err.value) == f"adaptguard: significance={bad!r}: give a level in (0, 1) such as 0.05, or 'off'"
    take_checked()  # this test's gates are not the suite's


def test_importing_adaptguard_does_not_import_pytest(tmp_path):
    import subprocess

    code = "import sys, adaptguard, adaptguard.testing; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.slow  # two pytest workers started: about 10 s
def test_the_section_lists_the_workers_gates_under_xdist(pytester):
    """Each gate's line travels on its test's report from the worker that ran it."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_split="""
        from adaptguard.testing import assert_compatible

        def test_one():
            assert_compatible("example:fp32", "example:int8", "nfr>50%")

        def test_two():
            assert_compatible("example:fp32", "example:int8", "nfr>30%", undecided="pass")
    """)
    result = pytester.runpytest("-n", "2")
    result.assert_outcomes(passed=2)
    section = result.stdout.lines[result.stdout.lines.index(next(x for x in result.stdout.lines if "adaptguard gates" in x)) + 1:]
    assert sorted(section[:2]) == [
        "test_split.py::test_one: [nfr>50%] example:fp32 → example:int8: clear (0 breach, 0 undecided, 2 clear), passed",
        "test_split.py::test_two: [nfr>30%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, 1 clear), passed"]


def test_each_gate_checked_is_recorded_in_one_line_and_a_skip_says_how_far_the_data_reach():
    """Without pytester (the mutation run's fast lane): the line each call records for the plugin's section, word
    for word, for each outcome and for bad input; the skip's message is the undecided lines of the gate."""
    take_checked()
    assert_compatible("example:fp32", "example:int8", "nfr>50%", tasks="bb_general_*")
    assert_compatible("example:fp32", ["example:int8"], "nfr>30%", "nfr>50%", undecided="pass",
                      tasks="bb_general_*")
    with pytest.raises(pytest.skip.Exception) as skipped:
        assert_compatible("example:fp32", "example:int8", ["nfr>30%"], undecided="skip", tasks="bb_general_*")
    assert decides_at(UNDECIDED.fullmatch(str(skipped.value.msg).removeprefix("undecided: ")))
    with pytest.raises(AssertionError):
        assert_compatible("example:fp32", "example:int8", "nfr>10%", tasks="bb_general_*")
    with pytest.raises(GateInputError):
        assert_compatible("example:fp32", "example:int8", "nfr>10")
    assert take_checked() == [
        "[nfr>50%] example:fp32 → example:int8: clear (0 breach, 0 undecided, 1 clear), passed",
        "[nfr>30%, nfr>50%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, 1 clear), passed",
        "[nfr>30%] example:fp32 → example:int8: undecided (0 breach, 1 undecided, 0 clear), skipped",
        "[nfr>10%] example:fp32 → example:int8: breach (1 breach, 0 undecided, 0 clear), failed",
        f"[nfr>10] example:fp32 → example:int8: bad input: {BAD_RULE.removeprefix('adaptguard: ')}",
    ] and take_checked() == []


def test_the_level_and_compares_options_reach_compare(tmp_path):
    """`significance` is compare's level too (its intervals at 1 − 2α), `compatible` is compare's --compatible (the
    delta rows appear), and an empty run in a list of replicates is refused naming its side."""
    import math

    from scipy.stats import beta

    gate = assert_compatible("example:fp32", "example:int8", "nfr>30%", significance=0.01, undecided="pass",
                             tasks="bb_general_*")
    (d,) = gate["decisions"]
    assert d["level"] == pytest.approx(0.98) and d["interval"][0] == pytest.approx(
        beta.ppf(0.01, K, N_ITEMS - K + 1), rel=1e-9)  # the Clopper–Pearson lower end at 99 %
    gate = assert_compatible("example:fp32", "example:int8", "delta_nfr>50%", compatible="example:fp32",
                             significance="off", tasks="bb_general_*")
    (d,) = gate["decisions"]
    assert d["metric"] == "delta_nfr" and math.isfinite(d["value"])
    for side, args in (("old", (["example:fp32", ""], "example:int8")), ("new", ("example:fp32", "example:int8,"))):
        with pytest.raises(GateInputError) as err:
            assert_compatible(*args, "nfr>10%")
        assert str(err.value).startswith(f"adaptguard: {side} ") and "an empty run in a list of replicates" in str(
            err.value)
    with pytest.raises(TypeError) as err:
        assert_compatible("example:fp32", "example:int8", "nfr>50%", colour="red", size=2)
    assert str(err.value) == ("assert_compatible: unknown option colour, size; compare's: similarity, metric, "
                              "compatible, n_boot, seed, include_churn, tasks, common_tasks, scorer")
    take_checked()


def test_the_options_and_the_section_as_pytest_shows_them():
    """Without pytester (the mutation run's fast lane): the options a user types and the help `pytest --help` prints
    under the plugin's group, the name the report is registered under (`-p no:adaptguard-gates` turns the section off)
    and the section's title and lines, each written out."""
    from types import SimpleNamespace

    from _pytest.config.argparsing import Parser

    from adaptguard.testing import plugin

    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    group = parser.getgroup("adaptguard")
    assert group._arggroup.title == "adaptguard compatibility gate"  # the title of its part of `pytest --help`
    runs = ("anything `adaptguard compare` reads: an lm-eval folder, Inspect logs, JSONL, example:fp32; RUN1,RUN2 for "
            "replicate runs")
    keys = ("dest", "metavar", "help", "choices", "default")
    assert [(o.names(), {k: o.attrs()[k] for k in keys if o.attrs().get(k) is not None}) for o in group.options] == [
        (["--adaptguard-old"], {"metavar": "RUN", "dest": "adaptguard_old",
                                "help": f"the old model's run for the adaptguard_old fixture: {runs}"}),
        (["--adaptguard-new"], {"metavar": "RUN", "dest": "adaptguard_new",
                                "help": f"the new model's run for the adaptguard_new fixture: {runs}"}),
        (["--adaptguard-undecided"], {"choices": ("fail", "skip", "pass"), "default": "fail",
                                      "dest": "adaptguard_undecided",
                                      "help": "what adaptguard_gate does with an undecided gate: fail (default), skip "
                                              "or pass"}),
    ]
    registered = []
    plugin.pytest_configure(SimpleNamespace(pluginmanager=SimpleNamespace(
        register=lambda obj, name: registered.append((type(obj), name)))))
    assert registered == [(plugin.GateReport, "adaptguard-gates")]
    written = []
    terminal = SimpleNamespace(section=lambda title: written.append(f"== {title}"), write_line=written.append)
    report = plugin.GateReport()
    report.pytest_terminal_summary(terminal)
    assert written == []  # no gate checked: no section
    report.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::a", user_properties=[(plugin.KEY, "clear: x")]))
    report.pytest_terminal_summary(terminal)
    assert written == ["== adaptguard gates", "t.py::a: clear: x"]
