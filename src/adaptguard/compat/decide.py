"""Every decision `compare` states, in one module: per (task, threshold) breach / clear / undecided, per task whether
its flips are churn and whether the data support a regression, and across tasks Kübler et al.'s (2026) verdict. The
rendering (terminal, table, Markdown, page) only reads these decisions, so no sentence can say more than a test did.

A threshold's two one-sided tests — "beyond θ" (a breach) and "within θ" (a clear) — are those of the entry's kind
of evidence (`evidence`: one run, replicates, anytime, group-sequential); the decisions are typed (`verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from .evidence import GroupSequential, as_fraction, evidence_of, p_beyond, relation, replicated, value
from .metric_table import METRICS, Unit, strata
from .stats.anytime import anytime_e_values, anytime_p
from .stats.group_sequential import full_entry, group_estimate, group_looks, look_cells, pool_entry, rate_side
from .stats.metrics import binomial_p
from .verdicts import Across, Decision, Evidence, Reason, Shows, ThresholdDecision, beyond

ACROSS_METHODS = ("pooled", "max_drop", "fisher")


def decide_threshold(name: str, entry: Mapping, t, alpha: float | None) -> ThresholdDecision:
    """One (task, threshold) decided (module docstring): its `decision` and `reason`, `p_value` (of the breach test),
    `p_within` (of the clear test), `interval` and `level` (the decision's), `mde` / `items_needed` (how far the data
    reach, where undecided), `test`. With `alpha` None, raw values compared (no test)."""
    if alpha is not None and (entry.get("sequential") or {}).get("design") == "group":
        return decide_group(name, entry, t, alpha)
    base = {"task": name, "expr": t.expr, "metric": t.metric, "op": t.op, "threshold": t.value,
            "value": value(entry, t.metric)}
    side = relation(entry, t.metric, _exact(t))
    if alpha is None:
        return ThresholdDecision(**base, decision=Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                                 reason=Reason.untested(side, t.op))
    evidence = evidence_of(entry)
    flip = "<" if t.op == ">" else ">"
    p, p_within = evidence.p(t.metric, t.value, t.op), evidence.p(t.metric, t.value, flip)
    decision, reason = _decided(p, p_within, alpha, side, t.op)
    undecided = decision is Decision.UNDECIDED
    return ThresholdDecision(**base, decision=decision, reason=reason, p_value=p, p_within=p_within,
                             test=evidence.test_name(t.metric, t.value), interval=evidence.interval(t.metric, alpha),
                             level=1 - 2 * alpha, mde=evidence.mde(t.metric, alpha),
                             items_needed=evidence.items_needed(t.metric, _exact(t), t.op, alpha) if undecided else None,
                             evidence=evidence.kind)


def _decided(p: float, p_within: float, alpha: float, side: int, op: str) -> tuple[Decision, Reason]:
    """The decision of a threshold's two one-sided tests at α (the breach test first)."""
    if p < alpha:
        return Decision.BREACH, Reason.SUPPORTED
    if p_within < alpha:
        return Decision.CLEAR, Reason.SHOWN_WITHIN
    return Decision.UNDECIDED, Reason.undecided(side, op)


def _exact(t) -> Fraction:
    exact = getattr(t, "exact", None)
    return as_fraction(t.value) if exact is None else exact


# ------------------------------------------------------------------------------------------------- churn
def churn(old_correct: float, new_correct: float, negative_flips: float, n: int, chance: float, guess_rate: float,
          alpha: float) -> dict:
    """Are a multiple-choice task's flips churn (both models possibly guessing), to be left out of the flip metrics?
    Only when nothing shows otherwise: the old model not shown above `chance` (what answering without the ability
    scores: `replicates.chance_rate`), the new model not shown below `guess_rate` (a uniform guess, mean 1/#choices:
    no guessing scores less, so below it the new model avoids the right answers), and the right → wrong flips not
    shown above what two independent guessers make, chance · (1 − guess_rate). One-sided exact binomial tests at
    `alpha`; absence of evidence never hides a flip the data support."""
    p_old = binomial_p(old_correct, n, chance, greater=True)
    p_new = binomial_p(new_correct, n, guess_rate, greater=False)
    p_flips = binomial_p(negative_flips, n, chance * (1 - guess_rate), greater=True)
    return churn_rule(chance, guess_rate, old_correct / n, new_correct / n, (p_old, p_new, p_flips), alpha)


def churn_rule(chance: float, guess_rate: float, old_acc: float, new_acc: float | None,
               p: tuple[float, float, float], alpha: float) -> dict:
    """The churn entry from the three tests' p-values (old above chance, new below a guess, flips beyond guessing):
    churn when none of them rejects at `alpha` (the one rule, for one run and for a group-sequential run)."""
    p_old, p_new, p_flips = p
    return {"chance": chance, "guess_rate": guess_rate, "old_acc": old_acc, "new_acc": new_acc,
            "p_above_chance": p_old, "p_new_below_chance": p_new, "p_flips_beyond_guessing": p_flips,
            "churn": p_old >= alpha and p_new >= alpha and p_flips >= alpha}


