"""The kinds of evidence behind a task's entry, as types: `OneRun` (one run per side: exact tests on the item
counts), `Replicates` (replicate runs on a side: tests over runs and items), `Anytime` (evaluated until decided:
e-processes valid at every look) and `GroupSequential` (evaluated over the known pool: group-sequential boundaries).
Each answers the same questions of a metric — the p-value of "beyond θ" (`p`), the interval a decision uses, the
minimum detectable effect, the items a one-run rate would need, the test's name — so `decide` asks them without
knowing which kind it holds. `evidence_of` picks the kind once per entry (`TaskComparison.evidence`).

Each metric has one one-sided test per kind, so the same test says whether a threshold is breached (the data support
"metric > θ") or clear (they support "metric < θ"):

- one run per side: rates of items (`nfr`, `pfr`, `btc`, the accuracies, ...: `metric_table`) by the exact binomial
  test on the item counts; `acc_drop` (= old_acc − new_acc) by the exact McNemar test against 0 and the exact
  unconditional score test against a margin (`paired_drop.paired_drop_p`); sizes ≤ α at every n (docs/compat.md);
- replicate runs on a side: `nfr`, `excess_nfr` (NFR beyond the noise floor of reruns) and `acc_drop` by a t-test on
  the run-level standard error (runs and items, `replicates.replicate_flips`), and never more than the item-level
  exact test on the same items claims (the per-item means over run pairs, counted toward the null): identical reruns
  are one run, not a standard error of 0; other rates have no run-level test.

The interval printed beside a decision is the one it uses: the one-sided bounds at 1 − α each (a two-sided 1 − 2α
interval), so a breach of "> θ" is exactly "the lower bound is above θ", and a clear "the upper bound is below θ".
"""

from __future__ import annotations

from collections.abc import Mapping

from .group import GroupSequential
from .kinds import Anytime, OneRun, Replicates, exact_threshold
from .values import ITEMS_CAP, as_fraction, counts, exact_value, items_needed, rate_bounds, relation, replicated, value

__all__ = ["ITEMS_CAP", "Anytime", "GroupSequential", "OneRun", "Replicates", "as_fraction", "counts", "evidence_of",
           "exact_threshold", "exact_value", "interval", "items_needed", "p_beyond", "rate_bounds", "relation",
           "replicated", "value"]


def evidence_of(entry: Mapping) -> OneRun:
    """The kind of evidence `entry` holds, as its type: the one it carries (`TaskComparison.evidence`, built once per
    entry), else built from its keys — the only place that reads them for the kind."""
    carried = getattr(entry, "evidence", None)
    if carried is not None:
        return carried
    if "sequential" in entry:
        return GroupSequential(entry) if entry["sequential"].get("design") == "group" else Anytime(entry)
    return Replicates(entry) if replicated(entry) else OneRun(entry)


def p_beyond(entry: Mapping, metric: str, threshold: float, op: str) -> float:
    """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<" (`op` "<"),
    by the test of the entry's kind of evidence (module docstring)."""
    return evidence_of(entry).p(metric, threshold, op)


def interval(entry: Mapping, metric: str, alpha: float) -> tuple[float, float] | None:
    """The interval a decision on `metric` uses (module docstring): its lower end above θ is a breach of "> θ", its
    upper end below θ a clear."""
    return evidence_of(entry).interval(metric, alpha)
