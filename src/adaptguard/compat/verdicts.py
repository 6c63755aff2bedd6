"""The one vocabulary of every decision adaptguard states, and its one owner: what a threshold decided and why (enums,
never sentences read back), how each decision is shown and what it exits with (`OUTCOMES`), and the frozen records
of a threshold's decision (`ThresholdDecision`), of a threshold left out (`LeftOut`) and of a whole gate (`Gate`).

The terminal, Markdown, the HTML page, `evaluate`, `update`, the GitHub Action and the pytest plugin all read
`OUTCOMES`; `decide` and `gate` build the records. Each record reads as the mapping `report.json` writes
(`d["decision"]`, `d["why_code"]`), so a report read back and one built here are the same to every reader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any


class Decision(StrEnum):
    """A threshold's decision (and a gate's status: the worst of its decisions)."""

    BREACH = "breach"  # the data support "metric beyond the threshold"
    UNDECIDED = "undecided"  # neither side is supported
    CLEAR = "clear"  # the data show the metric within the threshold


class Reason(StrEnum):
    """Why a threshold got its decision: a stable code (report.json's `why_code`), its sentence beside it (`why`,
    `sentence`: rewording one leaves old reports readable by their code)."""

    SUPPORTED = "supported"
    SOME_TASK = "some_task"  # overall:acc_drop, by the max-drop or Fisher test
    SHOWN_WITHIN = "shown_within"
    BEYOND_NOT_SIGNIFICANT = "beyond_not_significant"
    WITHIN_NOT_SHOWN = "within_not_shown"
    AT_THRESHOLD = "at_threshold"
    # --significance off: raw values compared, no test
    BEYOND = "beyond"
    WITHIN = "within"
    AT_THRESHOLD_RAW = "at_threshold_raw"

    @property
    def sentence(self) -> str:
        return REASON_SENTENCES[self]

    @classmethod
    def read(cls, d: Mapping) -> Reason:
        """A report.json decision's reason: by its code, or (reports before the codes) by its sentence."""
        if "why_code" in d:
            return cls(d["why_code"])
        return next(r for r, sentence in REASON_SENTENCES.items() if sentence == d["why"])

    @property
    def at_threshold(self) -> bool:
        """The value equals its threshold exactly (compared on the counts, `evidence.relation`)."""
        return self in (Reason.AT_THRESHOLD, Reason.AT_THRESHOLD_RAW)

    @property
    def beyond(self) -> bool:
        """The value seen lies beyond its threshold (whether or not a test supports it)."""
        return self in (Reason.SUPPORTED, Reason.SOME_TASK, Reason.BEYOND_NOT_SIGNIFICANT, Reason.BEYOND)

    @classmethod
    def untested(cls, side: int, op: str) -> Reason:
        """A raw value (no test) on `side` of its threshold (`evidence.relation`): at it is not beyond it."""
        return cls.AT_THRESHOLD_RAW if side == 0 else cls.BEYOND if beyond(side, op) else cls.WITHIN

    @classmethod
    def undecided(cls, side: int, op: str) -> Reason:
        """Why neither test decided a value on `side` of its threshold."""
        return cls.AT_THRESHOLD if side == 0 else cls.BEYOND_NOT_SIGNIFICANT if beyond(side, op) else \
            cls.WITHIN_NOT_SHOWN


REASON_SENTENCES = {
    Reason.SUPPORTED: "the data support it",
    Reason.SOME_TASK: "some task dropped beyond the threshold",
    Reason.SHOWN_WITHIN: "the data show it within the threshold",
    Reason.BEYOND_NOT_SIGNIFICANT: "beyond the threshold, but not significantly",
    Reason.WITHIN_NOT_SHOWN: "within the threshold, but the data cannot show it",
    Reason.AT_THRESHOLD: "at the threshold: neither beyond it nor shown within it",
    Reason.BEYOND: "beyond the threshold",
    Reason.WITHIN: "within the threshold",
    Reason.AT_THRESHOLD_RAW: "at the threshold, not beyond it",
}


class Evidence(StrEnum):
    """The kind of evidence behind a task's entry: it picks the test, the interval and how far the data reach
    (`evidence`)."""

    ONE_RUN = "one run"  # one run per side: exact tests on the item counts
    REPLICATES = "replicates"  # replicate runs on a side: tests over runs and items
    ANYTIME = "anytime"  # evaluated until decided, e-processes valid at every look
    GROUP = "group"  # evaluated until decided over the known pool, group-sequential boundaries