def is_churn(entry: Mapping) -> bool:
    return bool((entry.get("churn") or {}).get("churn"))


# -------------------------------------------------------------------------------------- regressions, per task
def regression_p(entry: Mapping) -> float:
    """The per-task test of "a regression" with no threshold given: one run per side, the accuracy drop above 0
    (exact McNemar); with replicates, the excess NFR above 0 (runs and items, and the item-level exact test)."""
    return p_beyond(entry, "excess_nfr" if replicated(entry) else "acc_drop", 0.0, ">")


def flag_regressions(tasks: Mapping[str, Mapping], alpha: float, include_churn: bool) -> dict[str, dict]:
    """Benjamini–Hochberg over the tasks' regression tests (`regression_p`; churn tasks left out unless
    `include_churn`): per tested task, its `regression` = {tested, p, p_bh, flagged}."""
    from .stats.replicates import benjamini_hochberg

    names = [k for k, e in tasks.items() if "replicates" in e and (include_churn or not is_churn(e))]
    ps = [regression_p(tasks[k]) for k in names]
    flagged, adjusted = benjamini_hochberg(ps, alpha)
    return {name: {"tested": "excess_nfr" if replicated(tasks[name]) else "acc_drop", "p": p, "p_bh": p_adj,
                   "flagged": bool(f)} for name, f, p, p_adj in zip(names, flagged, ps, adjusted)}


# ---------------------------------------------------------------------------------------------- across tasks
def pooled_entry(olds, news) -> dict:
    """One entry for the items of several tasks pooled (the tasks' (runs, items) answers side by side), for the
    pooled test across tasks: counts with one run per side, the run-level statistics with replicates."""
    import numpy as np

    from .stats.metrics import flip_metrics
    from .stats.replicates import replicate_flips

    o, n = np.concatenate(olds, 1), np.concatenate(news, 1)
    if len(o) == 1 and len(n) == 1:
        return flip_metrics(o[0], n[0], interval="exact")  # Clopper–Pearson, as every per-task entry of compare
    rep = replicate_flips(o, n)
    return {"n": o.shape[1], "old_acc": rep["old_acc"], "new_acc": rep["new_acc"], "nfr": rep["nfr"],
            "pfr": rep["pfr"], "replicates": rep}


def across_tasks(entries: list[Mapping], pooled: dict, margin: float = 0.0, op: str = ">") -> dict[str, float]:
    """Kübler et al.'s three tests of "the new model is worse by more than `margin`" across K tasks, each a p-value:
    `pooled` (every item of every task in one test), `max_drop` and `fisher` (the tasks' one-sided p-values combined,
    `metrics.combined_drop_p`). A verdict splits α across the three (Bonferroni, α/3 each)."""
    from .stats.metrics import combined_drop_p

    per_task = [p_beyond(e, "acc_drop", margin, op) for e in entries]
    return {"pooled": p_beyond(pooled, "acc_drop", margin, op), **combined_drop_p(per_task)}


def decide_across(name: str, names: list[str], entries: list[Mapping], pooled: dict, t, alpha: float | None
                  ) -> ThresholdDecision:
    """`overall:acc_drop>θ` (or `<θ`) decided across tasks, stating exactly what its test shows: a breach of the
    pooled drop (the pooled test at α/3), or — named as such, with the task — "some task dropped more than θ" (the
    max-drop or Fisher test at α/3; the task is the one with the smallest p); clear when the pooled test shows the
    pooled drop within θ at α and neither other test rejects; else undecided."""
    base = {"task": name, "expr": t.expr, "metric": t.metric, "op": t.op, "threshold": t.value,
            "value": pooled["old_acc"] - pooled["new_acc"]}
    side = relation(pooled, "acc_drop", _exact(t))  # the pooled drop against θ, exactly
    if alpha is None:
        return ThresholdDecision(**base, decision=Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                                 reason=Reason.untested(side, t.op), across=Across(Shows.POOLED))
    if all("sequential" in e for e in entries):
        return _across_sequential(base, names, entries, t, alpha, side)
    split = alpha / len(ACROSS_METHODS)
    towards = across_tasks(entries, pooled, t.value, t.op)
    within = p_beyond(pooled, "acc_drop", t.value, "<" if t.op == ">" else ">")
    per_task = [p_beyond(e, "acc_drop", t.value, t.op) for e in entries]
    worst = min(range(len(entries)), key=per_task.__getitem__)
    tested = {**base, "p_value": min(1.0, len(ACROSS_METHODS) * min(towards.values())), "p_within": within,
              "test": f"pooled, max-drop and Fisher tests, each at α/3 = {split:.3g}"}
    if towards["pooled"] < split:
        return ThresholdDecision(**tested, decision=Decision.BREACH, reason=Reason.SUPPORTED,
                                 across=Across(Shows.POOLED, p_methods=towards))
    if min(towards["max_drop"], towards["fisher"]) < split:
        e = entries[worst]
        return ThresholdDecision(**{**tested, "value": e["old_acc"] - e["new_acc"]}, decision=Decision.BREACH,
                                 reason=Reason.SOME_TASK, across=Across(Shows.SOME_TASK, names[worst], towards))
    if within < alpha:
        return ThresholdDecision(**tested, decision=Decision.CLEAR, reason=Reason.SHOWN_WITHIN,
                                 across=Across(Shows.POOLED, p_methods=towards))
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=Reason.undecided(side, t.op),
                             mde=evidence_of(pooled).mde("acc_drop", alpha), across=Across(Shows.POOLED, p_methods=towards))


