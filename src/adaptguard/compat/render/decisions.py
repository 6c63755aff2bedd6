"""The gate's decisions in words (`adaptguard compare --fail-on`, `evaluate`, the Action and the pytest plugin):
one line per decision (`decision_line`: the value, the threshold, the test's p and the interval it used), the
outcome in one line (`headline`: what the exit status says), and the terminal's block (`describe`). Every word of an
outcome comes from `verdicts.OUTCOMES`; the decisions themselves are `gate.check_gate`'s."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from ..metric_table import in_rate_units, is_rate
from ..verdicts import EXIT_PASSED, OUTCOMES, Decision, Evidence, Gate, Shows, ThresholdDecision, decision_of


def _rate(metric: str, value: float) -> str:
    return f"{100 * value:.2f}%" if in_rate_units(metric) else f"{value:.4g}"


def _limit(metric: str, threshold: float) -> str:
    """A threshold as written: two decimals in %, more where it has them (`nfr>0.799%` is 0.799%, not 0.80%)."""
    if not in_rate_units(metric):
        return _rate(metric, threshold)
    percent = Decimal(repr(float(threshold))) * 100  # the decimal the threshold was parsed from
    return f"{percent:.{max(2, -percent.normalize().as_tuple().exponent)}f}%"


def _reach(d: ThresholdDecision) -> str:
    """How far the data reach, for an undecided decision: the MDE, the items needed at the rate seen, or why not."""
    from ..evidence import ITEMS_CAP

    if d.mde is not None:
        seen = f"the data detect a change of {_rate(d.metric, d.mde)} at 80 % power"
        return seen + (", but at the value seen no number of items or runs decides it" if d.at_threshold else
                       ": add items or runs")
    if d.items_needed is not None:
        return f"at the rate seen, about {d.items_needed:,} items would decide it"
    if d.at_threshold:
        return "the value seen equals the threshold: no number of items decides it at this value"
    if is_rate(d.metric) and d.evidence is Evidence.ONE_RUN:  # no number of items up to the cap decides it
        return f"at the rate seen, more than {ITEMS_CAP:,} items would be needed to decide it"
    if d.value == 0:
        return "no change was seen to plan from: add items or runs"
    return "add items or runs to decide it"


def decision_line(d: ThresholdDecision | Mapping) -> str:
    """One decision in words: the value, the threshold, the decision, the test's p and the interval it used."""
    d = decision_of(d)
    metric, at = d.metric, d.at_threshold
    where = "≤" if d.op == ">" else "≥"
    limit = _limit(metric, d.threshold)
    head = f"{d.task}: {metric} = {limit if at else _rate(metric, d.value)}"
    some_task = d.across is not None and d.across.shows is Shows.SOME_TASK
    if some_task and d.decision is Decision.BREACH:
        head = (f"{d.task}: some task dropped more than {limit} (most: {d.across.worst_task}, "
                f"acc_drop = {_rate(metric, d.value)})")
    if d.p_value is None:
        if at:  # raw values: at the threshold is not beyond it
            return f"{head}, exactly the threshold: not beyond it  [{d.expr}]"
        return f"{head} {d.op if d.decision is Decision.BREACH else where} {limit}  [{d.expr}]"
    ci = ""
    if d.interval is not None:
        lo, hi = d.interval
        ci = f"; {round(100 * d.level)} % interval {_rate(metric, lo)} to {_rate(metric, hi)}"
    towards = "below" if d.op == ">" else "above"
    if d.decision is Decision.BREACH:
        if some_task:
            body = f"(max-drop/Fisher p = {d.p_value:.3g}, {d.test})"
        else:
            body = f"{d.op} {limit} (p = {d.p_value:.3g}, {d.test}{ci})"
    elif d.decision is Decision.CLEAR:
        body = f"{'<' if d.op == '>' else '>'} {limit} shown (p = {d.p_within:.3g}, {d.test}{ci})"
    else:
        if at:  # neither beyond nor within: both tests' p
            body = (f"exactly the threshold: not beyond it, nor shown {towards} it (p = {d.p_value:.3g} beyond, "
                    f"{d.p_within:.3g} {towards}, both ≥ α")
        elif d.reason.beyond:
            body = f"{d.op} {limit} but not significantly (p = {d.p_value:.3g} ≥ α"
        else:
            body = f"{where} {limit} but not shown {towards} it (p = {d.p_within:.3g} ≥ α"
        body += f", {d.test}{ci}; {_reach(d)})"
    return f"{head}{', ' if at and d.decision is Decision.UNDECIDED else ' '}{body}  [{d.expr}]"


def headline(gate: Gate | Mapping) -> str:
    """The gate's outcome in one line: what the exit status says, and what was left out of it. With
    `--significance off` nothing was tested: it says raw values were compared, never that the data support a breach."""
    gate = Gate.of(gate)
    raw = gate.significance is None
    counts = ("raw values, no test; " if raw else "") + ", ".join(
        f"{len(gate.of_kind(k))} {k}" for k in Decision)
    left = len(gate.left_out)
    out = f" ({counts}; {left} (task, threshold) pair{'s' * (left != 1)} left out)" if left else f" ({counts})"
    outcome = OUTCOMES[gate.status]  # its word; a status that fails the check (exit ≠ 0) in capitals
    word = f"gate: {outcome.word if outcome.exit_code == EXIT_PASSED else outcome.word.upper()}, "
    if gate.status is Decision.BREACH:
        return word + ("a value beyond its threshold" if raw else "a breach the data support") + out
    if gate.status is Decision.UNDECIDED:
        return word + "no breach but not every threshold could be decided" + out
    if raw:
        return word + ("no value decided is beyond its threshold" if left else "no value beyond its threshold") + out
    return word + ("every threshold decided is clear" if left else "every threshold clear") + out


def describe(gate: Gate | Mapping) -> str:
    """The gate's decision for the terminal: the headline, one line per breach and undecided threshold, what was left
    out."""
    gate = Gate.of(gate)
    alpha = gate.significance
    how = (f"breach: its one-sided test at p < {alpha:g}; clear: the opposite test at p < {alpha:g}"
           if alpha is not None else "--significance off: breach where a value is beyond its threshold, clear otherwise")
    lines = [f"{headline(gate)}; {how}" + (":" if gate.status is not Decision.CLEAR else "")]
    if gate.nothing_decided:
        lines.append(f"  {gate.nothing_decided}")
    for kind in (Decision.BREACH, Decision.UNDECIDED):
        lines += [f"  {kind}: {decision_line(d)}" for d in gate.of_kind(kind)]
    if gate.left_out and not gate.nothing_decided:
        for why in sorted({x.why for x in gate.left_out}):
            tasks = sorted({x.task for x in gate.left_out if x.why == why})
            lines.append(f"  left out: {', '.join(tasks)} ({why})")
    return "\n".join(lines)
