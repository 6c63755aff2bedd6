"""Flips measured against the noise (pure maths: numpy and scipy, arrays in, numbers out).

One trained model is one draw: retrain it with another seed, or re-run a sampled evaluation, and some answers flip
with no change of recipe at all. With several runs (replicates) per side, the flips an update makes are measured
against the flips replicates make on their own:

- cross NFR = mean over the (old run i, new run j) pairs and items of 1[old_i right ∧ new_j wrong];
- noise floor = the same rate over ordered pairs of *distinct* runs of one side (i ≠ k), pooled over both sides;
- excess NFR = cross NFR − noise floor: what the update breaks beyond what a rerun breaks.

Its uncertainty counts runs as well as items. Runs and items are crossed (every run answers every item), so the
standard error comes from moments (`crossed_variance`): the items' spread, plus what the runs share across items
(a delete-one-run jackknife, less the run × item churn the items' spread already holds); the interval is
estimate ± t · SE on Satterthwaite's degrees of freedom. A two-level bootstrap (runs, then items) is kept as
`method="bootstrap"`: it counts the churn three times and over-covers (docs/compat.md has both on simulated runs).
With one run per side nothing measures run-to-run variance, and the item-level test (McNemar) is all there is
(`runs_fixed`).

Every sum is linear in the runs: for 0/1 answers Σ_{i≠k} o_i (1 − o_k) = R² ā (1 − ā) over one side's distinct
pairs, since o_i (1 − o_i) = 0 — the cost is O(runs × items), never pairs of runs.
"""

from __future__ import annotations

import math

import numpy as np


def _runs(name: str, values) -> np.ndarray:
    """(R, N) 0/1 indicators as floats; a 1-D array is one run."""
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be (runs, items) with at least one of each, got shape {arr.shape}")
    if arr.dtype != bool and not np.isin(arr, [0, 1]).all():
        raise ValueError(f"{name} must hold booleans or 0/1 values")
    return arr.astype(float)


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile; the normal one when `df` is infinite (runs fixed)."""
    from scipy.stats import norm, t

    return float(norm.ppf(q) if math.isinf(df) else t.ppf(q, df))


def t_sf(x: float, df: float) -> float:
    from scipy.stats import norm, t

    return float(norm.sf(x) if math.isinf(df) else t.sf(x, df))


def t_interval(estimate: float, se: float, df: float, level: float = 0.95) -> tuple[float, float]:
    """estimate ± t_{df, (1+level)/2} · se."""
    half = t_quantile((1 + level) / 2, df) * se
    return (estimate - half, estimate + half)


def min_detectable_effect(se: float, df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true effect a two-sided test at `alpha` (estimate / se against t_{df}) detects with probability
    `power`: solves P(T' > t_{df, 1−α/2}) = power for the noncentral t T' ~ t_{df}(δ / se) (normal when df is
    infinite)."""
    from scipy.optimize import brentq
    from scipy.stats import nct, norm

    if not se > 0:
        return 0.0
    if df > 1e4:  # (or infinite) the normal test, within 1e-4 of t's, where the noncentral t is unstable
        return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * se)
    crit = t_quantile(1 - alpha / 2, df)
    ncp = brentq(lambda d: nct.sf(crit, df, d) - power, 0.0, 100.0 + 10 * crit)
    return float(ncp * se)