def _across_sequential(base: dict, names: list[str], entries: list[Mapping], t, alpha: float, side: int
                       ) -> ThresholdDecision:
    """`overall:acc_drop>θ` evaluated until decided: a breach ("some task dropped more than θ") when the product of
    the tasks' betting e-processes (independent tasks: a product is an e-process) reaches 1/α at some round of looks
    (a stopped task's wealth held); clear when every task's drop is shown below θ at α/K (then so is the pooled
    drop); else undecided."""
    import numpy as np

    towards = [anytime_e_values(e, "acc_drop", t.value, t.op) for e in entries]
    rounds = max(len(w) for w in towards)
    product = [float(np.prod([w[min(r, len(w) - 1)] if w else 1.0 for w in towards])) for r in range(rounds)]
    p = min(1.0, 1 / max(product, default=1.0))
    within = [anytime_p(e, "acc_drop", t.value, "<" if t.op == ">" else ">") for e in entries]
    worst = int(np.argmax([w[-1] if w else 1.0 for w in towards]))
    tested = {**base, "p_value": p, "p_within": min(1.0, len(entries) * max(within)),
              "test": f"anytime-valid betting e-processes, their product across {len(entries)} tasks"}
    if p < alpha:
        e = entries[worst]
        return ThresholdDecision(**{**tested, "value": e["old_acc"] - e["new_acc"]}, decision=Decision.BREACH,
                                 reason=Reason.SOME_TASK, across=Across(Shows.SOME_TASK, names[worst]))
    if max(within) < alpha / len(entries):
        return ThresholdDecision(**tested, decision=Decision.CLEAR, reason=Reason.SHOWN_WITHIN,
                                 across=Across(Shows.POOLED))
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=Reason.undecided(side, t.op),
                             across=Across(Shows.POOLED))


def across_verdict(names: list[str], entries: list[Mapping], pooled: dict, alpha: float) -> dict:
    """With no threshold: does the data support an accuracy drop across the tasks (any of the three tests at α/3)?"""
    p = across_tasks(entries, pooled)
    return {"p": p, "alpha_each": alpha / len(p), "regression": bool(min(p.values()) < alpha / len(p))}


# ---------------------------------------------------------------- group-sequential over the known pool (evaluate)
def _score_side(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, looks: list[dict]):
    """The first early look at which the score test's side crosses its O'Brien–Fleming boundary (ε = α/5 spent),
    and the α spent by then (else the smallest nominal p seen, never below α)."""
    from scipy.stats import norm

    from .stats.group_sequential import EARLY_SHARE, obf_spent, z_boundaries
    from .stats.metrics import tango_z

    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    where = [i for i, x in enumerate(looks) if 0 < x["n"] and (x["n_r"] < m_r or x["n_w"] < m_w)]
    early = [looks[i] for i in where]
    if not early:
        return None, 1.0
    eps = EARLY_SHARE * alpha
    times = tuple(x["n"] / big_n for x in early)
    bounds = z_boundaries(times, eps)
    zs = []
    for x in early:
        if metric == "acc_drop":
            z = float(tango_z(x["b"], x["c"], x["n"], theta))
        else:  # a rate of both strata (new_acc): the binomial score of the items so far
            k, m = METRICS[metric].from_cells(look_cells(x))
            z = (k / m - theta) / math.sqrt(theta * (1 - theta) / m) if 0 < theta < 1 and m else 0.0
        zs.append((z if greater else -z) if math.isfinite(z) else 0.0)
    for j, (z, h) in enumerate(zip(zs, bounds)):
        if z >= h:
            return where[j], obf_spent(times[j], eps)
        if _certain(entry, metric, theta, greater, alpha, early[j]):
            return where[j], alpha
    return None, max(alpha, float(norm.sf(zs[-1])))