def beyond(side: int, op: str) -> bool:
    """Is a value on `side` of its threshold (1 above, 0 at, −1 below) beyond it for `op`? At the threshold it is
    not."""
    return side > 0 if op == ">" else side < 0


@dataclass(frozen=True)
class Outcome:
    """How a decision (or a gate's status) is shown and what it exits with."""

    exit_code: int  # `adaptguard compare --fail-on` / `evaluate`'s exit status
    word: str  # the page's status and the pytest plugin's outcome: failed, undecided, passed
    colour: tuple[str, str]  # the page's colour: background, border (red, amber, green)


EXIT_PASSED, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_UNDECIDED = 0, 1, 2, 3
OUTCOMES = {
    Decision.BREACH: Outcome(EXIT_REGRESSION, "failed", ("#fbe3e3", "#d55")),
    Decision.UNDECIDED: Outcome(EXIT_UNDECIDED, "undecided", ("#fff4dc", "#e0a526")),
    Decision.CLEAR: Outcome(EXIT_PASSED, "passed", ("#eef6ee", "#9c9")),
}
NOTHING_GATED = "none"  # the page's status when nothing was gated (neutral)


class _Record(Mapping[str, Any]):
    """A frozen record that reads as its JSON mapping (`to_json`), for code and reports written against the dict."""

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclass(frozen=True, eq=False)
class ThresholdDecision(_Record):
    """One (task, threshold) decided: its value against the threshold, the decision and its reason, the p-values of
    both one-sided tests (breach: `p_value`; clear: `p_within`; None without a test), the interval the decision used
    and its level, and how far the data reach where undecided (`mde`, `items_needed`)."""

    task: str
    expr: str
    metric: str
    op: str  # ">" or "<"
    threshold: float
    value: float | None
    decision: Decision
    reason: Reason
    p_value: float | None = None
    p_within: float | None = None
    test: str | None = None
    interval: tuple[float, float] | None = None
    level: float | None = None
    mde: float | None = None
    items_needed: int | None = None
    across: Across | None = None  # overall:acc_drop only: what the tests across tasks showed
    evidence: Evidence | None = None  # the kind of evidence the test read (None: read back from report.json)

    @property
    def at_threshold(self) -> bool:
        return self.reason.at_threshold

    def to_json(self) -> dict[str, Any]:
        """report.json's decision, its keys in the order report.json has always written them."""
        head = {k: getattr(self, k) for k in ("task", "expr", "metric", "op", "threshold", "value")}
        verdict = {"decision": self.decision.value, "why": self.reason.sentence, "why_code": self.reason.value}
        tests = {k: getattr(self, k) for k in ("p_value", "p_within", "test", "interval", "level", "mde",
                                                "items_needed")}
        # the kind of evidence, so that a decision read back says how far the data reach as the one built here
        kind = {"evidence": None if self.evidence is None else self.evidence.value}
        if self.across is None:
            return {**head, **verdict, **tests, **kind}
        shown = self.across.to_json()
        return {**head, "shows": shown["shows"], "worst_task": shown["worst_task"],
                **{k: tests[k] for k in ("interval", "level", "items_needed", "p_value", "p_within")},
                **({"p_methods": shown["p_methods"]} if "p_methods" in shown else {}),
                "test": tests["test"], "mde": tests["mde"], **verdict, **kind}

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    __hash__ = None


class Shows(StrEnum):
    """What `overall:acc_drop`'s tests across tasks showed."""

    POOLED = "pooled"  # the pooled drop (the pooled test; clear and undecided read it too)
    SOME_TASK = "some_task"  # that some task dropped beyond the threshold (max-drop or Fisher), the worst named


@dataclass(frozen=True, eq=False)
class Across(_Record):
    """What `overall:acc_drop` showed across tasks: the pooled drop, or that some task dropped (the worst named)."""

    shows: Shows
    worst_task: str | None = None
    p_methods: dict[str, float] | None = None  # the pooled, max-drop and Fisher p-values (absent without a test)

    def to_json(self) -> dict[str, Any]:
        out = {"shows": self.shows, "worst_task": self.worst_task}
        if self.p_methods is not None:
            out["p_methods"] = self.p_methods
        return out


class LeftOutReason(StrEnum):
    """Why a (task, threshold) pair was not decided."""

    CHURN = "churn"  # a flip metric on a task where nothing shows either model above guessing
    UNDEFINED = "undefined"  # the metric is not defined on the task