def crossed_variance(per_item, deleted: list[np.ndarray]) -> tuple[float, float, dict]:
    """Variance of a mean over items of per-item values that share the same runs (a crossed runs × items design),
    by moments, with Satterthwaite's degrees of freedom over the three terms.

    The items' spread alone (V_items = var(g) / N) misses what runs share across items (a seed that trains better
    moves every item); the delete-one-run jackknife of the mean (V_runs) counts that, but also the run × item churn
    that V_items already holds; the jackknife taken item by item (V_churn) is that churn alone. So
    V = V_items + max(0, V_runs − V_churn) — the unbiased moment estimate for a crossed design (Owen 2007), where a
    bootstrap that draws runs and then items counts the churn three times.

    Args:
        per_item: (N,) the statistic's per-item values with every run.
        deleted: per group of exchangeable runs that has ≥ 2 of them (a side, or the seeds), (K, N): the per-item
            values with run k of that group left out.
    Returns:
        (variance, degrees of freedom, the parts `v_items`, `v_runs`, `v_churn`).
    """
    g = np.asarray(per_item, dtype=float)
    n = len(g)
    v_items = float(g.var(ddof=1) / n) if n > 1 else 0.0
    v_runs = v_churn = 0.0
    df_runs = 0
    for values in deleted:
        k = values.shape[0]
        scale = (k - 1) / k
        v_runs += scale * float(((values.mean(1) - values.mean()) ** 2).sum())
        v_churn += scale * float(((values - values.mean(0)) ** 2).mean(1).sum()) / n
        df_runs += k - 1
    variance = v_items + max(0.0, v_runs - v_churn)
    # Satterthwaite for a sum of mean squares (the churn term's df: runs × items); with the jackknife's few runs in
    # it, the t quantile widens even when the runs' shared part comes out small (measured: false alarms ≤ α)
    terms = v_items ** 2 / max(n - 1, 1)
    if df_runs:
        terms += v_runs ** 2 / df_runs + v_churn ** 2 / (df_runs * max(n - 1, 1))
    # at least 1: with the churn subtracted, Satterthwaite's formula can fall below any of its terms' df
    df = max(1.0, variance ** 2 / terms) if terms > 0 else math.inf
    return variance, float(df), {"v_items": v_items, "v_runs": v_runs, "v_churn": v_churn}


def _excess_per_item(a_o: np.ndarray, r_o, a_n: np.ndarray, r_n) -> dict[str, np.ndarray]:
    """Per-item cross NFR / PFR, pooled noise floor (only where some side has ≥ 2 runs) and accuracy difference,
    from each side's per-item share of right runs a (…, N) over r runs (r may be an array of run weights' sums)."""
    out = {"cross": a_o * (1 - a_n), "cross_pfr": (1 - a_o) * a_n, "acc_diff": a_n - a_o}
    w_o, w_n = r_o * (r_o - 1), r_n * (r_n - 1)  # ordered pairs of distinct runs per side
    if np.any(w_o + w_n):
        # over distinct pairs of one side: Σ_{i≠k} o_i (1 − o_k) = R² ā (1 − ā), as o_i (1 − o_i) = 0
        out["floor"] = (r_o ** 2 * a_o * (1 - a_o) + r_n ** 2 * a_n * (1 - a_n)) / (w_o + w_n)
    return out


def _two_level_bootstrap_se(old: np.ndarray, new: np.ndarray, n_boot: int, seed: int | None) -> float:
    """SE of the excess NFR by the two-level (pigeonhole) bootstrap: each side's runs drawn with replacement, then
    the items. Kept to show in docs/compat.md why it is not the default: it counts run × item churn three times
    (Owen 2007) and over-covers. A run drawn twice makes no pair with itself: the floor's pairs are the distinct
    draws, Σ_{i≠k} c_i c_k o_i (1 − o_k) = A (C − A) over C² − Σ c² pairs (A = Σ c_i o_i, C = Σ c_i)."""
    rng = np.random.default_rng(seed)
    (r_o, n), r_n = old.shape, new.shape[0]
    stats = []
    for _ in range(n_boot):
        co, cn = rng.multinomial(r_o, np.full(r_o, 1 / r_o)), rng.multinomial(r_n, np.full(r_n, 1 / r_n))
        pairs = r_o ** 2 - (co ** 2).sum() + r_n ** 2 - (cn ** 2).sum()
        if pairs == 0:
            continue  # one run drawn per side: no floor in this resample
        items = rng.integers(0, n, n)
        a_o, a_n = co @ old[:, items], cn @ new[:, items]  # weighted right counts
        floor = (a_o * (r_o - a_o) + a_n * (r_n - a_n)) / pairs
        stats.append(float((a_o * (r_n - a_n) / (r_o * r_n) - floor).mean()))
    return float(np.std(stats, ddof=1))


def _difference(interval: tuple[float, float]) -> tuple[float, float]:
    """A t interval of a difference of rates (the excess NFR, NFR − PFR, an accuracy difference) cut to its range,
    [−1, 1]: on a few items and runs, t on ~1 degree of freedom passes it."""
    return max(-1.0, interval[0]), min(1.0, interval[1])


