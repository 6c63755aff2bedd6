"""The gate's decision rules at the null boundary, by exact enumeration (the tables in docs/compat.md, issue 73):
for each rule, the largest rate of a breach and of a clear over n when the truth sits exactly on the threshold (the
size: at most α for a valid test), and the power at a few true values.

- binomial threshold (`nfr>θ` and every rate of one run): K ~ Binomial(n, θ), every k enumerated;
- McNemar (`acc_drop>0`) and the margin test (`acc_drop>Δ`): the (right → wrong, wrong → right) counts of n items
  are trinomial; every table enumerated, the nuisance rate swept on a grid finer than (and offset from) the one the
  test maximises over; Tango's normal approximation beside it, for comparison;
- replicate runs (`nfr>θ` over 2 + 2 runs): the rule rejects only when its item-level exact test does, whose size is
  enumerated over the distribution of the summed per-item means (a convolution), for deterministic reruns and for
  reruns that draw each run anew;
- `overall:acc_drop>Δ` on two tasks: every pair of tables, a breach when the pooled, max-drop or Fisher test rejects
  at α/3, with every task on the boundary.

    python studies/gate_sizes.py --out studies/results/gate_sizes.json   # about 2 min on one core
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.special import gammaln
from scipy.stats import binom, chi2, norm

from adaptguard.compat.stats.metrics import binomial_p
from adaptguard.compat.stats.paired_drop import tango_z

ALPHA = 0.05


# ---------------------------------------------------------------------------------------- binomial threshold
def binomial_rates(n: int, theta: float, truth: float, alpha: float = ALPHA) -> tuple[float, float]:
    """(P(breach), P(clear)) of `rate > θ` on n items when the true rate is `truth`."""
    k = np.arange(n + 1)
    pmf = binom.pmf(k, n, truth)
    breach = np.array([binomial_p(x, n, theta, True) < alpha for x in k])
    clear = np.array([binomial_p(x, n, theta, False) < alpha for x in k])
    return float(pmf @ breach), float(pmf @ clear)


# ------------------------------------------------------------------------------- paired accuracy drop (n items)
def tables(n: int) -> np.ndarray:
    """Every (b, c) with b + c ≤ n: (T, 2)."""
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    return np.stack([b[keep], c[keep]], 1)


def trinomial_pmf(t: np.ndarray, n: int, p_b: float, p_c: float) -> np.ndarray:
    b, c = t[:, 0], t[:, 1]
    m = n - b - c
    with np.errstate(divide="ignore"):
        logs = [np.where(x > 0, x * np.log(max(p, 1e-300)), 0.0) for x, p in ((b, p_b), (c, p_c), (m, 1 - p_b - p_c))]
    return np.exp(gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(m + 1) + sum(logs))


def margin_p_all(t: np.ndarray, n: int, margin: float, greater: bool, grid: int = 201) -> np.ndarray:
    """Every table's exact unconditional p-value against `margin` (the test's sup over the nuisance rate taken on
    the test's own grid only: at most the p it reports after refining, so the sizes below bound the test's)."""
    from scipy.stats import binomtest

    if margin == 0:  # the exact conditional McNemar
        return np.array([1.0 if b + c == 0 else binomtest(int(b), int(b + c), 0.5,
                                                          alternative="greater" if greater else "less").pvalue
                         for b, c in t])
    z = tango_z(t[:, 0], t[:, 1], n, margin)
    order = np.argsort(-z if greater else z, kind="stable")
    zs = z[order]
    best = np.zeros(len(t))
    for nu in np.linspace(max(0.0, -margin), (1 - margin) / 2, grid):
        tail = np.cumsum(trinomial_pmf(t[order], n, nu + margin, nu))
        # ties share the tail of their last member
        last = np.searchsorted(-zs if greater else zs, -zs if greater else zs, side="right") - 1
        best[order] = np.maximum(best[order], tail[last])
    return np.minimum(best, 1.0)


def tango_p_all(t: np.ndarray, n: int, margin: float, greater: bool) -> np.ndarray:
    z = np.nan_to_num(tango_z(t[:, 0], t[:, 1], n, margin), nan=0.0)
    return norm.sf(z) if greater else norm.cdf(z)


def paired_rates(n: int, margin: float, truth: float, alpha: float = ALPHA, nus=None, p_values=None
                 ) -> dict[str, float]:
    """The largest P(breach) and P(clear) of `acc_drop>margin` over the wrong → right rate ν (right → wrong = ν +
    truth), exact test and Tango's approximation."""
    t = tables(n)
    ps = p_values or {k: (margin_p_all(t, n, margin, g) if k.startswith("exact") else tango_p_all(t, n, margin, g))
                      for k, g in (("exact_breach", True), ("exact_clear", False), ("tango_breach", True),
                                   ("tango_clear", False))}
    lo, hi = max(0.0, -truth), (1 - truth) / 2
    nus = np.linspace(lo, hi, 157)[:-1] + (hi - lo) / 314 if nus is None else nus  # offset from the test's grid
    nus = np.concatenate([[lo], nus])
    out = {k: 0.0 for k in ps}
    for nu in nus:
        pmf = trinomial_pmf(t, n, nu + truth, nu)
        for k, p in ps.items():
            out[k] = max(out[k], float(pmf @ (p < alpha)))
    return out


