"""Theorem A2 of Ni et al., "The Impact of Task Similarity on Performance Drift of LLMs", App. A.

A dataset of ``n`` samples mixes subpopulations; subpopulation ``j`` (the one evaluated) has probability
``alpha_j``, subpopulation ``i`` probability ``alpha_i``, and their reference strings (length ``d``) agree on a
fraction ``r = r(i, j)`` of the bits (A6). Samples are noisy prefixes of the reference (BSC with flip rate
``delta``, (A3)). An algorithm mistakes a sample of ``i`` for one of ``j`` with probability ``k_mis * r_j(z)``
(A8), and such a mistake raises its error on ``j`` by ``lambda_l`` where the sample disagrees with ``c_j`` and
lowers it by at most ``mu_l`` where it agrees ((A9), (A10); ``l`` = number of samples of ``j``). Theorem A2:
the averaged error on ``j`` is at least ``OPT(A*) + f(r)`` (A19); ``f`` is positive somewhere in ``[0, 1]`` and
peaks below ``r = 1/2``: data that is *half* similar hurts the most.

Collecting (A29)-(A31), ``f`` is the concave quadratic

    f(r) = lam * e(r) - (lam + mu) * e(r)**2 - G * r * (1 - r),        e(r) = (1 - 2 delta) r + delta,

where ``e(r)`` is the expected similarity E r_j of a sample of ``i`` to ``c_j`` (A7), ``lam``, ``mu`` are the
sums (A33) and ``G = sum_{l,m} h_{l,m} g_m (lambda_l + mu_l)`` with ``h``, ``g`` from (A28).

Readings of the paper's notation (equation numbers of Ni et al.):

* (A3) draws the sample length from U([n]), but reference strings have ``d`` bits and (A22) uses ``l0/d``: the
  length is uniform on ``1..d``; ``n`` is the dataset size, as in (A20).
* (A30)-(A31) are one bracket: the ``-sum h sum p l0 k_m/d (`` opened in (A30) closes at the end of (A31), so the
  terms of (A31) carry the same sums and minus sign. This is what (A23) gives and what makes (A32) a maximum.
* ``lambda_l``, ``mu_l`` depend on ``l`` (A9), so they are weighted per ``l`` inside the sums, as in (A33).
* (A24) calls ``r`` the mean of ``beta``; it is the mean of ``beta / l0`` (hypergeometric, mean ``l0 r``). (A26)
  prints ``2 delta (1 - delta)``; expanding (A25) gives ``2 delta (1 - 2 delta)``, which is what (A27) uses.
  We use (A27) as printed.
* (A25) treats ``r_j`` as fixed given ``beta`` and so omits the BSC noise variance ``delta (1 - delta) / l0``.
  We follow the paper; the omitted term would only subtract an ``r``-independent constant and changes no maximiser.
* The paper says (A29) is maximal at ``r = 1/2``; with ``G >= 0`` it is *minimal* there, so (A32), the vertex of
  (A31) alone, is not the maximiser of ``f``. The vertex of ``f`` is
  ``r* = (theta - 2 delta - (1 - 2 delta) gamma) / (2 (1 - 2 delta)(1 - gamma))`` with ``theta = lam/(lam+mu)``
  and ``gamma = G / ((1 - 2 delta)**2 (lam + mu)) < 1``. ``r* < 1/2`` exactly when (A32) ``< 1/2`` (i.e. when
  ``mu > 0``), and then ``r* <= (A32)``: the theorem's conclusion holds for the true maximiser.
  :func:`theorem_a2_argmax` returns either (``formula="exact"`` or ``"A32"``), clipped to ``[0, 1]``.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import binom

__all__ = [
    "TheoremA2Sums",
    "theorem_a2_argmax",
    "theorem_a2_curve",
    "theorem_a2_sums",
]

_BLOCK = 1 << 22  # entries per block of the (n - 1) x d table of binomial generating-function values


class TheoremA2Sums(NamedTuple):
    """The sums of (A28)-(A33) through which ``f`` depends on ``n, d, alpha_i, alpha_j, k_mis, lambda_l, mu_l``."""

    lam: float
    """``lambda`` of (A33): ``sum_{l,m} h_{l,m} sum_{l0} p_m(l0) l0 k_m/d lambda_l``."""
    mu: float
    """``mu`` of (A33), the same sum over ``mu_l``."""
    g: float
    """``G = sum_{l,m} h_{l,m} g_m (lambda_l + mu_l)`` (A28), (A29): the coefficient of ``-r (1 - r)``."""


def _check_int(name: str, value: object, minimum: int, reason: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} ({reason}), got {value!r}")
    return int(value)


def _check_real(name: str, value: object, low: float, high: float, *, low_open: bool, high_open: bool) -> float:
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a real number in {interval}, got {value!r}")
    return float(value)


def _check_per_l(name: str, value: ArrayLike, n: int) -> NDArray[np.float64]:
    """``lambda_l``/``mu_l`` as an array of shape (n - 1,) indexed by ``l = 1..n-1``."""
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        arr = np.full(n - 1, float(arr))
    if arr.shape != (n - 1,):
        raise ValueError(
            f"{name} must be a scalar or have shape (n - 1,) = ({n - 1},) for l = 1..n-1, got shape {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise ValueError(f"{name} must lie in [0, 1] (a change of an error probability, (A9)/(A10)), got {value!r}")
    return arr


def _checked(
    n: object,
    d: object,
    alpha_i: object,
    alpha_j: object,
    delta: object,
    k_mis: object,
    lambda_l: ArrayLike,
    mu_l: ArrayLike,
) -> tuple[int, int, float, float, float, float, NDArray, NDArray]:
    n = _check_int("n", n, 2, "dataset size; the bound needs a sample of each subpopulation")
    d = _check_int("d", d, 2, "reference string length; (A27) divides by d - 1")
    alpha_i = _check_real("alpha_i", alpha_i, 0.0, 1.0, low_open=True, high_open=True)
    alpha_j = _check_real("alpha_j", alpha_j, 0.0, 1.0, low_open=True, high_open=True)
    if alpha_i + alpha_j > 1:
        raise ValueError(f"alpha_i + alpha_j must be <= 1 (mixture probabilities, (A1)), got {alpha_i} + {alpha_j}")
    delta = _check_real("delta", delta, 0.0, 0.5, low_open=False, high_open=True)
    k_mis = _check_real("k_mis", k_mis, 0.0, 1.0, low_open=True, high_open=False)
    return (n, d, alpha_i, alpha_j, delta, k_mis, _check_per_l("lambda_l", lambda_l, n), _check_per_l("mu_l", mu_l, n))


def _max_length_moments(n: int, d: int, q: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """For ``l = 1..n-1``: ``E[l0/d; m >= 1]`` and ``E[(d - l0)/(d (d - 1)); m >= 1]``, shapes (n - 1,).

    ``m ~ Binom(n - l, q)`` is the number of samples of subpopulation ``i`` given ``l`` (so that
    ``h_{l,m} = Binom(n, alpha_j)(l) Binom(n - l, q)(m)``, (A28)) and ``l0`` the longest of their lengths (A22).
    With ``l0 := 0`` when ``m = 0``, ``E[l0] = sum_{t<d} P(l0 > t) = sum_{s=1}^{d} (1 - (1 - q s/d)^(n-l))`` by the
    binomial generating function: the exact value of the ``m``, ``l0`` sums of (A28)-(A33), in O(n d) work.
    """
    remaining = np.arange(n - 1, 0, -1, dtype=float)[:, None]  # n - l
    # expm1/log1p keep (1 - q s/d)^(n-l) - 1 accurate when q (n - l) is tiny
    with np.errstate(divide="ignore"):  # log1p(-1) = -inf when alpha_i + alpha_j = 1: (1 - q)^(n-l) = 0
        last = np.expm1(remaining[:, 0] * np.log1p(-q))
        mean_len, spread = np.zeros(n - 1), np.zeros(n - 1)
        s = np.arange(1, d + 1)
        for block in np.array_split(s, max(1, (n - 1) * d // _BLOCK)):
            e = np.expm1(remaining * np.log1p(-q * block / d))
            mean_len -= e.sum(axis=1)
            spread += (e - last[:, None]).sum(axis=1)
    # each term of `spread` is >= 0; clipping removes rounding noise only
    return mean_len / d, np.maximum(spread, 0.0) / (d * (d - 1))


def _scaled_sums(
    n: int, d: int, alpha_i: float, alpha_j: float, lambda_l: NDArray, mu_l: NDArray
) -> tuple[float, float, float, float]:
    """``(lam, mu, G / (1 - 2 delta)^2) / k_mis``, each divided by ``exp(log_scale)``, and ``log_scale``.

    The common scale is taken out so that ratios stay finite even when the sums underflow.
    """
    log_w = binom.logpmf(np.arange(1, n), n, alpha_j)
    w = np.exp(log_w - log_w.max())
    mean_len, spread = _max_length_moments(n, d, min(alpha_i / (1.0 - alpha_j), 1.0))
    lm_max, len_max = float((lambda_l + mu_l).max()), float(mean_len.max())
    if lm_max == 0 or len_max == 0:
        return 0.0, 0.0, 0.0, -math.inf
    w_len, w_spread = w * mean_len / len_max, w * spread / len_max
    lam, mu = w_len @ (lambda_l / lm_max), w_len @ (mu_l / lm_max)
    g = w_spread @ ((lambda_l + mu_l) / lm_max)
    return float(lam), float(mu), float(g), float(log_w.max() + math.log(len_max) + math.log(lm_max))


def theorem_a2_sums(
    *, n: int, d: int, alpha_i: float, alpha_j: float, delta: float, k_mis: float, lambda_l: ArrayLike, mu_l: ArrayLike
) -> TheoremA2Sums:
    """The sums ``lambda``, ``mu`` (A33) and ``G`` (A28)-(A29); parameters as in :func:`theorem_a2_curve`."""
    n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l = _checked(
        n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l
    )
    lam, mu, g, log_scale = _scaled_sums(n, d, alpha_i, alpha_j, lambda_l, mu_l)
    scale = k_mis * math.exp(log_scale)
    return TheoremA2Sums(lam * scale, mu * scale, g * scale * (1 - 2 * delta) ** 2)


def theorem_a2_curve(
    r: ArrayLike,
    *,
    n: int,
    d: int,
    alpha_i: float,
    alpha_j: float,
    delta: float,
    k_mis: float,
    lambda_l: ArrayLike,
    mu_l: ArrayLike,
) -> NDArray[np.float64]:
    """Theorem A2's lower bound ``f(r)`` on the excess error of subpopulation ``j`` ((A29)-(A31)), vectorised.

    Args:
        r: similarity ``r(i, j)`` (A6), values in [0, 1], any shape (``f`` is a polynomial in ``r``, so any real
            ``r`` is allowed, not only multiples of ``1/d``).
        n: dataset size ``n`` (>= 2).
        d: reference string length ``d`` (>= 2); sample lengths are uniform on ``1..d``.
        alpha_i: probability ``alpha_i`` of the other subpopulation ``i``, in (0, 1).
        alpha_j: probability ``alpha_j`` of the evaluated subpopulation ``j``, in (0, 1); ``alpha_i + alpha_j <= 1``.
        delta: bit-flip probability ``delta`` of the BSC (A2), in [0, 1/2).
        k_mis: ``k_mis`` (``k_m`` in (A23)-(A33)) of Assumption 2 (A8), in (0, 1].
        lambda_l: ``lambda_l`` of (A9) in [0, 1]: a scalar, or shape (n - 1,) for ``l = 1..n-1``.
        mu_l: ``mu_l`` of (A10) in [0, 1], same shapes as ``lambda_l``.

    Returns:
        ``f(r)``, same shape as ``r``; see the module docstring for the closed form and its derivation.
    """
    r_arr = np.asarray(r, dtype=float)
    if not np.all(np.isfinite(r_arr)) or np.any(r_arr < 0) or np.any(r_arr > 1):
        raise ValueError(f"r must lie in [0, 1] (a similarity, (A6)), got {r!r}")
    lam, mu, g = theorem_a2_sums(
        n=n, d=d, alpha_i=alpha_i, alpha_j=alpha_j, delta=delta, k_mis=k_mis, lambda_l=lambda_l, mu_l=mu_l
    )
    e = (1 - 2 * delta) * r_arr + delta
    return lam * e - (lam + mu) * e**2 - g * r_arr * (1 - r_arr)


def theorem_a2_argmax(
    *,
    n: int,
    d: int,
    alpha_i: float,
    alpha_j: float,
    delta: float,
    k_mis: float,
    lambda_l: ArrayLike,
    mu_l: ArrayLike,
    formula: Literal["exact", "A32"] = "exact",
) -> float:
    """The similarity in [0, 1] at which Theorem A2's bound ``f`` peaks; below 1/2 whenever ``mu > 0``.

    ``formula="exact"`` gives the maximiser of ``f`` itself (vertex of the concave quadratic, see the module
    docstring); ``formula="A32"`` gives the paper's (A32), ``lam / (2 (1-2 delta)(lam+mu)) - delta / (1-2 delta)``,
    the maximiser of part (A31) alone. Both are clipped to [0, 1], where ``f`` is concave. Parameters as in
    :func:`theorem_a2_curve`; the result does not depend on ``k_mis`` or on a common scale of ``lambda_l, mu_l``.
    """
    if formula not in ("exact", "A32"):
        raise ValueError(f"formula must be one of 'exact', 'A32', got {formula!r}")
    n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l = _checked(
        n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l
    )
    lam, mu, g, _ = _scaled_sums(n, d, alpha_i, alpha_j, lambda_l, mu_l)
    if lam + mu <= 0:
        raise ValueError("lambda_l and mu_l must not all be 0 (weighted by the sample counts): f is then 0 everywhere")
    a, theta, gamma = 1 - 2 * delta, lam / (lam + mu), g / (lam + mu)
    vertex = (
        (theta - 2 * delta) / (2 * a) if formula == "A32" else (theta - 2 * delta - a * gamma) / (2 * a * (1 - gamma))
    )
    return float(np.clip(vertex, 0.0, 1.0))