def replicate_flips(old, new, *, level: float = 0.95, power: float = 0.8, method: str = "moments",
                    n_boot: int = 2000, seed: int | None = 0) -> dict:
    """Flips of an update measured against replicate runs of each side.

    Args:
        old: (R_o, N) booleans, whether old run r got item i right (a 1-D array is one run).
        new: (R_n, N) booleans, the same for the new side's runs, on the same items in the same order.
        level: the intervals' level; α = 1 − level for the minimum detectable effect.
        power: the power of the minimum detectable effect.
        method: "moments" (`crossed_variance`, the default) or "bootstrap" (runs, then items, drawn with
            replacement; `n_boot`, `seed`), for the standard error of the tested quantity.
    Returns:
        `runs` [R_o, R_n]; `old_acc`, `new_acc` (means over runs); `nfr`, `pfr` (cross: mean over pairs);
        `pair_nfr` (R_o, R_n); `nfr_per_new_run`, `nfr_per_old_run` and `spread_<side>` (min, max, sd) where a side
        has ≥ 3 runs; `noise_floor` (None with one run per side); `excess_nfr`, `excess_pfr`; `tested`:
        "excess_nfr", or "nfr_minus_pfr" with one run per side (`runs_fixed`: run-to-run variance not measured,
        items only); its `estimate`, `se`, `df`, `ci`, `p_value` (one-sided, > 0) and `mde` (two-sided at
        α = 1 − level); `acc_diff`, `acc_diff_ci`; `variance_parts`.
    """
    old, new = _runs("old", old), _runs("new", new)
    if old.shape[1] != new.shape[1]:
        raise ValueError(f"old has {old.shape[1]} items per run but new has {new.shape[1]}")
    if method not in ("moments", "bootstrap"):
        raise ValueError(f"method must be 'moments' or 'bootstrap', got {method!r}")
    (r_o, n), r_n = old.shape, new.shape[0]
    a_o, a_n = old.mean(0), new.mean(0)
    parts = _excess_per_item(a_o, r_o, a_n, r_n)
    floor = parts.get("floor")
    runs_fixed = floor is None
    # the tested quantity: excess NFR where a floor exists; with one run per side, the net flips NFR − PFR (what
    # McNemar tests), as nothing else separates a regression from churn
    tested = parts["cross"] - (parts["cross_pfr"] if runs_fixed else floor)

    def deleted(key: str) -> list[np.ndarray]:
        """Per side with ≥ 2 runs: (R, N) per-item values of `key` ("cross", "acc_diff", or "excess" = cross − floor)
        with each run of that side left out; for "excess", a side whose deletions leave no floor is skipped."""
        groups = []
        for runs, mean, size in ((old, a_o, r_o), (new, a_n, r_n)):
            if size < 2:
                continue
            left_out = (size * mean - runs) / (size - 1)  # (R, N): the side's share of right runs without run k
            p = _excess_per_item(left_out, r_o - 1, a_n, r_n) if runs is old else \
                _excess_per_item(a_o, r_o, left_out, r_n - 1)
            if key != "excess":
                groups.append(p[key])
            elif "floor" in p:
                groups.append(p["cross"] - p["floor"])
        return groups

    groups = [] if runs_fixed else deleted("excess")
    var, df, var_parts = crossed_variance(tested, groups)
    nfr_var, nfr_df, _ = crossed_variance(parts["cross"], deleted("cross"))
    acc_var, acc_df, _ = crossed_variance(parts["acc_diff"], deleted("acc_diff"))
    se, acc_se = math.sqrt(var), math.sqrt(acc_var)
    if method == "bootstrap" and not runs_fixed:
        se = _two_level_bootstrap_se(old, new, n_boot, seed)
    estimate = float(tested.mean())
    if runs_fixed:  # exact one-sided McNemar: more right → wrong than wrong → right
        n_neg, n_pos = int(round(parts["cross"].sum())), int(round(parts["cross_pfr"].sum()))
        p_value = above_chance_p(n_neg, n_neg + n_pos, 0.5)
    else:
        p_value = t_sf(estimate / se, df) if se > 0 else (0.0 if estimate > 0 else 1.0)
    pair_nfr = old @ (1 - new).T / n
    out = {
        "runs": [r_o, r_n], "n": n, "old_acc": float(old.mean()), "new_acc": float(new.mean()),
        "nfr": float(parts["cross"].mean()), "pfr": float(parts["cross_pfr"].mean()), "pair_nfr": pair_nfr.tolist(),
        "nfr_per_new_run": pair_nfr.mean(0).tolist(), "nfr_per_old_run": pair_nfr.mean(1).tolist(),
        "noise_floor": None if runs_fixed else float(floor.mean()),
        "excess_nfr": None if runs_fixed else estimate,
        "excess_pfr": None if runs_fixed else float((parts["cross_pfr"] - floor).mean()),
        "tested": "nfr_minus_pfr" if runs_fixed else "excess_nfr", "estimate": estimate,
        "se": se, "df": df, "ci": _difference(t_interval(estimate, se, df, level)),
        "p_value": p_value, "mde": min_detectable_effect(se, df, 1 - level, power),
        "nfr_se": math.sqrt(nfr_var), "nfr_df": nfr_df,
        # a rate: the t interval cut to [0, 1]
        "nfr_ci": tuple(min(max(x, 0.0), 1.0) for x in t_interval(float(parts["cross"].mean()), math.sqrt(nfr_var),
                                                                  nfr_df, level)),
        "acc_diff": float(parts["acc_diff"].mean()), "acc_diff_se": acc_se, "acc_diff_df": acc_df,
        "acc_diff_ci": _difference(t_interval(float(parts["acc_diff"].mean()), acc_se, acc_df, level)),
        "acc_diff_mde": min_detectable_effect(acc_se, acc_df, 1 - level, power),
        "runs_fixed": runs_fixed, "run_level": bool(groups), "level": level, "method": method,
        "variance_parts": var_parts,
    }
    for side, values in (("new", out["nfr_per_new_run"]), ("old", out["nfr_per_old_run"])):
        if len(values) >= 3:
            out[f"spread_{side}"] = {"min": min(values), "max": max(values), "sd": float(np.std(values, ddof=1))}
    return out


