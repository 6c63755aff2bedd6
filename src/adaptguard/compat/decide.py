"""Every decision `compare` states: per (task, threshold) breach / clear / undecided, per task whether its flips are
churn and whether the data support a regression, and across tasks Kübler et al.'s (2026) verdict. The rendering
(terminal, table, Markdown, page) only reads these decisions, so no sentence can say more than a test did.

A threshold is decided by the entry's evidence (`evidence`: one run, replicates, anytime, group-sequential; its
`decide` runs the two one-sided tests — "beyond θ" (a breach) and "within θ" (a clear) — or, for a group-sequential
run, finds where it stopped); the decisions are typed (`verdicts`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .evidence import evidence_of, exact_threshold, p_beyond, relation
from .stats.anytime import anytime_e_values, anytime_p
from .stats.metrics import binomial_p
from .verdicts import Across, Decision, Evidence, Reason, Shows, ThresholdDecision, beyond

ACROSS_METHODS = ("pooled", "max_drop", "fisher")


def decide_threshold(name: str, entry: Mapping, t, alpha: float | None) -> ThresholdDecision:
    """One (task, threshold) decided (module docstring) by the entry's evidence, built once per entry
    (`TaskComparison.evidence`; `OneRun.decide`): its `decision` and `reason`, `p_value` (of the breach test),
    `p_within` (of the clear test), `interval` and `level` (the decision's), `mde` / `items_needed` (how far the data
    reach, where undecided), `test`. With `alpha` None, raw values compared (no test)."""
    return ThresholdDecision(task=name, expr=t.expr, op=t.op, threshold=t.value, **evidence_of(entry).decide(t, alpha))


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
    evidence = evidence_of(entry)
    return evidence.p(_regression_metric(evidence), 0.0, ">")


def _regression_metric(evidence) -> str:
    return "excess_nfr" if evidence.kind is Evidence.REPLICATES else "acc_drop"


def flag_regressions(tasks: Mapping[str, Mapping], alpha: float, include_churn: bool) -> dict[str, dict]:
    """Benjamini–Hochberg over the tasks' regression tests (`regression_p`; churn tasks left out unless
    `include_churn`): per tested task, its `regression` = {tested, p, p_bh, flagged}."""
    from .stats.replicates import benjamini_hochberg

    names = [k for k, e in tasks.items() if "replicates" in e and (include_churn or not is_churn(e))]
    ps = [regression_p(tasks[k]) for k in names]
    flagged, adjusted = benjamini_hochberg(ps, alpha)
    return {name: {"tested": _regression_metric(evidence_of(tasks[name])), "p": p, "p_bh": p_adj,
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
    `paired_drop.combined_drop_p`). A verdict splits α across the three (Bonferroni, α/3 each)."""
    from .stats.paired_drop import combined_drop_p

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
    side = relation(pooled, "acc_drop", exact_threshold(t))  # the pooled drop against θ, exactly
    if alpha is None:
        return ThresholdDecision(**base, decision=Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                                 reason=Reason.untested(side, t.op), across=Across(Shows.POOLED))
    undecided = Reason.undecided(side, t.op)  # the reason if neither side's test decides
    if all(evidence_of(e).kind in (Evidence.ANYTIME, Evidence.GROUP) for e in entries):
        return _across_sequential(base, names, entries, t, alpha, undecided)
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
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=undecided,
                             mde=evidence_of(pooled).mde("acc_drop", alpha), across=Across(Shows.POOLED, p_methods=towards))


def _across_sequential(base: dict, names: list[str], entries: list[Mapping], t, alpha: float, undecided: Reason
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
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=undecided, across=Across(Shows.POOLED))


def across_verdict(names: list[str], entries: list[Mapping], pooled: dict, alpha: float) -> dict:
    """With no threshold: does the data support an accuracy drop across the tasks (any of the three tests at α/3)?"""
    p = across_tasks(entries, pooled)
    return {"p": p, "alpha_each": alpha / len(p), "regression": bool(min(p.values()) < alpha / len(p))}