def _certain(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, x: dict) -> bool:
    """Deterministic curtailment: whether `compare`'s fixed-n test on all N items rejects on this side whatever the
    items not yet evaluated hold (their least favourable answers: every old-right item left kept, every old-wrong
    one fixed, for a breach of "> θ"). It adds nothing to the size."""
    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    weights = METRICS[metric].cell_weights()
    # each stratum's items left take the new answer that moves the metric least toward this side
    pick = min if greater else max
    kept = pick((True, False), key=lambda new: weights[0 if new else 1][0])  # an old-right item left stays right
    fixed = pick((True, False), key=lambda new: weights[2 if new else 3][0])  # an old-wrong item left turns right
    b = x["b"] + (0 if kept else m_r - x["n_r"])
    c = x["c"] + (m_w - x["n_w"] if fixed else 0)
    worst = pool_entry(big_n, m_r, m_w, b, c)
    v = value(worst, metric)
    if not (v > theta if greater else v < theta):  # not even beyond θ: no test rejects (the exact call skipped)
        return False
    return p_beyond(worst, metric, theta, ">" if greater else "<") < alpha


def group_stop(entry: Mapping, t, alpha: float) -> tuple[Decision, int | None, dict]:
    """Where a group-sequential entry's (task, threshold) stops: (decision, the index of the look that decided it or
    None, the sides' p-values). A side whose early boundary a look crossed decides at the first such look (it stays
    so, whatever later looks add: the run stopped there); else, once the strata the metric needs are done,
    `compare`'s fixed-n decision on all N items (the items left out counting what they must); else undecided."""
    s = entry["sequential"]
    looks = group_looks(entry)
    m_r, m_w = s["strata"]["R"], s["strata"]["W"]
    need = strata(t.metric)
    complete = [i for i, x in enumerate(looks) if all(x["n_" + k.lower()] == (m_r if k == "R" else m_w) for k in need)]
    if not need:
        complete = [None]  # old_acc: the baseline alone decides it
    row = METRICS[t.metric]
    if row.unit is Unit.RATE and not row.from_cells((m_r, 0, m_w, 0))[1]:  # over no item (btc without old-right)
        return Decision.UNDECIDED, None, {"p_value": 1.0, "p_within": 1.0}
    # the looks before the strata were done; none for old_acc (the baseline decides it: the new model's answers, which
    # the looks hold, say nothing about it)
    early = looks if not complete else [] if complete[0] is None else looks[: complete[0]]
    flip = "<" if t.op == ">" else ">"
    side = rate_side if need in ("R", "W") else _score_side
    towards = side(entry, t.metric, float(t.value), t.op == ">", alpha, early) if early else (None, 1.0)
    within = side(entry, t.metric, float(t.value), flip == ">", alpha, early) if early else (None, 1.0)
    ps = {"p_value": towards[1], "p_within": within[1]}
    first = [(j, d) for (j, _), d in ((towards, Decision.BREACH), (within, Decision.CLEAR)) if j is not None]
    if first:
        j, decision = min(first, key=lambda x: (x[0], x[1] is not Decision.BREACH))
        return decision, j, ps
    if complete:
        last = looks[complete[0]] if complete[0] is not None else {"n": 0, "n_r": 0, "n_w": 0, "b": 0, "c": 0}
        full = decide_threshold("", full_entry(entry, last), t, alpha)
        return full.decision, complete[0], {"p_value": full.p_value, "p_within": full.p_within, "full": full}
    return Decision.UNDECIDED, None, ps


def decide_group(name: str, entry: Mapping, t, alpha: float) -> ThresholdDecision:
    """One (task, threshold) of a group-sequential entry (`group_sequential`'s design; where it stops: `group_stop`)."""
    from dataclasses import replace

    s = entry["sequential"]
    big_n = s["items"]
    decision, _, ps = group_stop(entry, t, alpha)
    if "full" in ps:
        full = ps["full"]
        return replace(full, task=name, evidence=Evidence.GROUP,
                       test=f"{full.test} on all {big_n} items, once the items that can change it were done")
    test = GroupSequential(entry).test_name(t.metric)
    v = group_estimate(entry, t.metric)
    side = 0 if v is None else (v > float(t.value)) - (v < float(t.value))
    reason = {Decision.BREACH: Reason.SUPPORTED, Decision.CLEAR: Reason.SHOWN_WITHIN}.get(
        decision, Reason.undecided(side, t.op))
    return ThresholdDecision(task=name, expr=t.expr, metric=t.metric, op=t.op, threshold=t.value, value=v,
                             decision=decision, reason=reason, p_value=ps["p_value"], p_within=ps["p_within"],
                             test=test, evidence=Evidence.GROUP)