def items_beyond_noise(old, new, *, q: float = 0.05) -> dict:
    """Which items did the update break beyond what reruns break? Per item, the runs of each side form a 2×2 table
    (right / wrong × old / new); an item broke beyond rerun noise when its old runs are right more often than its new
    runs by more than chance allows: Boschloo's exact one-sided test on that table (uniformly more powerful than
    Fisher's; scipy's `boschloo_exact`), then Benjamini–Hochberg at `q` over the items (the false discovery rate).

    Args:
        old: (R_o, N) 0/1, whether old run r got item i right; new: (R_n, N) the same for the new runs.
        q: the false discovery rate of the flagged items.
    Returns:
        `pairs` = R_o · R_n; per item (N,) lists: `broke_pairs`, in how many (old run, new run) pairs the item went
        right → wrong (= old right count × new wrong count); `rerun_flip_rate`, how often it flips between two
        distinct reruns of one side (pooled over the sides, as the noise floor; None with one run per side);
        `p`, `p_bh`, `flagged`; and `min_p`, the smallest p any item can reach with these run counts (old always
        right, new always wrong): BH flags nothing unless some p ≤ q / N, so `min_p` > q / N says the runs are too
        few for any single item to be named.
    """
    from scipy.stats import boschloo_exact

    old, new = _runs("old", old), _runs("new", new)
    if old.shape[1] != new.shape[1]:
        raise ValueError(f"old has {old.shape[1]} items per run but new has {new.shape[1]}")
    (r_o, n), r_n = old.shape, new.shape[0]
    right_o, right_n = old.sum(0).round().astype(int), new.sum(0).round().astype(int)
    cache: dict[tuple[int, int], float] = {}

    def p_of(a: int, b: int) -> float:  # the table's columns are the two samples (scipy's orientation)
        if (a, b) not in cache:
            cache[a, b] = 1.0 if a * r_n <= b * r_o else float(
                boschloo_exact([[a, b], [r_o - a, r_n - b]], alternative="greater").pvalue)
        return cache[a, b]

    p = np.array([p_of(a, b) for a, b in zip(right_o, right_n)])
    flagged, adjusted = benjamini_hochberg(p, q)
    within = r_o * (r_o - 1) + r_n * (r_n - 1)
    floor = ((right_o * (r_o - right_o) + right_n * (r_n - right_n)) / within).tolist() if within else [None] * n
    return {"pairs": r_o * r_n, "broke_pairs": (right_o * (r_n - right_n)).tolist(), "rerun_flip_rate": floor,
            "p": p.tolist(), "p_bh": adjusted, "flagged": flagged, "min_p": p_of(r_o, 0), "q": q}