# ----------------------------------------------------------------------------------------------- replicates
def replicate_rates(n: int, theta: float, rerun: str, alpha: float = ALPHA) -> tuple[float, float]:
    """2 + 2 runs, the old runs right everywhere, the new model wrong on an item with probability θ: deterministic
    reruns (both new runs alike) or each run drawn anew. The per-item mean of the pairs' flips is 0, ½ or 1; its sum
    over items is enumerated by convolution; the rule rejects only where its item-level exact test does."""
    kernel = np.array([1 - theta, theta]) if rerun == "deterministic" else \
        np.array([(1 - theta) ** 2, 2 * theta * (1 - theta), theta ** 2])
    step = 1 if rerun == "deterministic" else 2  # the sum in halves for independent reruns
    dist = np.array([1.0])
    for _ in range(n):
        dist = np.convolve(dist, kernel)
    sums = np.arange(len(dist)) / step
    breach = np.array([binomial_p(s, n, theta, True) < alpha for s in sums])
    clear = np.array([binomial_p(s, n, theta, False) < alpha for s in sums])
    return float(dist @ breach), float(dist @ clear)


# ------------------------------------------------------------------------------------------- across two tasks
def overall_breach(n: int, margin: float, alpha: float = ALPHA, nus=(0.0, 0.02, 0.05, 0.1, 0.2)) -> float:
    """Two tasks of n items, both with a drop of exactly `margin`: the largest P(breach) of `overall:acc_drop>margin`
    over the nuisance rate (the same in both tasks)."""
    t, big = tables(n), tables(2 * n)
    per = margin_p_all(t, n, margin, True)
    pooled = margin_p_all(big, 2 * n, margin, True)
    index = {tuple(x): i for i, x in enumerate(big)}
    b, c = t[:, 0], t[:, 1]
    pooled_p = np.array([[pooled[index[(bi + bj, ci + cj)]] for bj, cj in zip(b, c)] for bi, ci in zip(b, c)])
    p1, p2 = np.meshgrid(per, per, indexing="ij")
    pmin = np.minimum(p1, p2)
    max_drop = -np.expm1(2 * np.log1p(-np.minimum(pmin, 1 - 1e-16)))
    fisher = chi2.sf(-2 * (np.log(np.clip(p1, 1e-300, 1)) + np.log(np.clip(p2, 1e-300, 1))), 4)  # combined_drop_p's
    reject = np.minimum(np.minimum(pooled_p, max_drop), fisher) < alpha / 3
    worst = 0.0
    for nu in nus:
        if nu + margin > 1 or 2 * nu + margin > 1:
            continue
        pmf = trinomial_pmf(t, n, nu + margin, nu)
        worst = max(worst, float(pmf @ reject @ pmf))
    return worst


