"""The group-sequential evidence of a run evaluated over the known pool (`adaptguard evaluate --design group`, the
design in `stats.group_sequential`): where each threshold stops (`GroupSequential.stop`) and its decision there."""

from __future__ import annotations

import math

from ..metric_table import METRICS, Unit, strata
from ..stats.group_sequential import full_entry, group_estimate, group_looks, look_cells, pool_entry, rate_side
from ..verdicts import Decision, Evidence, Reason
from .kinds import OneRun
from .values import ITEMS_CAP, value


class GroupSequential(OneRun):
    """Evaluated over the known pool (`group_sequential`): its thresholds are decided where the run stopped (`stop`);
    outside them (the regression flag, the tests across tasks) the fixed-n test on all N items once the strata the
    metric needs are done, else no claim (p = 1)."""

    kind = Evidence.GROUP

    def p(self, metric: str, threshold: float, op: str) -> float:
        s = self.entry["sequential"]
        looks = group_looks(self.entry)
        if not looks:
            return 1.0
        last = looks[-1]
        if any(last["n_" + x.lower()] < s["strata"][x] for x in strata(metric)):
            return 1.0
        return OneRun(full_entry(self.entry, last)).p(metric, threshold, op)

    def interval(self, metric: str, alpha: float) -> None:
        return None

    def mde(self, metric: str, alpha: float, power: float = 0.8) -> None:
        return None

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> None:
        return None

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        s = self.entry["sequential"]
        kind = ("exact binomial boundaries" if strata(metric) in ("R", "W") else
                "score boundaries, O'Brien–Fleming α/5")
        k = len(s["looks"])
        return (f"group-sequential over the {s['items']} items ({kind} at {k} {'look' if k == 1 else 'looks'}; at the "
                "last, compare's fixed-n test)")

    def decide(self, t, alpha: float | None) -> dict:
        """`t` decided where the run stopped (`stop`): at an early look by the design's boundaries, or by `compare`'s
        fixed-n decision on all N items once the strata it needs are done. With `alpha` None, the raw values."""
        if alpha is None:
            return super().decide(t, None)
        decision, _, ps = self.stop(t, alpha)
        if "full" in ps:
            full = ps["full"]
            return {**full, "evidence": Evidence.GROUP, "test": f"{full['test']} on all {self.entry['sequential']['items']}"
                    " items, once the items that can change it were done"}
        v = group_estimate(self.entry, t.metric)
        side = 0 if v is None else (v > float(t.value)) - (v < float(t.value))
        reason = {Decision.BREACH: Reason.SUPPORTED, Decision.CLEAR: Reason.SHOWN_WITHIN}.get(
            decision, Reason.undecided(side, t.op))
        return {"metric": t.metric, "value": v, "decision": decision, "reason": reason, "p_value": ps["p_value"],
                "p_within": ps["p_within"], "test": self.test_name(t.metric), "evidence": Evidence.GROUP}

    def stop(self, t, alpha: float) -> tuple[Decision, int | None, dict]:
        """Where the (task, threshold) stops: (decision, the index of the look that decided it or None, the sides'
        p-values). A side whose early boundary a look crossed decides at the first such look (it stays so, whatever
        later looks add: the run stopped there); else, once the strata the metric needs are done, `compare`'s fixed-n
        decision on all N items (the items left out counting what they must); else undecided."""
        s = self.entry["sequential"]
        looks = group_looks(self.entry)
        m_r, m_w = s["strata"]["R"], s["strata"]["W"]
        need = strata(t.metric)
        complete = [i for i, x in enumerate(looks)
                    if all(x["n_" + k.lower()] == (m_r if k == "R" else m_w) for k in need)]
        if not need:
            complete = [None]  # old_acc: the baseline alone decides it
        row = METRICS[t.metric]
        if row.unit is Unit.RATE and not row.from_cells((m_r, 0, m_w, 0))[1]:  # over no item (btc, no old-right)
            return Decision.UNDECIDED, None, {"p_value": 1.0, "p_within": 1.0}
        # the looks before the strata were done; none for old_acc (the baseline decides it: the new model's answers,
        # which the looks hold, say nothing about it)
        early = looks if not complete else [] if complete[0] is None else looks[: complete[0]]
        side = rate_side if need in ("R", "W") else self._score_side
        sides = [side(self.entry, t.metric, float(t.value), greater, alpha, early) if early else (None, 1.0)
                 for greater in (t.op == ">", t.op != ">")]
        ps = {"p_value": sides[0][1], "p_within": sides[1][1]}
        first = [(j, d) for (j, _), d in zip(sides, (Decision.BREACH, Decision.CLEAR)) if j is not None]
        if first:
            j, decision = min(first, key=lambda x: (x[0], x[1] is not Decision.BREACH))
            return decision, j, ps
        if complete:
            last = looks[complete[0]] if complete[0] is not None else {"n": 0, "n_r": 0, "n_w": 0, "b": 0, "c": 0}
            full = OneRun(full_entry(self.entry, last)).decide(t, alpha)
            return full["decision"], complete[0], {"p_value": full["p_value"], "p_within": full["p_within"],
                                                   "full": full}
        return Decision.UNDECIDED, None, ps

    @staticmethod
    def _score_side(entry, metric: str, theta: float, greater: bool, alpha: float, looks: list[dict]):
        """The first early look at which the score test's side crosses its O'Brien–Fleming boundary (ε = α/5 spent),
        and the α spent by then (else the smallest nominal p seen, never below α)."""
        from scipy.stats import norm

        from ..stats.group_sequential import EARLY_SHARE, obf_spent, z_boundaries
        from ..stats.paired_drop import tango_z

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


def _certain(entry, metric: str, theta: float, greater: bool, alpha: float, x: dict) -> bool:
    """Deterministic curtailment: whether `compare`'s fixed-n test on all N items rejects on this side whatever the
    items not yet evaluated hold (their least favourable answers, per stratum the new answer that moves the metric
    least toward this side: for a breach of `acc_drop > θ` every old-right item left kept and every old-wrong one
    fixed, for `new_acc > θ` the opposite). It adds nothing to the size."""
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
    return OneRun(worst).p(metric, theta, ">" if greater else "<") < alpha