def paired_runs_difference(a, b, *, level: float = 0.95, power: float = 0.8, method: str = "moments",
                           n_boot: int = 10_000, seed: int | None = 0) -> dict:
    """Two arms run with the same seeds on the same items (seed s of A and of B share the data order), compared
    at run level: x_{s,i} = a_{s,i} − b_{s,i}, a crossed seeds × items design.

    Args:
        a, b: (S, N) 0/1 indicators (e.g. each arm's negative flips against v1, one row per seed).
        method: "moments" (`crossed_variance`, Satterthwaite's df) or "bootstrap" (the two-level paired bootstrap:
            S seeds with replacement, a seed's A and B together, then N items; SE = the resamples' sd, df = S − 1;
            `n_boot`, `seed`) — E5's registered form, more conservative.
    Returns:
        `diff` = mean of x; `se`, `df` (infinite with one seed: items only, `runs_fixed`); `ci` = diff ± t_{df} · se
        at `level`; `p_value` two-sided; `mde` at α = 1 − level; `per_seed` diffs.
    """
    a, b = _runs("a", a), _runs("b", b)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same (seeds, items) shape, got {a.shape} and {b.shape}")
    if method not in ("moments", "bootstrap"):
        raise ValueError(f"method must be 'moments' or 'bootstrap', got {method!r}")
    x = a - b
    s, n = x.shape
    left_out = [np.array([np.delete(x, k, 0).mean(0) for k in range(s)])] if s > 1 else []
    var, df, parts = crossed_variance(x.mean(0), left_out)
    se, diff = math.sqrt(var), float(x.mean())
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        stats = []
        for start in range(0, n_boot, 500):
            k = min(500, n_boot - start)
            seeds = rng.multinomial(s, np.full(s, 1 / s), size=k) if s > 1 else np.ones((k, 1))
            items = rng.multinomial(n, np.full(n, 1 / n), size=k)
            stats.append(((seeds @ x) * items).sum(1) / (s * n))
        se, df = float(np.concatenate(stats).std(ddof=1)), float(s - 1) if s > 1 else math.inf
    return {"diff": diff, "se": se, "df": df, "ci": t_interval(diff, se, df, level),
            "p_value": min(1.0, 2 * t_sf(abs(diff) / se, df)) if se > 0 else (1.0 if diff == 0 else 0.0),
            "mde": min_detectable_effect(se, df, 1 - level, power), "per_seed": x.mean(1).tolist(),
            "runs_fixed": s == 1, "level": level, "variance_parts": parts}


def chance_rate(n_choices, gold) -> float:
    """The accuracy a model reaches without the ability: max(mean over items of 1/#choices, the share of the most
    common gold answer) — the second is what always giving the majority label scores on unbalanced labels.

    Args:
        n_choices: (N,) the number of choices of each item.
        gold: (N,) the gold answers (any hashable values: an index or the answer's text).
    """
    k = np.asarray(n_choices, dtype=float)
    if k.ndim != 1 or len(k) == 0 or (k < 1).any():
        raise ValueError("n_choices must be a non-empty list of counts ≥ 1")
    if len(gold) != len(k):
        raise ValueError(f"gold has {len(gold)} items but n_choices has {len(k)}")
    _, counts = np.unique(np.asarray([str(g) for g in gold]), return_counts=True)
    return float(max((1 / k).mean(), counts.max() / len(k)))


def above_chance_p(n_correct: int, n: int, chance: float) -> float:
    """One-sided exact binomial test of H0 "accuracy ≤ chance": small p = the model is above chance."""
    from scipy.stats import binomtest

    if n == 0:
        return 1.0
    return float(binomtest(int(n_correct), int(n), min(max(chance, 0.0), 1.0), alternative="greater").pvalue)


def benjamini_hochberg(p_values, q: float = 0.05) -> tuple[list[bool], list[float]]:
    """(rejected, BH-adjusted p-values) over a family of tests (scipy's `false_discovery_control`)."""
    from scipy.stats import false_discovery_control

    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return [], []
    adjusted = false_discovery_control(p, method="bh")
    return (adjusted <= q).tolist(), adjusted.tolist()


