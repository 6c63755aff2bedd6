"""Consistency–diversity task selection for multitask fine-tuning (Xu's thesis §3.3.2, Algorithm 1, §8.6.4)
and a drift-risk report for a fine-tuning set against tasks to keep (Ni et al.).

Each task is a set of example embeddings φ(x), an (n, d) array, viewed as a Gaussian N(μ, C).

- **Consistency** of a candidate T_i with the target T_0: cosine of their mean embeddings.
- **Coverage** (diversity) of a set D of tasks (the union of their examples) for T_0:
  `coverage(D; T_0) = 1 / ((μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0))` — the inverse squared Mahalanobis
  distance of the target's mean from D's covariance ellipsoid. C_D is the Ledoit–Wolf shrinkage
  covariance (`shrunk_covariance`), because the sample covariance is singular when a set has no more
  examples than dimensions (the usual case for LLM hidden states); it is applied through a Cholesky
  solve, never an explicit inverse.
- **Algorithm 1**: sort the candidates by consistency (descending); L ← {best}; for the next candidate
  T in that order, if coverage(L ∪ T) ≥ (1 + p)·coverage(L) then add it, otherwise *stop* (the paper
  breaks at the first failure; later candidates are never tried).

Ablations (Xu's thesis Table 3.1: "No Con.: ignore consistency. No Div.: ignore diversity. Random:
ignore both"; §8.5.4: violating diversity = stopping early, violating consistency = letting unrelated
tasks in):

- ``no_consistency``: the coverage rule of Algorithm 1 over a seeded random order of the candidates
  (consistency plays no part in which tasks are tried first).
- ``no_diversity``: the top-k candidates by consistency, coverage never consulted. Algorithm 1 always
  selects a prefix of the consistency order, so top-|full| would reproduce ``full`` exactly; the
  default is therefore k = 1, what consistency alone prefers (adding any less consistent task only
  lowers it) and the "early stop" of §8.5.4. Pass `k` for another size.
- ``random``: k candidates drawn at random (seeded); default k = the size ``full`` selects, so the two
  are compared at equal budget.

§8.6.4 (NLP) represents each dataset by one feature vector, the first principal component of its
examples' embeddings (`first_principal_component`). With ``feature="pc1"`` consistency is the cosine
of the target's and the candidate's PC1 vectors. The paper does not say how coverage is computed on one
vector per dataset (the covariance of a single vector is zero), so coverage stays the example-level
ellipsoid score in that mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import scipy.linalg

METHODS = ("full", "no_consistency", "no_diversity", "random")
FEATURES = ("mean", "pc1")
# Ledoit–Wolf estimates no shrinkage for a two-example set (both centred rows are ±v, so every
# x_k x_kᵀ equals S) although S then has rank 1; a floor keeps every C_D positive definite.
MIN_SHRINKAGE = 1e-2


@dataclass
class SelectionResult:
    """What `select_tasks` chose and why.

    selected: chosen task names, in the order they were added.
    consistency: every candidate's consistency with the target (cosine, in [−1, 1]).
    coverage_trace: one step per candidate tried, `{"task", "coverage", "accepted"}`, where coverage is
        that of the selected set plus this task; the last step of ``full``/``no_consistency`` is the
        rejected candidate that stopped the search (absent when every candidate was accepted).
    method, feature: the selection variant used.
    """

    selected: list[str]
    consistency: dict[str, float]
    coverage_trace: list[dict]
    method: str
    feature: str = "mean"

    @property
    def coverage(self) -> float:
        """Coverage of the selected set."""
        return [step for step in self.coverage_trace if step["accepted"]][-1]["coverage"]

    def to_dict(self) -> dict:
        return {**asdict(self), "coverage": self.coverage}


def _check_choice(value: str, valid: Sequence[str], name: str) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(valid)}")


def _check_embeddings(x, name: str, dim: int | None = None, min_rows: int = 2) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D (n, d) array of embeddings, got shape {arr.shape}")
    if arr.shape[0] < min_rows:
        raise ValueError(f"{name}: needs at least {min_rows} example(s), got {arr.shape[0]}")
    if dim is not None and arr.shape[1] != dim:
        raise ValueError(f"{name}: embedding dimension {arr.shape[1]} differs from the target's {dim}")
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        raise ValueError(f"{name}: NaN/inf in the embeddings of rows {np.flatnonzero(~finite)[:10].tolist()}")
    return arr


def _check_varied(x: np.ndarray, name: str) -> None:
    if np.all(x == x[0]):
        raise ValueError(f"{name}: all embeddings are identical (zero variance); its covariance is undefined")


def _cosine(a: np.ndarray, b: np.ndarray, name: str) -> float:
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0:
        raise ValueError(f"{name}: a mean embedding is the zero vector, so the cosine similarity is undefined")
    return float(np.clip(a @ b / norms, -1.0, 1.0))


def shrunk_covariance(x: np.ndarray, shrinkage: float | None = None) -> tuple[np.ndarray, float]:
    """Shrinkage covariance of the rows of `x` (n, d): returns (C (d, d), λ).

    S = X_cᵀX_c / n is the maximum-likelihood covariance of the centred rows, F = (tr S / d)·I, and
    C = (1 − λ)·S + λ·F. With `shrinkage=None`, λ is Ledoit & Wolf's (2004) closed form (as in
    scikit-learn's `ledoit_wolf`): with δ² = ‖S − F‖²_F and β̄² = Σ_k ‖x_k x_kᵀ − S‖²_F / n²
    (x_k the centred rows), λ = min(β̄², δ²) / δ², then raised to at least `MIN_SHRINKAGE`.
    A given `shrinkage` in [0, 1] is used as is.
    """
    xc = x - x.mean(axis=0)
    n, d = xc.shape
    s = xc.T @ xc / n
    scale = np.trace(s) / d
    if shrinkage is None:
        delta2 = float(np.sum((s - scale * np.eye(d)) ** 2))
        # Σ_k ‖x_k x_kᵀ − S‖²_F = Σ_k ‖x_k‖⁴ − n‖S‖²_F, since Σ_k x_k x_kᵀ = nS
        beta2 = float(np.sum(np.sum(xc**2, axis=1) ** 2) - n * np.sum(s**2)) / n**2
        shrinkage = 1.0 if delta2 == 0 else min(beta2, delta2) / delta2
        shrinkage = max(shrinkage, MIN_SHRINKAGE)
    return (1 - shrinkage) * s + shrinkage * scale * np.eye(d), shrinkage


def consistency(target, candidate) -> float:
    """Cosine similarity of the mean embeddings of `target` (n₀, d) and `candidate` (nᵢ, d)."""
    return _cosine(np.mean(target, axis=0), np.mean(candidate, axis=0), "consistency")


def coverage(examples, target_mean, *, shrinkage: float | None = None) -> float:
    """coverage(D; T₀) = 1 / ((μ_D − μ_T0)ᵀ C_D⁻¹ (μ_D − μ_T0)) for D's examples (n, d), μ_T0 (d,).

    C_D is `shrunk_covariance(examples, shrinkage)`. +inf when μ_D = μ_T0 (perfectly covered).
    """
    x = np.asarray(examples, dtype=np.float64)
    cov, _ = shrunk_covariance(x, shrinkage)
    diff = x.mean(axis=0) - np.asarray(target_mean, dtype=np.float64)
    try:
        dist2 = float(diff @ scipy.linalg.solve(cov, diff, assume_a="pos"))
    except np.linalg.LinAlgError as err:
        raise ValueError(f"coverage: the covariance of {len(x)} examples is singular; use shrinkage=None") from err
    return math.inf if dist2 <= 0 else 1.0 / dist2


def _pc1(x: np.ndarray, name: str) -> np.ndarray:
    _check_varied(x, name)
    mean = x.mean(axis=0)
    v = np.linalg.svd(x - mean, full_matrices=False)[2][0]
    proj = float(v @ mean)
    if abs(proj) > 1e-12 * np.linalg.norm(mean):
        return v if proj > 0 else -v
    return v if v[np.argmax(np.abs(v))] > 0 else -v


def first_principal_component(embeddings) -> np.ndarray:
    """First principal component (d,), unit length, of a dataset's embeddings (n, d) (Xu's thesis §8.6.4).

    The rows are centred (standard PCA). A principal direction is defined only up to sign; the sign is
    chosen so that the dataset's mean projects positively (vᵀμ > 0: the component points the way the
    data lies from the origin), or, when vᵀμ = 0, so that v's largest-magnitude coordinate (the first
    on ties) is positive. Hence the result does not depend on row order or on the SVD's sign choice,
    and negating the data negates it.
    """
    return _pc1(_check_embeddings(embeddings, "embeddings"), "embeddings")


def _greedy(order: list[str], coverage_of, p: float) -> tuple[list[str], list[dict]]:
    selected = [order[0]]
    current = coverage_of(selected)
    trace = [{"task": order[0], "coverage": current, "accepted": True}]
    for name in order[1:]:
        value = coverage_of([*selected, name])
        accepted = bool(value >= (1 + p) * current)
        trace.append({"task": name, "coverage": value, "accepted": accepted})
        if not accepted:
            break
        selected.append(name)
        current = value
    return selected, trace


def select_tasks(target, candidates: Mapping[str, object], p: float = 0.05, *, method: str = "full",
                 feature: str = "mean", k: int | None = None, seed: int = 0,
                 shrinkage: float | None = None) -> SelectionResult:
    """Choose fine-tuning tasks for a target task by consistency and coverage (Xu's thesis Algorithm 1).

    target: (n₀, d) embeddings of the target task's examples.
    candidates: name → (nᵢ, d) embeddings of each candidate task (at least one; nᵢ ≥ 2).
    p: the significance threshold ≥ 0 — a task is added only if coverage grows by a factor ≥ 1 + p.
    method: ``full`` (Algorithm 1) or an ablation, ``no_consistency``, ``no_diversity``, ``random``
        (see the module docstring). `k` sets the size for ``no_diversity``/``random``; `seed` their
        randomness (``no_consistency``, ``random``).
    feature: ``mean`` (consistency from mean embeddings) or ``pc1`` (from first principal components).
    shrinkage: None for Ledoit–Wolf, or a fixed λ in [0, 1] (0 needs more examples than dimensions).
    """
    _check_choice(method, METHODS, "method")
    _check_choice(feature, FEATURES, "feature")
    if not (isinstance(p, (int, float)) and math.isfinite(p) and p >= 0):
        raise ValueError(f"p must be a finite number >= 0, got {p!r}")
    if shrinkage is not None and not 0 <= shrinkage <= 1:
        raise ValueError(f"shrinkage must be None (Ledoit–Wolf) or in [0, 1], got {shrinkage!r}")
    if not candidates:
        raise ValueError("candidates: empty; give at least one candidate task")
    t0 = _check_embeddings(target, "target")
    tasks = {name: _check_embeddings(x, f"candidate {name!r}", t0.shape[1]) for name, x in candidates.items()}
    for name, x in tasks.items():
        _check_varied(x, f"candidate {name!r}")
        if shrinkage == 0 and len(x) <= x.shape[1]:
            raise ValueError(f"candidate {name!r}: shrinkage=0 needs more examples than dimensions "
                             f"({len(x)} <= {x.shape[1]}); use shrinkage=None")
    names = list(tasks)
    if k is not None:
        if method not in ("no_diversity", "random"):
            raise ValueError(f"k applies only to method='no_diversity' or 'random', not {method!r}")
        if not (isinstance(k, int) and 1 <= k <= len(names)):
            raise ValueError(f"k must be an integer in 1..{len(names)} (the number of candidates), got {k!r}")

    if feature == "mean":
        mu0 = t0.mean(axis=0)
        cons = {n: _cosine(mu0, x.mean(axis=0), f"candidate {n!r}") for n, x in tasks.items()}
    else:
        v0 = _pc1(t0, "target")
        cons = {n: _cosine(v0, _pc1(x, f"candidate {n!r}"), f"candidate {n!r}") for n, x in tasks.items()}
    by_consistency = sorted(names, key=lambda n: -cons[n])  # stable: ties keep the given order
    target_mean = t0.mean(axis=0)

    def coverage_of(chosen: list[str]) -> float:
        return coverage(np.concatenate([tasks[n] for n in chosen]), target_mean, shrinkage=shrinkage)

    rng = np.random.default_rng(seed)
    if method == "full":
        selected, trace = _greedy(by_consistency, coverage_of, p)
    elif method == "no_consistency":
        selected, trace = _greedy([names[i] for i in rng.permutation(len(names))], coverage_of, p)
    else:
        if k is None:
            k = 1 if method == "no_diversity" else len(_greedy(by_consistency, coverage_of, p)[0])
        if method == "no_diversity":
            selected = by_consistency[:k]
        else:
            selected = [names[i] for i in rng.choice(len(names), size=k, replace=False)]
        trace = [{"task": n, "coverage": coverage_of(selected[: i + 1]), "accepted": True}
                 for i, n in enumerate(selected)]
    return SelectionResult(selected=selected, consistency=cons, coverage_trace=trace, method=method, feature=feature)


def drift_risk(finetune_embeddings, keep_tasks: Mapping[str, object], *, band: tuple[float, float] = (0.25, 0.55),
               center=None) -> list[dict]:
    """How similar a fine-tuning set is to each task whose ability must be kept, flagging risky ones.

    finetune_embeddings: (n, d) embeddings of the fine-tuning examples; keep_tasks: name → (nᵢ, d).
    The similarity estimate is r = (1 + cos(μ_ft − c, μ_keep − c)) / 2 ∈ [0, 1] with c = `center`
    (d,) or 0. For ±1 vectors (Ni et al.'s bit strings mapped b ↦ 2b − 1) this is exactly the fraction
    of equal bits, the similarity of 000 Def. 4: r = 1 same direction, r = 1/2 unrelated (orthogonal),
    r = 0 opposite. Ni et al. (Thm. A2, App. C) finds that fine-tuning data of *intermediate*
    similarity to a base task — below and near 1/2 — degrades it most, while r ≈ 0 or r ≈ 1 do little
    harm; tasks with r inside `band` (inclusive) are flagged ``at_risk``.

    Mean embeddings of raw LM hidden states share a large common direction, which pushes every cosine
    towards 1; pass `center` (e.g. the mean embedding of generic text) to remove it.
    Returns one dict per keep task, in the given order: {"task", "cosine", "similarity", "at_risk"}.
    """
    lo, hi = band
    if not 0 <= lo < hi <= 1:
        raise ValueError(f"band must be (low, high) with 0 <= low < high <= 1, got {band!r}")
    if not keep_tasks:
        raise ValueError("keep_tasks: empty; give at least one task to keep")
    ft = _check_embeddings(finetune_embeddings, "finetune_embeddings", min_rows=1)
    c = np.zeros(ft.shape[1]) if center is None else np.asarray(center, dtype=np.float64)
    if c.shape != (ft.shape[1],) or not np.isfinite(c).all():
        raise ValueError(f"center: expected a finite vector of shape ({ft.shape[1]},), got shape {c.shape}")
    mu_ft = ft.mean(axis=0) - c
    report = []
    for name, x in keep_tasks.items():
        keep = _check_embeddings(x, f"keep task {name!r}", ft.shape[1], min_rows=1)
        cos = _cosine(mu_ft, keep.mean(axis=0) - c, f"keep task {name!r}")
        r = (1 + cos) / 2
        report.append({"task": name, "cosine": cos, "similarity": r, "at_risk": bool(lo <= r <= hi)})
    return report
