"""Every metric `compare` reports and the gate can decide, one row each: its unit, which way is worse, whether churn
leaves it out, which items can flip it, the kinds of evidence with a test of it, and where the table shows it. The
gate, the decisions, the report, the lm-eval callback and tasks, and `evaluate` read this table: a new metric is one
row (plus, for a rate, where its counts come from).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from .verdicts import Evidence


class Unit(StrEnum):
    RATE = "rate"  # a share of items, in [0, 1]; thresholds as fractions or %
    DIFFERENCE = "difference"  # a difference of rates, in [−1, 1]; thresholds as fractions or %
    SCORE = "score"  # anything else (a mean similarity change, a relative change in %)


ONE_RUN, REPLICATES, ANYTIME, GROUP = Evidence.ONE_RUN, Evidence.REPLICATES, Evidence.ANYTIME, Evidence.GROUP


def _share(name: str) -> Callable[[Mapping], tuple[float, int]]:
    """(successes, trials) of a rate over every item: its value times n."""
    return lambda e: (round(e[name] * e["n"]), e["n"])


def _old_right(e: Mapping) -> int:
    return round(e["old_acc"] * e["n"])


@dataclass(frozen=True)
class Metric:
    name: str
    unit: Unit
    higher_is_worse: bool  # which way is a regression (lm-eval's higher_is_better is its negation)
    about_flips: bool = False  # it measures which answers flipped: on a churn task it measures guessing, left out
    can_flip: str | None = None  # which items can change it ("R" old-right, "W" old-wrong); None: evaluate lacks it
    tests: frozenset[Evidence] = frozenset()  # the kinds of evidence with a one-sided test of it (`evidence`)
    counts: Callable[[Mapping], tuple[float, int]] | None = None  # a rate's (successes, trials) in one run's entry
    column: str | None = None  # the report table's column that shows it

    @property
    def counted(self) -> bool:
        """Its value is a ratio of whole counts of items, compared with a threshold exactly (`evidence.relation`)."""
        return self.unit is Unit.RATE or REPLICATES in self.tests

    @property
    def in_rate_units(self) -> bool:
        return self.unit is not Unit.SCORE

    @property
    def low(self) -> float:
        """The lowest value it can take (a rate: 0; a difference of rates: −1)."""
        return 0.0 if self.unit is Unit.RATE else -1.0


_RATE_TESTS = frozenset({ONE_RUN})
_EVALUATED = frozenset({ONE_RUN, ANYTIME, GROUP})
_ROWS = [
    Metric("nfr", Unit.RATE, True, about_flips=True, can_flip="R", tests=_EVALUATED | {REPLICATES},
           counts=lambda e: (e["n_negative_flips"], e["n"]), column="NFR %"),
    Metric("pfr", Unit.RATE, False, about_flips=True, can_flip="W", tests=_EVALUATED,
           counts=lambda e: (e["n_positive_flips"], e["n"]), column="PFR %"),
    # btc: over the items the old model got right; both right = old right − negative flips
    Metric("btc", Unit.RATE, False, about_flips=True, can_flip="R", tests=_EVALUATED,
           counts=lambda e: (_old_right(e) - e["n_negative_flips"], _old_right(e)), column="BTC %"),
    Metric("inconsistency_flips", Unit.RATE, True, about_flips=True, tests=_RATE_TESTS,
           counts=_share("inconsistency_flips"), column="incons. %"),
    Metric("old_acc", Unit.RATE, False, can_flip="", tests=_EVALUATED, counts=_share("old_acc"),
           column="acc old → new"),
    Metric("new_acc", Unit.RATE, False, can_flip="RW", tests=_EVALUATED, counts=_share("new_acc"),
           column="acc old → new"),
    Metric("smooth_nfr", Unit.RATE, True, about_flips=True, tests=_RATE_TESTS, counts=_share("smooth_nfr"),
           column="smooth NFR %"),
    Metric("smooth_pfr", Unit.RATE, False, about_flips=True, tests=_RATE_TESTS, counts=_share("smooth_pfr"),
           column="smooth PFR %"),
    Metric("acc_drop", Unit.DIFFERENCE, True, can_flip="RW", tests=_EVALUATED | {REPLICATES},
           column="acc old → new"),
    Metric("excess_nfr", Unit.DIFFERENCE, True, about_flips=True, tests=frozenset({REPLICATES}),
           column="excess NFR %"),
    Metric("m_g", Unit.SCORE, False, column="m_g"),
    Metric("m_r", Unit.SCORE, True, column="m_r"),
    Metric("mean_delta", Unit.SCORE, False),
]
# the Δ-metrics against a --compatible run (`metrics.DELTA_KEYS`): the change, and the change in % of the old value
_DELTAS = {"nfr": True, "pfr": False, "inconsistency_flips": True, "smooth_nfr": True, "smooth_pfr": False,
           "m_g": False, "m_r": True}
_ROWS += [Metric(f"delta_{k}{pct}", Unit.SCORE if pct else Unit.DIFFERENCE, worse, column="ΔNFR_c")
          for k, worse in _DELTAS.items() for pct in ("", "_pct")]

METRICS: dict[str, Metric] = {m.name: m for m in _ROWS}


def names(keep: Callable[[Metric], bool] = lambda m: True) -> tuple[str, ...]:
    """The metrics' names that `keep` keeps, in the table's order (read at call time: a row added is seen)."""
    return tuple(m.name for m in METRICS.values() if keep(m))


def strata(name: str) -> str:
    """The strata of the known pool a metric needs evaluated: "R" (old-right items), "W" (old-wrong), "RW" or ""."""
    m = METRICS.get(name)
    return "RW" if m is None or m.can_flip is None else m.can_flip


def is_rate(name: str) -> bool:
    """A share of items, tested on its counts for one run (nfr, pfr, btc, the accuracies, ...)."""
    m = METRICS.get(name)
    return m is not None and m.unit is Unit.RATE


def in_rate_units(name: str) -> bool:
    m = METRICS.get(name)
    return m is not None and m.in_rate_units


def about_flips(name: str) -> bool:
    m = METRICS.get(name)
    return m is not None and m.about_flips


def tested(name: str, evidence: Evidence) -> bool:
    """Has `name` a one-sided test on this kind of evidence?"""
    m = METRICS.get(name)
    return m is not None and evidence in m.tests
