"""Theorem A2 bound of paper 000 (App. A): checked against the unsimplified sums written out literally."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from adaptguard.drift.plots import plot_theorem_a2
from adaptguard.drift.theory import theorem_a2_argmax, theorem_a2_curve, theorem_a2_sums

# (n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l); per-l arrays have length n - 1
CASES = [
    {"n": 4, "d": 3, "alpha_i": 0.3, "alpha_j": 0.5, "delta": 0.1, "k_mis": 0.7, "lambda_l": 0.6, "mu_l": 0.1},
    {
        "n": 5,
        "d": 4,
        "alpha_i": 0.4,
        "alpha_j": 0.6,
        "delta": 0.0,
        "k_mis": 1.0,
        "lambda_l": [0.2, 0.4, 0.6, 0.8],
        "mu_l": [0.3, 0.2, 0.1, 0.05],
    },
    {"n": 6, "d": 5, "alpha_i": 0.15, "alpha_j": 0.7, "delta": 0.25, "k_mis": 0.5, "lambda_l": 0.9, "mu_l": 0.02},
    {
        "n": 3,
        "d": 2,
        "alpha_i": 0.5,
        "alpha_j": 0.25,
        "delta": 0.4,
        "k_mis": 1.0,
        "lambda_l": [1.0, 0.5],
        "mu_l": [0.0, 0.1],
    },
]


def _per_l(value, n):
    return [value] * (n - 1) if np.ndim(value) == 0 else list(value)


def _h(n, l, m, a_i, a_j):
    """Trinomial weight h_{l,m} of (A28)."""
    return math.comb(n, l) * math.comb(n - l, m) * a_j**l * a_i**m * (1 - a_i - a_j) ** (n - l - m)


def _p(m, l0, d):
    """(A22): probability that the longest of m lengths uniform on 1..d is l0."""
    return (l0 / d) ** m - ((l0 - 1) / d) ** m


def _bound_unsimplified(r, n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l):
    """Excess part of (A20)-(A21) with (A23), E r_j^2 summed over the hypergeometric beta as in (A25); r in {k/d}."""
    same = round(r * d)  # the paper's "alpha" of (A24): number of equal bits
    lam, mu = _per_l(lambda_l, n), _per_l(mu_l, n)
    total = 0.0
    for l in range(1, n):
        for m in range(1, n - l + 1):
            for l0 in range(1, d + 1):
                e1 = e2 = 0.0
                for b in range(max(0, same + l0 - d), min(l0, same) + 1):
                    pb = math.comb(same, b) * math.comb(d - same, l0 - b) / math.comb(d, l0)
                    rj = ((1 - delta) * b + (l0 - b) * delta) / l0
                    e1, e2 = e1 + pb * rj, e2 + pb * rj * rj
                excess = k_mis * l0 / d * (lam[l - 1] * e1 - (lam[l - 1] + mu[l - 1]) * e2)
                total += _h(n, l, m, alpha_i, alpha_j) * _p(m, l0, d) * excess
    return total


def _sums_literal(n, d, alpha_i, alpha_j, delta, k_mis, lambda_l, mu_l):
    """lambda, mu of (A33) and G = sum h_{l,m} g_m (lambda_l + mu_l) with g_m of (A28), as triple loops."""
    lam_l, mu_ls = _per_l(lambda_l, n), _per_l(mu_l, n)
    lam = mu = g = 0.0
    for l, m in product(range(1, n), range(1, n)):
        if l + m > n:
            continue
        h = _h(n, l, m, alpha_i, alpha_j)
        lens = sum(_p(m, l0, d) * l0 * k_mis / d for l0 in range(1, d + 1))
        g_m = sum(
            _p(m, l0, d) * l0 * k_mis / d * (1 - 2 * delta) ** 2 * (d - l0) / (l0 * (d - 1)) for l0 in range(1, d + 1)
        )
        lam += h * lens * lam_l[l - 1]
        mu += h * lens * mu_ls[l - 1]
        g += h * g_m * (lam_l[l - 1] + mu_ls[l - 1])
    return lam, mu, g


def _a29_to_a31(r, delta, lam, mu, g):
    """(A29) + (A30) + (A31) read as one bracket, term by term."""
    a = 1 - 2 * delta
    return (
        -g * r * (1 - r)
        - ((lam + mu) * delta**2 - lam * delta)
        - ((lam + mu) * a**2 * r**2 - lam * a * r + 2 * (lam + mu) * delta * a * r)
    )


def test_hand_computed_value():
    # n = d = 2: only l = m = 1, h = 2 * 0.5 * 0.5 = 1/2; l0 in {1, 2} with p = 1/2 each. delta = 0, r = 1/2:
    # l0 = 1: r_j is 0 or 1 (each 1/2), lambda E r_j - lambda E r_j^2 = 0; l0 = 2: r_j = 1/2, excess 2/2 * 1/4.
    # f(1/2) = 1/2 * (1/2 * 0 + 1/2 * 1/4) = 1/16; at r = 0 or 1, r_j is 0 or 1 and f = 0.
    p = {"n": 2, "d": 2, "alpha_i": 0.5, "alpha_j": 0.5, "delta": 0.0, "k_mis": 1.0, "lambda_l": 1.0, "mu_l": 0.0}
    np.testing.assert_allclose(theorem_a2_curve([0.0, 0.5, 1.0], **p), [0.0, 1 / 16, 0.0], atol=1e-15)
    # lambda = 1/2 * (1/2 * 1/2 + 1/2 * 1) = 3/8, G = 1/2 * (1/2 * 1/2 * 1) = 1/8
    assert theorem_a2_sums(**p) == pytest.approx((3 / 8, 0.0, 1 / 8), abs=1e-15)
    assert theorem_a2_argmax(**p) == pytest.approx(0.5)  # mu = 0: the bound peaks exactly at 1/2
    # lambda_l = mu_l = 1/2: theta = 1/2, gamma = G/(lam+mu) = 1/3 -> exact (1/2 - 1/3)/(2 * 2/3) = 1/8, (A32) 1/4
    p.update(lambda_l=0.5, mu_l=0.5)
    assert theorem_a2_argmax(**p) == pytest.approx(1 / 8)
    assert theorem_a2_argmax(**p, formula="A32") == pytest.approx(1 / 4)


@pytest.mark.parametrize("params", CASES)
def test_curve_equals_unsimplified_sum(params):
    d = params["d"]
    grid = np.arange(d + 1) / d
    expected = [_bound_unsimplified(r, **params) for r in grid]
    np.testing.assert_allclose(theorem_a2_curve(grid, **params), expected, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("params", CASES)
def test_sums_and_curve_match_a28_to_a33(params):
    lam, mu, g = _sums_literal(**params)
    np.testing.assert_allclose(theorem_a2_sums(**params), (lam, mu, g), rtol=1e-10, atol=1e-15)
    r = np.linspace(0, 1, 37)
    np.testing.assert_allclose(
        theorem_a2_curve(r, **params), _a29_to_a31(r, params["delta"], lam, mu, g), rtol=1e-9, atol=1e-14
    )


@pytest.mark.parametrize("params", CASES)
def test_argmax_matches_brute_force_and_lies_below_half(params):
    lam, mu, g = _sums_literal(**params)
    r = np.linspace(0, 1, 200_001)
    exact = theorem_a2_argmax(**params)
    paper = theorem_a2_argmax(**params, formula="A32")
    assert exact == pytest.approx(r[np.argmax(_a29_to_a31(r, params["delta"], lam, mu, g))], abs=1e-5)
    a31_only = _a29_to_a31(r, params["delta"], lam, mu, 0.0)  # G = 0 drops (A29); (A30) is a constant
    assert paper == pytest.approx(r[np.argmax(a31_only)], abs=1e-5)
    assert exact <= paper < 0.5
    assert theorem_a2_curve(exact, **params) > 0  # "f has positive maximum in [0, 1]"


@pytest.mark.parametrize("n, d, alpha_i, alpha_j", [(50, 20, 0.1, 0.8), (300, 64, 0.02, 0.9), (10, 100, 0.5, 0.5)])
@pytest.mark.parametrize("delta, mu", [(0.05, 0.01), (0.2, 0.05), (0.3, 0.1)])
def test_argmax_below_half_on_dense_grid(n, d, alpha_i, alpha_j, delta, mu):
    p = {
        "n": n,
        "d": d,
        "alpha_i": alpha_i,
        "alpha_j": alpha_j,
        "delta": delta,
        "k_mis": 0.8,
        "lambda_l": 0.5,
        "mu_l": mu,
    }
    r = np.linspace(0, 1, 100_001)
    f = theorem_a2_curve(r, **p)
    exact = theorem_a2_argmax(**p)
    assert exact == pytest.approx(r[np.argmax(f)], abs=1e-4)
    assert exact <= theorem_a2_argmax(**p, formula="A32") < 0.5


def test_mu_zero_peaks_at_half():
    p = {"n": 30, "d": 10, "alpha_i": 0.3, "alpha_j": 0.6, "delta": 0.2, "k_mis": 1.0, "lambda_l": 0.4, "mu_l": 0.0}
    assert theorem_a2_argmax(**p) == pytest.approx(0.5)
    assert theorem_a2_argmax(**p, formula="A32") == pytest.approx(0.5)


def test_vectorised_equals_scalar_loop():
    p = CASES[1]
    r = np.random.default_rng(0).uniform(0, 1, size=(3, 4))
    out = theorem_a2_curve(r, **p)
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, np.array([[theorem_a2_curve(x, **p) for x in row] for row in r]))


def test_scale_invariances():
    p = {"n": 40, "d": 12, "alpha_i": 0.2, "alpha_j": 0.7, "delta": 0.1, "k_mis": 1.0, "lambda_l": 0.8, "mu_l": 0.2}
    r = np.linspace(0, 1, 11)
    q = {**p, "k_mis": 0.25}
    np.testing.assert_allclose(theorem_a2_curve(r, **q), 0.25 * theorem_a2_curve(r, **p), rtol=1e-12, atol=1e-16)
    assert theorem_a2_argmax(**q) == pytest.approx(theorem_a2_argmax(**p))
    s = {**p, "lambda_l": 0.08, "mu_l": 0.02}
    assert theorem_a2_argmax(**s) == pytest.approx(theorem_a2_argmax(**p))
    assert theorem_a2_argmax(**{**p, "mu_l": 0.4}) < theorem_a2_argmax(**p)  # more harm from agreeing bits: lower peak


@pytest.mark.parametrize(
    "params",
    [
        {
            "n": 2,
            "d": 2,
            "alpha_i": 1e-200,
            "alpha_j": 1e-200,
            "delta": 0.5 - 1e-12,
            "k_mis": 1e-300,
            "lambda_l": 1e-300,
            "mu_l": 1e-300,
        },
        {
            "n": 20_000,
            "d": 512,
            "alpha_i": 0.3,
            "alpha_j": 0.7,
            "delta": 0.0,
            "k_mis": 1.0,
            "lambda_l": 1.0,
            "mu_l": 1.0,
        },
        {
            "n": 5_000,
            "d": 2,
            "alpha_i": 1e-9,
            "alpha_j": 1 - 1e-6,
            "delta": 0.49,
            "k_mis": 1.0,
            "lambda_l": 0.0,
            "mu_l": 1e-3,
        },
        {
            "n": 2,
            "d": 10_000,
            "alpha_i": 0.999,
            "alpha_j": 0.001,
            "delta": 0.3,
            "k_mis": 0.01,
            "lambda_l": 1.0,
            "mu_l": 0.0,
        },
    ],
)
def test_extreme_parameters_stay_finite(params):
    f = theorem_a2_curve(np.linspace(0, 1, 101), **params)
    assert np.all(np.isfinite(f))
    for formula in ("exact", "A32"):
        assert 0 <= theorem_a2_argmax(**params, formula=formula) <= 0.5


BASE = {"n": 10, "d": 8, "alpha_i": 0.2, "alpha_j": 0.5, "delta": 0.1, "k_mis": 1.0, "lambda_l": 0.5, "mu_l": 0.1}


@pytest.mark.parametrize(
    "change, name",
    [
        ({"n": 1}, "n"),
        ({"n": 0}, "n"),
        ({"n": 4.0}, "n"),
        ({"n": True}, "n"),
        ({"d": 1}, "d"),
        ({"d": -3}, "d"),
        ({"alpha_i": 0.0}, "alpha_i"),
        ({"alpha_j": 1.0}, "alpha_j"),
        ({"alpha_j": float("nan")}, "alpha_j"),
        ({"alpha_i": 0.6, "alpha_j": 0.5}, "alpha_i \\+ alpha_j"),
        ({"delta": 0.5}, "delta"),
        ({"delta": -0.1}, "delta"),
        ({"k_mis": 0.0}, "k_mis"),
        ({"k_mis": 1.5}, "k_mis"),
        ({"lambda_l": -0.1}, "lambda_l"),
        ({"mu_l": 2.0}, "mu_l"),
        ({"lambda_l": [0.5, 0.5]}, "lambda_l"),
        ({"mu_l": [[0.1] * 9]}, "mu_l"),
        ({"lambda_l": float("inf")}, "lambda_l"),
    ],
)
def test_bad_parameters_name_the_argument(change, name):
    params = {**BASE, **change}
    for call in (
        lambda: theorem_a2_curve(0.5, **params),
        lambda: theorem_a2_argmax(**params),
        lambda: theorem_a2_sums(**params),
    ):
        with pytest.raises(ValueError, match=f"^{name} "):
            call()


@pytest.mark.parametrize("r", [-0.01, 1.01, [0.2, float("nan")], [[0.5, 2.0]]])
def test_bad_r(r):
    with pytest.raises(ValueError, match="^r must lie in \\[0, 1\\]"):
        theorem_a2_curve(r, **BASE)


def test_argmax_bad_formula_and_all_zero_coefficients():
    with pytest.raises(ValueError, match="formula must be one of 'exact', 'A32'"):
        theorem_a2_argmax(**BASE, formula="a32")
    with pytest.raises(ValueError, match="lambda_l and mu_l must not all be 0"):
        theorem_a2_argmax(**{**BASE, "lambda_l": 0.0, "mu_l": 0.0})
    np.testing.assert_array_equal(theorem_a2_curve([0.0, 0.5], **{**BASE, "lambda_l": 0.0, "mu_l": 0.0}), [0.0, 0.0])


def test_plot_written_atomically(tmp_path):
    r = np.linspace(0, 1, 51)
    f = theorem_a2_curve(r, **BASE)
    out = tmp_path / "sub" / "bound.png"
    assert (
        plot_theorem_a2(r, f, theorem_a2_argmax(**BASE), out, paper_argmax=theorem_a2_argmax(**BASE, formula="A32"))
        == out
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_theorem_a2(r, f, 0.4, out)  # overwrite in place
    assert [p.name for p in out.parent.iterdir()] == ["bound.png"]


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros(3), np.zeros(4), 0.4), "equal length"),
        ((np.zeros(1), np.zeros(1), 0.4), "equal length"),
        ((np.zeros(3), np.array([0, np.nan, 0]), 0.4), "finite"),
        ((np.zeros(3), np.zeros(3), 1.5), "^argmax must lie"),
    ],
)
def test_plot_bad_input(tmp_path, args, match):
    with pytest.raises(ValueError, match=match):
        plot_theorem_a2(*args, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []
