"""Flips against the noise (issue 53): replicate runs, the noise floor, run-level intervals, chance churn, many
tasks, the gate — numbers against independent calculations and statsmodels, error rates on simulated runs where
the truth is known, and `adaptguard compare` end to end on lm-eval sample logs written from known answers."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from in_process import run_cli

from adaptguard.compat.stats.replicates import (
    above_chance_p,
    benjamini_hochberg,
    chance_rate,
    min_detectable_effect,
    paired_runs_difference,
    replicate_flips,
)
from studies.simulate import simulate_runs, true_excess_nfr


# ---------------------------------------------------------------------------------------------- the point values
def brute_force(old, new):
    """Cross NFR over every (old, new) pair and the noise floor over every ordered pair of distinct runs of one
    side, pooled over both sides — by loops over pairs."""
    cross = [np.mean(o & ~n) for o in old for n in new]
    within = [np.mean(a & ~b) for side in (old, new) for i, a in enumerate(side) for k, b in enumerate(side) if i != k]
    return np.mean(cross), (np.mean(within) if within else None)


@pytest.mark.parametrize("r_old, r_new", [(1, 1), (1, 2), (1, 3), (2, 2), (3, 4), (5, 1)])
def test_noise_floor_and_excess_equal_the_pairwise_rates(r_old, r_new):
    rng = np.random.default_rng(r_old * 10 + r_new)
    old, new, _ = simulate_runs(rng, 300, r_old, r_new, drop=1.0, share=0.3)
    old, new = old.astype(bool), new.astype(bool)
    r = replicate_flips(old, new)
    cross, floor = brute_force(old, new)
    assert r["nfr"] == pytest.approx(cross)
    assert np.allclose(r["pair_nfr"], [[np.mean(o & ~n) for n in new] for o in old])
    assert r["old_acc"] == pytest.approx(old.mean()) and r["new_acc"] == pytest.approx(new.mean())
    if r_old == r_new == 1:
        assert r["runs_fixed"] and r["noise_floor"] is None and r["excess_nfr"] is None
        assert r["tested"] == "nfr_minus_pfr" and r["estimate"] == pytest.approx(np.mean(old & ~new) -
                                                                                np.mean(~old & new))
    else:
        assert not r["runs_fixed"] and r["tested"] == "excess_nfr"
        assert r["noise_floor"] == pytest.approx(floor) and r["excess_nfr"] == pytest.approx(cross - floor)
    for side, runs in (("new", r_new), ("old", r_old)):
        assert (f"spread_{side}" in r) == (runs >= 3)
    # the runs' own variance is estimable when leaving any run out keeps a floor
    assert r["run_level"] == (max(r_old, r_new) >= 3 or min(r_old, r_new) >= 2)


def test_one_run_per_side_is_mcnemar():
    from statsmodels.stats.contingency_tables import mcnemar

    rng = np.random.default_rng(3)
    old, new = rng.random(200) < 0.6, rng.random(200) < 0.5
    r = replicate_flips(old, new)
    b, c = int((old & ~new).sum()), int((~old & new).sum())
    two_sided = mcnemar([[0, b], [c, 0]], exact=True).pvalue
    # one-sided exact: P(X ≥ b), X ~ Bin(b + c, 1/2), half the two-sided value when b > c
    assert b > c and r["p_value"] == pytest.approx(two_sided / 2, rel=1e-9)


def test_a_run_identical_to_its_replicate_has_no_floor():
    runs = np.array([[1, 0, 1, 1], [1, 0, 1, 1]], bool)
    r = replicate_flips(runs, runs)
    assert r["noise_floor"] == 0 and r["excess_nfr"] == 0 and r["nfr"] == 0


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="old has 3 items per run but new has 4"):
        replicate_flips([[1, 0, 1]], [[1, 0, 1, 1]])
    with pytest.raises(ValueError, match="booleans or 0/1"):
        replicate_flips([[1, 2, 0]], [[1, 0, 0]])
    with pytest.raises(ValueError, match="same \\(seeds, items\\) shape"):
        paired_runs_difference([[1, 0]], [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="method must be"):
        replicate_flips([1, 0], [0, 1], method="jackknife")


# ------------------------------------------------------------------------------------------------ the variance
@pytest.mark.parametrize("s", [2, 5])
def test_crossed_variance_of_a_mean_equals_the_two_way_moments(s):
    """For a plain mean over a seeds × items table the estimate is Var(row means)/S + Var(column means)/N minus the
    churn the two share, each computed here by loops (two seeds: the fewest with a run-level part)."""
    rng = np.random.default_rng(0)
    n = 60
    x = rng.normal(0, 1, (s, n)) + rng.normal(0, 0.5, (s, 1)) + rng.normal(0, 0.8, (1, n))
    r = paired_runs_difference(x.clip(-1, 1) > 0, np.zeros((s, n), bool))
    y = (x.clip(-1, 1) > 0).astype(float)
    rows = [sum(y[k]) / n for k in range(s)]
    cols = [sum(y[:, i]) / s for i in range(n)]
    v_rows = sum((v - sum(rows) / s) ** 2 for v in rows) / (s - 1) / s
    v_cols = sum((v - sum(cols) / n) ** 2 for v in cols) / (n - 1) / n
    v_churn = sum(sum((y[k, i] - cols[i]) ** 2 for k in range(s)) / (s - 1) for i in range(n)) / n / (s * n)
    assert r["se"] ** 2 == pytest.approx(v_cols + max(0.0, v_rows - v_churn))
    assert r["variance_parts"]["v_runs"] == pytest.approx(v_rows)


def test_run_level_se_agrees_with_a_crossed_mixed_model():
    """statsmodels' linear mixed model with crossed random effects of seed and item (REML) gives the intercept's
    standard error independently; with run effects large and small the two agree within 10 %."""
    import warnings

    import pandas as pd
    import statsmodels.formula.api as smf

    for sd_run, seed in ((0.8, 7), (0.8, 9), (0.2, 7), (0.2, 8)):
        rng = np.random.default_rng(seed)
        s, n = 10, 150
        b = rng.normal(0, 1.5, n)
        arm = (b + rng.normal(0, sd_run, (s, 1)) + rng.logistic(0, 1, (s, n)) > 0).astype(float)
        ctl = (b + rng.normal(0, sd_run, (s, 1)) + rng.logistic(0, 1, (s, n)) > 0).astype(float)
        ours = paired_runs_difference(arm, ctl)
        d = pd.DataFrame({"x": (arm - ctl).ravel(), "seed": np.repeat(np.arange(s), n), "item": np.tile(np.arange(n), s),
                          "g": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the optimiser's notes on its path, not on the fit it returns
            fit = smf.mixedlm("x ~ 1", d, groups="g", vc_formula={"seed": "0 + C(seed)", "item": "0 + C(item)"}
                              ).fit(reml=True, method=["lbfgs", "powell"])
        assert fit.converged
        assert ours["diff"] == pytest.approx(fit.params["Intercept"], abs=1e-9)
        assert ours["se"] == pytest.approx(fit.bse["Intercept"], rel=0.10)


def test_min_detectable_effect_matches_statsmodels_power():
    from statsmodels.stats.power import NormalIndPower, TTestPower

    se, n = 0.01, 8
    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8)  # in SDs of one run
    assert min_detectable_effect(se, n - 1) == pytest.approx(d * se * math.sqrt(n), rel=2e-3)
    # with the runs fixed (infinite df), the normal test; statsmodels' one-sample form is ratio=0
    z = NormalIndPower().solve_power(effect_size=None, nobs1=1, ratio=0, alpha=0.05, power=0.8)
    assert min_detectable_effect(se, math.inf) == pytest.approx(z * se, rel=1e-3)


def test_benjamini_hochberg_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216]
    reject, adjusted = benjamini_hochberg(p, 0.05)
    want_reject, want_adjusted, *_ = multipletests(p, 0.05, method="fdr_bh")
    assert reject == list(want_reject) and adjusted == pytest.approx(list(want_adjusted))


def test_chance_rate_and_the_test_above_it():
    from scipy.stats import binom

    assert chance_rate([4, 4, 2, 2], [0, 1, 2, 3]) == pytest.approx(0.375)  # mean of 1/#choices
    # the same answer every time scores the most common gold answer's share: 0.5 here
    assert chance_rate([4, 4, 2, 2], [0, 1, 0, 0]) == pytest.approx(0.75)
    # unbalanced binary labels: always answering the majority label scores 0.8
    assert chance_rate([2] * 10, ["True"] * 8 + ["False"] * 2) == pytest.approx(0.8)
    assert above_chance_p(60, 100, 0.5) == pytest.approx(binom.sf(59, 100, 0.5))
    with pytest.raises(ValueError, match="gold has 2 items but n_choices has 3"):
        chance_rate([2, 2, 2], [0, 1])


# --------------------------------------------------------------------------------- simulation, truth known
def simulated(runs_old, runs_new, sims, seed, **kw):
    rng = np.random.default_rng(seed)
    truth = true_excess_nfr(runs_old, runs_new, **kw)
    results = [replicate_flips(*simulate_runs(rng, 400, runs_old, runs_new, **kw)[:2]) for _ in range(sims)]
    return truth, results


def test_the_gate_raises_few_false_alarms_when_nothing_regressed():
    """300 fixed simulated comparisons with run noise and no true regression: a calibrated one-sided test at
    α = 0.05 rejects 15 of them on average (sd of the count ≈ 3.8); the bound is 3 sd above."""
    truth, results = simulated(3, 3, 300, seed=11, sd_run=0.3)
    assert truth == pytest.approx(0, abs=1e-12)
    alarms = sum(r["p_value"] < 0.05 for r in results)
    assert alarms <= 27
    raw = sum(r["excess_nfr"] > 0 for r in results)
    assert raw > 100  # a gate on the raw excess would fail about half of these releases


def test_planted_regressions_are_found_and_the_interval_covers_the_truth():
    truth, results = simulated(3, 3, 200, seed=12, drop=5.0, share=0.3, sd_run=0.3)
    assert truth > 0.1  # the planted regression, beyond the noise floor
    found = sum(r["p_value"] < 0.05 for r in results)
    covered = sum(r["ci"][0] <= truth <= r["ci"][1] for r in results)
    assert found >= 190  # power ≈ 1 at this size
    assert 0.88 <= covered / len(results) <= 0.995  # near the nominal 95 %


def test_item_level_interval_alone_undercovers_when_runs_vary():
    """Why runs count: with a run effect, an interval that resamples items only (runs fixed) misses the truth far
    more often than 5 %, while the run-level one holds."""
    from adaptguard.compat.stats.metrics import paired_seeds_difference

    rng = np.random.default_rng(13)
    item_only = run_level = 0
    for _ in range(150):
        b = rng.normal(0.5, 2, 400)
        v1 = b + rng.logistic(0, 1, 400) > 0
        arms = [(b + rng.normal(0, 0.8, (3, 1)) + rng.logistic(0, 1, (3, 400)) > 0) for _ in range(2)]
        neg = [v1 & ~a for a in arms]
        lo, hi = paired_seeds_difference(neg[0], neg[1], n_boot=400, seed=0)["ci"]
        item_only += lo <= 0 <= hi
        lo, hi = paired_runs_difference(neg[0], neg[1])["ci"]
        run_level += lo <= 0 <= hi
    assert item_only / 150 < 0.8 and run_level / 150 >= 0.88


# -------------------------------------------------------------------------- `adaptguard compare` end to end
def write_run(folder: Path, task: str, correct, n_choices: int, gold=None) -> Path:
    """An lm-eval `--log_samples` run of one multiple-choice task whose answers are `correct` (0/1 per item)."""
    folder.mkdir(parents=True, exist_ok=True)
    ts = "2026-11-27T00-00-00.000000"
    with open(folder / f"samples_{task}_{ts}.jsonl", "w") as f:
        for i, ok in enumerate(correct):
            target = (i % n_choices) if gold is None else gold[i]
            lls = [-5.0] * n_choices
            lls[target if ok else (target + 1) % n_choices] = -1.0
            f.write(json.dumps({"doc_id": i, "target": target, "filtered_resps": [[str(x), "False"] for x in lls],
                                "filter": "none", "metrics": ["acc"], "doc_hash": f"d{i}", "prompt_hash": f"p{i}",
                                "target_hash": str(target), "acc": float(ok)}) + "\n")
    results = folder / f"results_{ts}.json"
    configs = json.loads(results.read_text())["configs"] if results.exists() else {}
    results.write_text(json.dumps({"configs": {**configs, task: {"output_type": "multiple_choice"}},
                                   "n-shot": {t: 0 for t in [*configs, task]}}))
    return folder


@pytest.fixture(scope="module")
def replicate_runs(tmp_path_factory):
    """Three runs of an old and of a new model on two tasks: `broken` (the new model loses 25 % of the items it had)
    and `coin` (a binary task both answer at chance: churn)."""
    root = tmp_path_factory.mktemp("replicates")
    rng = np.random.default_rng(5)
    answers = {}
    old_b, new_b, _ = simulate_runs(rng, 400, 3, 3, drop=4.0, share=0.25, sd_run=0.2)
    coin_old, coin_new = rng.random((3, 300)) < 0.5, rng.random((3, 300)) < 0.5
    for side, broken, coin in (("old", old_b, coin_old), ("new", new_b, coin_new)):
        for r in range(3):
            write_run(root / f"{side}{r}", "broken", broken[r], 4)
            write_run(root / f"{side}{r}", "coin", coin[r], 2, gold=[i % 2 for i in range(300)])
        answers[side] = {"broken": broken.astype(bool), "coin": coin.astype(bool)}
    return root, answers


def test_compare_with_replicates_reports_the_floor_churn_and_the_overall(replicate_runs, tmp_path):
    root, answers = replicate_runs
    olds = ",".join(str(root / f"old{r}") for r in range(3))
    news = ",".join(str(root / f"new{r}") for r in range(3))
    proc = run_cli("compare", olds, news, "--json", tmp_path / "c.json", "--markdown", tmp_path / "c.md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["runs"] == {"old": 3, "new": [3]}
    broken, coin = report["tasks"]["broken"], report["tasks"]["coin"]
    cross, floor = brute_force(answers["old"]["broken"], answers["new"]["broken"])
    assert broken["replicates"]["noise_floor"] == pytest.approx(floor)
    assert broken["replicates"]["excess_nfr"] == pytest.approx(cross - floor)
    assert broken["nfr"] == pytest.approx(cross)  # the table's NFR: the mean over the 9 pairs
    assert broken["regression"]["flagged"] and not broken["churn"]["churn"]
    assert coin["churn"]["churn"] and coin["churn"]["chance"] == pytest.approx(0.5)
    assert "regression" not in coin  # churn is kept out of the tasks' BH family
    overall = report["overall"]["new0"]
    assert overall["tasks"] == 1 and overall["excess_nfr"] == pytest.approx(cross - floor)  # coin left out
    text = proc.stdout
    assert "noise floor" in text and "churn" in text and "excess" in text
    assert "Run-to-run variance was not measured" not in text


def test_the_gate_on_excess_nfr_fails_passes_and_says_when_it_cannot_see(replicate_runs, tmp_path):
    root, _ = replicate_runs
    olds = ",".join(str(root / f"old{r}") for r in range(3))
    news = ",".join(str(root / f"new{r}") for r in range(3))
    proc = run_cli("compare", olds, news, "--fail-on", "excess_nfr>1%")
    assert proc.returncode == 1 and "broken: excess_nfr" in proc.stderr and "t-test over runs and items" in \
        proc.stderr, proc.stderr[-2000:]
    assert "left out: coin (churn:" in proc.stderr
    proc = run_cli("compare", olds, news, "--fail-on", "excess_nfr>60%")
    assert proc.returncode == 0, proc.stdout[-2000:]
    # a threshold below what 2 + 2 runs of 400 items can resolve: no breach is not a pass, exit 3 and a line saying
    # what the data detect
    proc = run_cli("compare", f"{root / 'old0'},{root / 'old1'}", f"{root / 'old2'},{root / 'new0'}",
                   "--fail-on", "broken:excess_nfr>0.1%")
    assert proc.returncode in (1, 3), proc.stderr[-2000:]
    if proc.returncode == 3:
        assert "gate: UNDECIDED" in proc.stderr and "undecided: broken: excess_nfr" in proc.stderr
        assert "at 80 % power" in proc.stderr


def test_one_run_per_side_says_run_variance_was_not_measured(replicate_runs):
    root, _ = replicate_runs
    proc = run_cli("compare", root / "old0", root / "new0")
    assert proc.returncode == 0 and "Run-to-run variance was not measured" in proc.stdout


@pytest.mark.parametrize("case, message", [
    ("twice", "is listed twice as a replicate of one side"),
    ("both", "is given as both an old and a new run"),
    ("documents", "different documents"),
])
def test_bad_replicates_are_one_line_errors_and_write_nothing(replicate_runs, tmp_path, case, message):
    root, answers = replicate_runs
    if case == "twice":
        args = [f"{root / 'old0'},{root / 'old0'}", str(root / "new0")]
    elif case == "both":
        args = [f"{root / 'old0'},{root / 'old1'}", f"{root / 'new0'},{root / 'old1'}"]
    else:
        short = tmp_path / "short"
        write_run(short, "broken", answers["old"]["broken"][1][:200], 4)
        write_run(short, "coin", answers["old"]["coin"][1], 2, gold=[i % 2 for i in range(300)])
        args = [f"{root / 'old0'},{short}", str(root / "new0")]
    proc = run_cli("compare", *args, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()


def test_the_majority_label_counts_as_chance_only_for_a_fixed_label_set(tmp_path):
    """Gold at choice 0 on 90 % of items: where every item offers the same choices (a label set), always answering
    that label scores 0.9, the chance a model must beat; where each item has its own choices, the position of the
    gold is no label, and chance is 1/#choices."""
    for side in ("old", "new"):  # each answers half the items right
        folder = tmp_path / side
        folder.mkdir()
        with open(folder / "samples_fixed_2026-11-27T00-00-00.000000.jsonl", "w") as f1, \
                open(folder / "samples_varying_2026-11-27T00-00-00.000000.jsonl", "w") as f2:
            for i in range(100):
                gold = 0 if i % 10 else 1
                ok = (i % 2 == 0) if side == "old" else (i % 4 < 2)
                for f, words in ((f1, ["yes", "no", "maybe", "never"]), (f2, [f"w{i}_{k}" for k in range(4)])):
                    lls = [-5.0] * 4
                    lls[gold if ok else (gold + 1) % 4] = -1.0
                    f.write(json.dumps({
                        "doc_id": i, "target": gold, "filter": "none", "metrics": ["acc"], "acc": float(ok),
                        "arguments": {f"gen_args_{k}": {"arg_0": f"q{i}", "arg_1": f" {w}"} for k, w in enumerate(words)},
                        "filtered_resps": [[str(x), "False"] for x in lls], "doc_hash": f"d{i}", "target_hash": str(gold),
                        "prompt_hash": f"p{i}"}) + "\n")
        (folder / "results_2026-11-27T00-00-00.000000.json").write_text(json.dumps(
            {"configs": {t: {"output_type": "multiple_choice"} for t in ("fixed", "varying")},
             "n-shot": {"fixed": 0, "varying": 0}}))
    proc = run_cli("compare", tmp_path / "old", tmp_path / "new", "--json", tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    tasks = json.loads((tmp_path / "c.json").read_text())["tasks"]
    assert tasks["fixed"]["churn"]["chance"] == pytest.approx(0.9) and tasks["fixed"]["churn"]["churn"]
    assert tasks["varying"]["churn"]["chance"] == pytest.approx(0.25) and not tasks["varying"]["churn"]["churn"]


def test_records_without_their_choices_take_one_over_the_number_of_choices_as_chance(tmp_path):
    """A trimmed log (no `arguments`, so no choices to compare across items) says nothing of a fixed label set: gold
    at choice 0 on 90 % of items, chance is 1/#choices (0.25), not the majority label's share."""
    for side in ("old", "new"):
        folder = tmp_path / side
        folder.mkdir()
        with open(folder / "samples_trimmed_2026-11-27T00-00-00.000000.jsonl", "w") as f:
            for i in range(100):
                gold, ok = (0 if i % 10 else 1), (i % 2 == 0) if side == "old" else (i % 4 < 2)
                lls = [-5.0] * 4
                lls[gold if ok else (gold + 1) % 4] = -1.0
                f.write(json.dumps({"doc_id": i, "target": gold, "filter": "none", "metrics": ["acc"], "acc": float(ok),
                                    "filtered_resps": [[str(x), "False"] for x in lls], "doc_hash": f"d{i}"}) + "\n")
    proc = run_cli("compare", tmp_path / "old", tmp_path / "new", "--json", tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    churn = json.loads((tmp_path / "c.json").read_text())["tasks"]["trimmed"]["churn"]
    assert churn["chance"] == pytest.approx(0.25) and not churn["churn"]


def test_the_replicate_statistics_equal_their_definitions_by_loops():
    """The cross NFR, the noise floor, the excess and both standard errors with their degrees of freedom, against
    tests/independent.py's loops over run pairs and deleted runs, on random designs of 1–3 runs a side."""
    from independent import per_item_flips, replicate_se

    rng = np.random.default_rng(95)
    for _ in range(30):
        r_o, r_n, n = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(5, 40))
        if r_o + r_n < 3:
            continue
        old, new = rng.random((r_o, n)) < rng.uniform(0.4, 0.9), rng.random((r_n, n)) < rng.uniform(0.4, 0.9)
        r = replicate_flips(old, new, level=0.9)
        cross, floor = per_item_flips(old, new)
        assert (r["nfr"], r["noise_floor"], r["excess_nfr"]) == (
            pytest.approx(cross.mean(), abs=1e-12), pytest.approx(floor.mean(), abs=1e-12),
            pytest.approx((cross - floor).mean(), abs=1e-12))
        se, df = replicate_se(old, new, "excess")
        assert (r["se"], r["df"]) == (pytest.approx(se, rel=1e-9, abs=1e-15), pytest.approx(df, rel=1e-9))
        se, df = replicate_se(old, new, "nfr")
        assert (r["nfr_se"], r["nfr_df"]) == (pytest.approx(se, rel=1e-9, abs=1e-15), pytest.approx(df, rel=1e-9))


def test_the_two_level_bootstrap_se_by_loops_on_the_same_draws():
    """method="bootstrap" (kept for docs/compat.md's comparison): each side's runs drawn with replacement, then the
    items; the excess NFR of each resample by loops: the cross NFR over every (old draw, new draw) pair, the floor
    over every ordered pair of two draws of different runs of one side (a run drawn twice makes no pair with itself),
    on the same random draws; the SE is their standard deviation."""
    rng_data = np.random.default_rng(4)
    old, new = rng_data.random((3, 40)) < 0.7, rng_data.random((2, 40)) < 0.6
    got = replicate_flips(old, new, method="bootstrap", n_boot=200, seed=11)["se"]
    rng = np.random.default_rng(11)
    stats = []
    for _ in range(200):
        co, cn = rng.multinomial(3, [1 / 3] * 3), rng.multinomial(2, [1 / 2] * 2)
        drawn_old = [r for r in range(3) for _ in range(co[r])]  # the runs drawn, with repeats
        drawn_new = [r for r in range(2) for _ in range(cn[r])]
        pairs = [(side, x, y) for side, drawn in (("o", drawn_old), ("n", drawn_new))
                 for i, x in enumerate(drawn) for j, y in enumerate(drawn) if i != j and x != y]
        if not pairs:
            continue
        items = rng.integers(0, 40, 40)
        runs = {"o": old, "n": new}
        total = 0.0
        for i in items:
            cross = sum(old[x, i] and not new[y, i] for x in drawn_old for y in drawn_new) / 6
            floor = sum(runs[s][x, i] and not runs[s][y, i] for s, x, y in pairs) / len(pairs)
            total += cross - floor
        stats.append(total / 40)
    assert got == pytest.approx(np.std(stats, ddof=1), rel=1e-9)


def test_the_paired_difference_interval_and_its_edges_by_hand():
    """ci = diff ± t_{df, (1 + level)/2} · se (scipy's t quantile); with no spread at all the p-value is 1 at a
    difference of 0 and 0 otherwise."""
    from scipy.stats import t

    from adaptguard.compat.stats.replicates import paired_runs_difference

    rng = np.random.default_rng(8)
    a, b = rng.random((3, 60)) < 0.3, rng.random((3, 60)) < 0.2
    r = paired_runs_difference(a, b, level=0.9)
    half = t.ppf(0.95, r["df"]) * r["se"]
    assert r["ci"] == (pytest.approx(r["diff"] - half), pytest.approx(r["diff"] + half))
    assert r["diff"] == pytest.approx((a.astype(float) - b.astype(float)).mean())
    same = np.ones((2, 10), bool)
    assert paired_runs_difference(same, same)["p_value"] == 1.0
    shifted = paired_runs_difference(same, np.zeros((2, 10), bool))
    assert (shifted["diff"], shifted["se"], shifted["p_value"]) == (1.0, 0.0, 0.0)


def test_a_chance_level_needs_counts_of_choices():
    from adaptguard.compat.stats.replicates import chance_rate

    for bad in ([], [0, 2]):
        with pytest.raises(ValueError) as err:
            chance_rate([0] * len(bad), bad)
        assert str(err.value) == "n_choices must be a non-empty list of counts ≥ 1"


def test_the_paired_bootstrap_by_loops_on_the_same_draws():
    """`method="bootstrap"` (E5's registered form): each resample draws S seeds with replacement (a seed's A and B
    rows together) and N items with replacement; the difference's SE is the resamples' sample sd and df = S − 1.
    Recomputed here by loops over seeds and items, with the same generator drawing the same counts in the same
    order (blocks of 500 resamples: the seeds' counts, then the items')."""
    rng = np.random.default_rng(4)
    s, n, n_boot = 3, 25, 1200
    a, b = rng.random((s, n)) < 0.3, rng.random((s, n)) < 0.2
    r = paired_runs_difference(a, b, method="bootstrap", n_boot=n_boot, seed=11)
    x = a.astype(int) - b.astype(int)
    draw, stats = np.random.default_rng(11), []
    for start in range(0, n_boot, 500):
        k = min(500, n_boot - start)
        seed_counts = draw.multinomial(s, [1 / s] * s, size=k)
        item_counts = draw.multinomial(n, [1 / n] * n, size=k)
        for j in range(k):
            stats.append(sum(seed_counts[j][q] * item_counts[j][i] * x[q][i] for q in range(s) for i in range(n))
                         / (s * n))
    mean = sum(stats) / len(stats)
    sd = (sum((v - mean) ** 2 for v in stats) / (len(stats) - 1)) ** 0.5
    assert len(stats) == n_boot and r["se"] == pytest.approx(sd, rel=1e-12) and r["df"] == s - 1
    assert r["diff"] == pytest.approx(x.mean())
    t = scipy.stats.t.ppf(0.975, s - 1)
    assert r["ci"] == pytest.approx((x.mean() - t * sd, x.mean() + t * sd), rel=1e-9)
    assert r["p_value"] == pytest.approx(2 * scipy.stats.t.sf(abs(x.mean()) / sd, s - 1), rel=1e-9)