def markdown(out: dict) -> str:
    """The tables of docs/compat.md, from the JSON this script writes (rates in %)."""
    pct = lambda x: f"{100 * x:.2f}"  # noqa: E731
    a = 100 * out["alpha"]
    lines = [f"Sizes at the null boundary (the largest rate over n; a valid test stays ≤ α = {a:g} %), by exact "
             "enumeration (`studies/gate_sizes.py`):", "",
             "| rule | threshold | n | largest breach % | largest clear % | power |", "|---|---|---|---|---|---|"]
    for r in out["binomial"]:
        lines.append(f"| binomial (`nfr>θ`, every rate of one run) | {100 * r['threshold']:g} % | {r['n']} | "
                     f"{pct(r['max_breach'])} | {pct(r['max_clear'])} | breach at 2θ, n 300: "
                     f"{pct(r['power_breach_at_2x_n300'])} %; clear at 0, n 300: {pct(r['power_clear_at_0_n300'])} % |")
    for margin in sorted({r["margin"] for r in out["paired"]}):
        rows = [r for r in out["paired"] if r["margin"] == margin]
        name = "exact McNemar (`acc_drop>0`)" if margin == 0 else "exact unconditional score test (`acc_drop>Δ`)"
        ns = ", ".join(str(r["n"]) for r in rows)
        power = "; ".join(f"n {r['n']}: {pct(r['power_breach_at_margin_plus_5pts_nu_1pct'])}" for r in rows
                          if r["n"] in (100, 300))
        lines.append(f"| {name} | {100 * margin:g} % | {ns} | {pct(max(r['max_exact_breach'] for r in rows))} | "
                     f"{pct(max(r['max_exact_clear'] for r in rows))} | breach at a drop of Δ + 5 points, 1 % of items "
                     f"fixed: {power} % |")
        if margin:
            lines.append(f"| Tango's normal approximation (before) | {100 * margin:g} % | {ns} | "
                         f"{pct(max(r['max_tango_breach'] for r in rows))} | {pct(max(r['max_tango_clear'] for r in rows))}"
                         " | — |")
    for theta in sorted({r["threshold"] for r in out["replicates"]}):
        for rerun in ("deterministic", "independent"):
            rows = [r for r in out["replicates"] if r["threshold"] == theta and r["rerun"] == rerun]
            lines.append(f"| replicates, 2 + 2 runs, {rerun} reruns (`nfr>θ`) | {100 * theta:g} % | "
                         f"{rows[0]['n']}–{rows[-1]['n']} | {pct(max(r['breach'] for r in rows))} | "
                         f"{pct(max(r['clear'] for r in rows))} | — |")
    for margin in sorted({r["margin"] for r in out["overall"]}):
        rows = [r for r in out["overall"] if r["margin"] == margin]
        lines.append(f"| `overall:acc_drop>Δ`, 2 tasks | {100 * margin:g} % | "
                     f"{', '.join(str(r['n_per_task']) for r in rows)} per task | "
                     f"{pct(max(r['max_breach'] for r in rows))} | (the pooled margin test's) | — |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gate_sizes.json", help="output JSON file")
    args = parser.parse_args()
    start = time.perf_counter()
    ns = (10, 20, 30, 50, 75, 100, 150, 200, 300, 400)
    out: dict = {"alpha": ALPHA}
    out["binomial"] = []
    for theta in (0.01, 0.02, 0.05, 0.10):
        rates = [binomial_rates(n, theta, theta) for n in range(5, 401)]
        out["binomial"].append({"threshold": theta, "n": "5–400 (every n)", "max_breach": max(r[0] for r in rates),
                                "max_clear": max(r[1] for r in rates),
                                "power_breach_at_2x_n300": binomial_rates(300, theta, 2 * theta)[0],
                                "power_clear_at_0_n300": binomial_rates(300, theta, 0.0)[1]})
    out["paired"] = []
    for margin in (0.0, 0.01, 0.02, 0.05):
        for n in (20, 50, 100, 200, 300):
            t = tables(n)
            ps = {"exact_breach": margin_p_all(t, n, margin, True), "exact_clear": margin_p_all(t, n, margin, False)}
            if margin:
                ps |= {"tango_breach": tango_p_all(t, n, margin, True), "tango_clear": tango_p_all(t, n, margin, False)}
            size = paired_rates(n, margin, margin, p_values=ps)
            power = paired_rates(n, margin, margin + 0.05, p_values={"exact_breach": ps["exact_breach"]},
                                 nus=np.array([0.01]))
            out["paired"].append({"margin": margin, "n": n, **{f"max_{k}": v for k, v in size.items()},
                                  "power_breach_at_margin_plus_5pts_nu_1pct": power["exact_breach"]})
            print(out["paired"][-1], flush=True)
    out["replicates"] = [dict(zip(("threshold", "rerun", "n", "breach", "clear"), (theta, rerun, n,
                                                                                   *replicate_rates(n, theta, rerun))))
                         for theta in (0.02, 0.05) for rerun in ("deterministic", "independent") for n in ns]
    out["overall"] = [{"tasks": 2, "n_per_task": n, "margin": margin, "max_breach": overall_breach(n, margin)}
                      for margin in (0.0, 0.02) for n in (20, 40)]
    out["seconds"] = time.perf_counter() - start
    out["command"] = f"python studies/gate_sizes.py --out {args.out}"
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(markdown(out))


if __name__ == "__main__":
    main()
