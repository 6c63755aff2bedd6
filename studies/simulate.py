"""Replicate runs where the truth is known (pure numpy): the proof, by simulation, that the run-level statistics of
`replicates` hold their error rates.

Item i has a difficulty b_i ~ N(mu, sd_item); run r of a model gets it right when
b_i + shift_i + e_r + u_{r,i} > 0, with e_r ~ N(0, sd_run) a run's overall offset (one seed trains a little better)
and u_{r,i} ~ Logistic(0, 1) the run's own churn on that item. An update with no true regression has shift = 0; a
planted regression lowers the new model's logit by `drop` on a fraction `share` of the items.
"""

from __future__ import annotations

import numpy as np


def simulate_runs(rng: np.random.Generator, n_items: int, runs_old: int, runs_new: int, *, mu: float = 0.5,
                  sd_item: float = 2.0, sd_run: float = 0.15, drop: float = 0.0, share: float = 0.0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(old (runs_old, N), new (runs_new, N)) 0/1 answers and the new model's per-item logit shift (N,)."""
    b = rng.normal(mu, sd_item, n_items)
    shift = np.where(rng.random(n_items) < share, -drop, 0.0)

    def runs(r: int, s: np.ndarray) -> np.ndarray:
        offset = rng.normal(0, sd_run, (r, 1))
        return (b + s + offset + rng.logistic(0, 1, (r, n_items)) > 0).astype(np.int8)

    return runs(runs_old, np.zeros(n_items)), runs(runs_new, shift), shift


def true_excess_nfr(runs_old: int, runs_new: int, *, mu: float = 0.5, sd_item: float = 2.0, sd_run: float = 0.15,
                    drop: float = 0.0, share: float = 0.0, n_items: int = 400_000, seed: int = 12345) -> float:
    """The population value of `replicates.replicate_flips`' excess NFR for these settings: runs independent, so
    cross = E_i[p̄_o (1 − p̄_n)] and each side's floor E_i[p̄ (1 − p̄)], pooled with the estimator's weights
    R (R − 1); p̄ = E_e[σ(b + shift + e)] by Gauss–Hermite quadrature over the run offset."""
    rng = np.random.default_rng(seed)
    b = rng.normal(mu, sd_item, n_items)
    shift = np.where(rng.random(n_items) < share, -drop, 0.0)
    nodes, weights = np.polynomial.hermite_e.hermegauss(21)
    weights = weights / weights.sum()

    def p_bar(s: np.ndarray) -> np.ndarray:
        return (weights / (1 + np.exp(-(b + s)[:, None] - sd_run * nodes))).sum(1)

    p_o, p_n = p_bar(np.zeros(n_items)), p_bar(shift)
    cross = (p_o * (1 - p_n)).mean()
    w_o, w_n = runs_old * (runs_old - 1), runs_new * (runs_new - 1)
    floor = (w_o * (p_o * (1 - p_o)).mean() + w_n * (p_n * (1 - p_n)).mean()) / (w_o + w_n)
    return float(cross - floor)
