"""Every metric `compare` reports and the gate can decide, one row each: its unit, which way is worse, whether churn
leaves it out, how it is computed from the paired answers, the kinds of evidence with a test of it, and where the
table shows it. The gate, the decisions, the report, the lm-eval callback and tasks, and `evaluate` read this table: a
new metric is one row.

A metric of the paired answers (`per_item`) is a function of whether each model got each item right, so a row alone
says everything the readers need: its value on one run and on each pair of replicate runs (`value_of`), its counts
from the four cells of (old right, new right) (`from_cells`: the group design's looks and fixed-n entries), and the
strata of the known pool that can change it (`can_flip`: where its value depends on the new answer).
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


def _old_right(e: Mapping) -> int:
    return round(e["old_acc"] * e["n"])


CELLS = ((True, True), (True, False), (False, True), (False, False))  # (old right, new right)


def cells_of(old_correct, new_correct) -> tuple[int, int, int, int]:
    """The number of items in each of `CELLS` from paired answers (N,) bool."""
    import numpy as np

    old, new = np.asarray(old_correct, bool), np.asarray(new_correct, bool)
    return tuple(int(((old == o) & (new == w)).sum()) for o, w in CELLS)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: Unit
    higher_is_worse: bool  # which way is a regression (lm-eval's higher_is_better is its negation)
    about_flips: bool = False  # it measures which answers flipped: on a churn task it measures guessing, left out
    tests: frozenset[Evidence] = frozenset()  # the kinds of evidence with a one-sided test of it (`evidence`)
    # the item's value from whether the old and the new model got it right, (N,) bool arrays → (N,): a rate's 0/1
    # indicator (nfr: old right and new wrong), or a difference's −1/0/1; None: not a function of the paired answers
    per_item: Callable | None = None
    # the items a rate is over, from the old answers alone (N,) → (N,) bool (btc: the old-right ones); None: all
    over: Callable | None = None
    # a rate's (successes, trials) in one run's entry where they are not its value times n (btc: over the old-right)
    counts: Callable[[Mapping], tuple[float, int]] | None = None
    column: str | None = None  # the report table's column that shows it

    def __post_init__(self):
        # evaluate's designs count a metric from the answers at each look: a row claiming them must say how
        if self.tests & {ANYTIME, GROUP} and (self.per_item is None or self.unit is Unit.SCORE):
            raise ValueError(f"metric {self.name!r}: an anytime or group-sequential test needs a rate or a difference "
                             "of the paired answers (per_item)")
        # a rate's tests follow from its counts; a difference's are its own (McNemar and Tango for the accuracy drop,
        # the run-level test for the excess NFR): another needs its case in compat/evidence
        if self.unit is Unit.DIFFERENCE and self.tests and self.name not in ("acc_drop", "excess_nfr"):
            raise ValueError(f"metric {self.name!r}: the tests of a difference are acc_drop's and excess_nfr's; "
                             "another difference needs its own case in compat/evidence")

    @property
    def can_flip(self) -> str | None:
        """The strata of the known pool whose new answers can change it: "R" (old-right items), "W" (old-wrong), "RW"
        or "" (the baseline alone decides it); None where it is not a function of the paired answers (`evaluate`
        cannot run it)."""
        if self.per_item is None:
            return None
        w = self.cell_weights()  # a stratum can change it where its two cells (new right, new wrong) differ
        return "R" * (w[0] != w[1]) + "W" * (w[2] != w[3])

    def cell_weights(self) -> list[tuple[float, bool]]:
        """(the item's value, whether the metric is over it) in each of `CELLS`."""
        import numpy as np

        old, new = (np.array(x) for x in zip(*CELLS))
        over = np.ones(4, bool) if self.over is None else np.asarray(self.over(old), bool)
        return [(float(v), bool(o)) for v, o in zip(np.asarray(self.per_item(old, new)), over)]

    def from_cells(self, cells) -> tuple[float, float]:
        """(Σ of the items' values, number of items it is over) from the counts of items in each of `CELLS`."""
        weights = self.cell_weights()
        return (sum(k * v for k, (v, o) in zip(cells, weights) if o), sum(k for k, (_, o) in zip(cells, weights) if o))

    def value_of(self, old_correct, new_correct) -> float | None:
        """Its value on paired answers (N,) (None where it is over no item): one run, or one pair of replicate runs."""
        k, m = self.from_cells(cells_of(old_correct, new_correct))
        return k / m if m else None

    def count(self, entry: Mapping) -> tuple[float, int]:
        """A rate's (successes, trials) in one run's entry: its declared counts, else its value times n."""
        if self.counts is not None:
            return self.counts(entry)
        return round(entry[self.name] * entry["n"]), entry["n"]

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
    Metric("nfr", Unit.RATE, True, about_flips=True, tests=_EVALUATED | {REPLICATES},
           per_item=lambda old, new: old & ~new, counts=lambda e: (e["n_negative_flips"], e["n"]), column="NFR %"),
    Metric("pfr", Unit.RATE, False, about_flips=True, tests=_EVALUATED,
           per_item=lambda old, new: ~old & new, counts=lambda e: (e["n_positive_flips"], e["n"]), column="PFR %"),
    # btc: over the items the old model got right; both right = old right − negative flips
    Metric("btc", Unit.RATE, False, about_flips=True, tests=_EVALUATED, per_item=lambda old, new: old & new,
           over=lambda old: old, counts=lambda e: (_old_right(e) - e["n_negative_flips"], _old_right(e)),
           column="BTC %"),
    Metric("inconsistency_flips", Unit.RATE, True, about_flips=True, tests=_RATE_TESTS, column="incons. %"),
    Metric("old_acc", Unit.RATE, False, tests=_EVALUATED, per_item=lambda old, new: old, column="acc old → new"),
    Metric("new_acc", Unit.RATE, False, tests=_EVALUATED, per_item=lambda old, new: new, column="acc old → new"),
    Metric("smooth_nfr", Unit.RATE, True, about_flips=True, tests=_RATE_TESTS, column="smooth NFR %"),
    Metric("smooth_pfr", Unit.RATE, False, about_flips=True, tests=_RATE_TESTS, column="smooth PFR %"),
    Metric("acc_drop", Unit.DIFFERENCE, True, tests=_EVALUATED | {REPLICATES},
           per_item=lambda old, new: old.astype(int) - new.astype(int), column="acc old → new"),
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
