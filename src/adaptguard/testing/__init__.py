"""The gate of `adaptguard compare --fail-on` as an assertion in a test suite (`assert_compatible`), and the pytest
plugin (`adaptguard.testing.plugin`, entry point `pytest11: adaptguard`) that points a suite at its runs and lists
every gate checked.

    from adaptguard.testing import assert_compatible

    def test_int8_keeps_the_answers():
        assert_compatible("runs/fp32", "runs/int8", "nfr>10%", "overall:acc_drop>1%")

It runs the code path `compare` runs (`compat.compare.compare_runs`, `compat.gate.check_gate`, `describe`), so a
test decides what the command decides: a breach raises AssertionError whose message is the gate's own lines; an
undecided gate does too, unless `undecided="skip"` (the test is skipped with the undecided lines, which say how much
the data can see) or `"pass"`. Bad input (a rule, a run, an option: what makes `compare` exit 2) raises
`GateInputError`, one line. pytest is imported only to skip, never by `import adaptguard`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..compat.verdicts import OUTCOMES, Decision

UNDECIDED = ("fail", "skip", "pass")
# compare's options, as compare_runs names them (`compatible` is compare's --compatible)
COMPARE_OPTIONS = ("similarity", "metric", "compatible", "n_boot", "seed", "include_churn", "tasks", "common_tasks",
                   "scorer")
Run = str | os.PathLike | Sequence[str | os.PathLike]

# Every gate checked, one line each, until the plugin moves them onto the test's report (its terminal section lists
# them); without the plugin nobody takes them, a line per call
_checked: list[str] = []


class GateInputError(ValueError):
    """Bad input to the gate: a malformed rule, a run that cannot be read or compared, an option out of range
    (`adaptguard compare` exits 2 on it). The message is one line naming the rule, file or option."""


def assert_compatible(old: Run, new: Run, *fail_on: str | Sequence[str], undecided: str = "fail",
                      significance: float | str | None = 0.05, **compare_options) -> dict:
    """Decide the `fail_on` rules (`compare --fail-on`, e.g. "nfr>2%", "overall:acc_drop>1%") between two runs.

    `old`, `new`: anything `compare` reads (an lm-eval folder or samples file, Inspect logs, lighteval details,
    JSONL, `example:fp32`); a list, or "RUN1,RUN2", is replicate runs of one side. `undecided`: "fail" (the
    default: AssertionError, as compare's exit 3 fails a gate), "skip" (pytest.skip with the undecided lines) or
    "pass". `significance`: the test level (default 0.05; None or "off" compares raw values). `compare_options`:
    similarity, metric (a name, or {TASKGLOB: name}), compatible (a third run), n_boot, seed, include_churn,
    tasks, common_tasks, scorer, as compare's flags. Returns the gate (`check_gate`'s dict) when it passes."""
    __tracebackhide__ = True  # a failure or skip points at the test's line, not at this function
    unknown = sorted(set(compare_options) - set(COMPARE_OPTIONS))
    if unknown:
        raise TypeError(f"assert_compatible: unknown option {', '.join(unknown)}; compare's: {', '.join(COMPARE_OPTIONS)}")
    rules = [r for rule in fail_on for r in ([rule] if isinstance(rule, str) else rule)]
    where = f"[{', '.join(map(str, rules))}] {_name(old)} → {_name(new)}"
    try:
        gate = _gate(old, new, rules, undecided, significance, compare_options)
    except (ValueError, OSError, ImportError) as err:  # what compare refuses with exit status 2, in its words
        detail = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename and err.strerror else str(err)
        _record(f"{where}: bad input: {detail}")
        raise GateInputError(f"adaptguard: {detail}") from None
    from ..compat.render.decisions import describe

    text, status = describe(gate), gate.status
    fails = status is Decision.BREACH or (status is Decision.UNDECIDED and undecided == "fail")
    skips = status is Decision.UNDECIDED and undecided == "skip"
    # the test's outcome in the gate's words (`OUTCOMES`: failed, passed); a skip is pytest's own
    outcome = OUTCOMES[Decision.BREACH].word if fails else "skipped" if skips else OUTCOMES[Decision.CLEAR].word
    counts = ", ".join(f"{len(gate.of_kind(k))} {k}" for k in Decision)
    _record(f"{where}: {status} ({counts}), {outcome}")
    if fails:
        raise AssertionError(text)
    if skips:
        import pytest

        pytest.skip("\n".join(line.strip() for line in text.splitlines()[1:]))  # the undecided lines: how far the data reach
    return gate


def _gate(old: Run, new: Run, rules: list, undecided: str, significance, options: dict) -> dict:
    """`compare OLD NEW --fail-on ...`'s gate: its reading of the runs and its decisions (ValueError on bad input)."""
    from ..compat.compare import compare_runs
    from ..compat.gate import Threshold, check_gate

    if undecided not in UNDECIDED:
        raise ValueError(f"undecided={undecided!r}: give one of {', '.join(UNDECIDED)}")
    if not rules:
        raise ValueError("no --fail-on rule given: give at least one, e.g. 'nfr>2%'")
    if isinstance(significance, str) and significance.lower() == "off":
        significance = None
    if significance is not None and (isinstance(significance, str) or not 0 < significance < 1):
        raise ValueError(f"significance={significance!r}: give a level in (0, 1) such as 0.05, or 'off'")
    thresholds = [r if isinstance(r, Threshold) else Threshold.parse(r) for r in rules]  # before the runs are read
    if "compatible" in options:
        options["compatible_path"] = options.pop("compatible")
    level = {} if significance is None else {"alpha": significance}  # off: compare_runs' default level for its flags
    report = compare_runs(_side(old, "old"), [_side(new, "new")], **level, **options)
    return check_gate(report, thresholds, significance)


def _side(run: Run, name: str) -> str | list[str]:
    """One side as compare reads it: a run, or replicate runs (a list, or "RUN1,RUN2" as on the command line)."""
    parts = str(run).split(",") if isinstance(run, str) else [os.fspath(run)] if isinstance(run, os.PathLike) \
        else [os.fspath(p) for p in run]
    if not parts or any(not p for p in parts):
        raise ValueError(f"{name} {run!r}: an empty run in a list of replicates")
    return parts[0] if len(parts) == 1 else parts


def _name(run: Run) -> str:
    return str(run) if isinstance(run, (str, os.PathLike)) else ",".join(map(str, run))


def _record(line: str) -> None:
    _checked.append(line)


def take_checked() -> list[str]:
    """The gates checked since the last call (the plugin's), a line each; emptied."""
    out = _checked[:]
    del _checked[:]
    return out