CHURN_WHY = ("churn: nothing shows either model above guessing, nor flips beyond what guessing makes "
             "(--include-churn counts them)")


@dataclass(frozen=True, eq=False)
class LeftOut(_Record):
    """A (task, threshold) pair the gate did not decide, and why (`why`: the sentence report.json writes)."""

    task: str
    expr: str
    reason: LeftOutReason
    why: str

    @classmethod
    def churn(cls, task: str, expr: str) -> LeftOut:
        return cls(task, expr, LeftOutReason.CHURN, CHURN_WHY)

    @classmethod
    def undefined(cls, task: str, expr: str, metric: str) -> LeftOut:
        return cls(task, expr, LeftOutReason.UNDEFINED, f"{metric} is not defined on this task")

    @property
    def short(self) -> str:
        """The reason in a word where there is one (evaluate's record and progress lines)."""
        return self.reason.value if self.reason is LeftOutReason.CHURN else self.why

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "expr": self.expr, "why": self.why, "why_code": self.reason.value}


@dataclass(frozen=True, eq=False)
class Gate(_Record):
    """`compare --fail-on`'s outcome: every decision, what was left out, and the status (the worst decision; undecided
    when nothing was left to decide)."""

    significance: float | None
    thresholds: list[str]
    decisions: list[ThresholdDecision]
    left_out: list[LeftOut] = field(default_factory=list)
    churn_left_out: list[str] = field(default_factory=list)

    @property
    def status(self) -> Decision:
        kinds = {d.decision for d in self.decisions}
        if Decision.BREACH in kinds:
            return Decision.BREACH
        return Decision.UNDECIDED if Decision.UNDECIDED in kinds or not self.decisions else Decision.CLEAR

    @property
    def outcome(self) -> Outcome:
        return OUTCOMES[self.status]

    @property
    def passed(self) -> bool:
        return self.status is Decision.CLEAR

    def of_kind(self, decision: Decision) -> list[ThresholdDecision]:
        return [d for d in self.decisions if d.decision is decision]

    @property
    def nothing_decided(self) -> str | None:
        if self.decisions:
            return None
        return "no (task, threshold) was left to decide: " + "; ".join(sorted({f"{x.task}: {x.why}"
                                                                                for x in self.left_out}))

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "passed": self.passed, "significance": self.significance,
                "thresholds": list(self.thresholds), "decisions": list(self.decisions),
                "breaches": self.of_kind(Decision.BREACH), "undecided": self.of_kind(Decision.UNDECIDED),
                "left_out": list(self.left_out), "nothing_decided": self.nothing_decided,
                "churn_left_out": list(self.churn_left_out)}

    @classmethod
    def of(cls, gate: Mapping) -> Gate:
        """`gate` typed: as it is, or the mapping report.json holds (read back)."""
        if isinstance(gate, Gate):
            return gate
        return cls(significance=gate["significance"], thresholds=list(gate["thresholds"]),
                   decisions=[decision_of(d) for d in gate["decisions"]],
                   left_out=[_left_out_of(x) for x in gate.get("left_out", [])],
                   churn_left_out=list(gate.get("churn_left_out", [])))


def decision_of(d: Mapping) -> ThresholdDecision:
    """A decision typed: as it is, or a report.json decision read back."""
    if isinstance(d, ThresholdDecision):
        return d
    across = Across(Shows(d["shows"]), d.get("worst_task"), d.get("p_methods")) if "shows" in d else None
    own = {f.name for f in fields(ThresholdDecision)} - {"reason", "across", "decision", "interval", "evidence"}
    interval, evidence = d.get("interval"), d.get("evidence")  # (reports before 0.1.0 name no evidence)
    return ThresholdDecision(**{k: d.get(k) for k in own}, decision=Decision(d["decision"]), reason=Reason.read(d),
                             interval=None if interval is None else tuple(interval), across=across,
                             evidence=None if evidence is None else Evidence(evidence))


def _left_out_of(x: Mapping) -> LeftOut:
    if isinstance(x, LeftOut):
        return x
    if "why_code" in x:
        return LeftOut(x["task"], x["expr"], LeftOutReason(x["why_code"]), x["why"])
    reason = LeftOutReason.CHURN if x["why"] == CHURN_WHY else LeftOutReason.UNDEFINED  # reports before the codes
    return LeftOut(x["task"], x["expr"], reason, x["why"])
