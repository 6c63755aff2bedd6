"""The gate decides every (task, threshold) or says it cannot (issue 63): each test's p-value against scipy,
statsmodels and a likelihood maximised by hand; the cases where the gate used to pass what it could not have failed;
Kübler et al.'s verdict across tasks and the items beyond rerun noise on simulated runs where the truth is known."""

import json
import math

import numpy as np
import pytest
from independent import margin_p
from scipy.optimize import minimize_scalar
from scipy.stats import binom, chi2

from adaptguard.compat.evidence import p_beyond
from adaptguard.compat.gate import Threshold, check_gate, exit_status
from adaptguard.compat.render.decisions import describe
from adaptguard.compat.stats.metrics import exact_rate_ci, flip_metrics
from adaptguard.compat.stats.paired_drop import combined_drop_p, paired_drop_p, tango_z
from adaptguard.compat.stats.replicates import items_beyond_noise
from studies.simulate import simulate_runs


def entry(n, old_right, neg, pos, churn=False):
    """A single-run compare entry with the fields the gate reads."""
    from adaptguard.compat.stats.metrics import mcnemar_exact_p

    return {"n": n, "old_acc": old_right / n, "new_acc": (old_right - neg + pos) / n, "nfr": neg / n, "pfr": pos / n,
            "n_negative_flips": neg, "n_positive_flips": pos, "btc": (old_right - neg) / old_right if old_right else None,
            "mcnemar_p": mcnemar_exact_p(neg, pos), "inconsistency_flips": None,
            "churn": {"churn": churn, "chance": 0.5, "old_acc": old_right / n, "p_above_chance": 0.5 if churn else 0.0}}


def gate(tasks: dict, *exprs, alpha=0.05):
    return check_gate({"tasks": tasks}, [Threshold.parse(x) for x in exprs], alpha)


# ------------------------------------------------------------------------------------------- the tests' numbers
@pytest.mark.parametrize("b, c", [(5, 1), (1, 5), (0, 0), (12, 12), (30, 9)])
def test_the_exact_mcnemar_is_the_binomial_tail_and_half_of_statsmodels_two_sided(b, c):
    from statsmodels.stats.contingency_tables import mcnemar

    p = paired_drop_p(b, c, 100)
    assert p == pytest.approx(1.0 if b + c == 0 else binom.sf(b - 1, b + c, 0.5))
    if b > c:  # the two-sided exact test doubles the smaller tail
        table = [[50, b], [c, 100 - 50 - b - c]]
        assert p == pytest.approx(mcnemar(table, exact=True).pvalue / 2)
    assert paired_drop_p(b, c, 100, alternative="less") == pytest.approx(
        1.0 if b + c == 0 else binom.cdf(b, b + c, 0.5))


@pytest.mark.parametrize("b, c, n, margin", [(10, 3, 100, 0.02), (30, 2, 300, 0.05), (5, 9, 60, -0.05),
                                             (0, 4, 80, 0.01), (20, 4, 69, 0.1)])
def test_tangos_score_statistic_uses_the_restricted_maximum_likelihood(b, c, n, margin):
    """The restricted MLE of the wrong → right rate under H0 "drop = margin", maximised numerically from the
    multinomial likelihood, gives the same z as the closed form (the margin test's ordering, `tango_z`); at margin
    0 the score z is McNemar's."""
    from statsmodels.stats.contingency_tables import mcnemar

    m = n - b - c
    lo, hi = max(0.0, -margin) + 1e-12, (1 - margin) / 2 - 1e-12

    def nll(q):
        return -(b * math.log(q + margin) + (c * math.log(q) if c else 0) + m * math.log(1 - 2 * q - margin))

    q = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}).x
    z = ((b - c) / n - margin) / math.sqrt((2 * q + margin * (1 - margin)) / n)
    assert float(tango_z(b, c, n, margin)) == pytest.approx(z, rel=1e-6, abs=1e-9)
    if b + c:
        z0 = (b - c) / math.sqrt(b + c)
        stat = mcnemar([[n // 2, b], [c, n - n // 2 - b - c]], exact=False, correction=False).statistic
        assert z0 ** 2 == pytest.approx(stat)


@pytest.mark.parametrize("b, c, n, margin", [(5, 1, 12, 0.1), (1, 3, 12, -0.1), (2, 2, 10, 0.05), (3, 0, 10, 0.05),
                                             (6, 0, 14, 0.2), (0, 0, 9, 0.02)])
def test_the_margin_test_is_the_exact_unconditional_tail_by_brute_force(b, c, n, margin):
    """Against a margin the p-value is the largest probability, over every (right → wrong, wrong → right) pair of
    rates on the boundary, of a Tango z at least as extreme — enumerated here over every table with scipy's
    multinomial, on a finer grid of the nuisance rate than the implementation's."""
    from scipy.stats import multinomial

    tables = np.array([(x, y, n - x - y) for x in range(n + 1) for y in range(n + 1 - x)])
    z = np.array([float(tango_z(x, y, n, margin)) for x, y, _ in tables])
    z_obs = float(tango_z(b, c, n, margin))
    for alternative, region in (("greater", z >= z_obs - 1e-9), ("less", z <= z_obs + 1e-9)):
        best = 0.0
        for nu in np.linspace(max(0.0, -margin), (1 - margin) / 2, 1201):
            probs = [nu + margin, nu, max(0.0, 1 - 2 * nu - margin)]
            best = max(best, float(multinomial.pmf(tables[region], n, probs).sum()))
        assert paired_drop_p(b, c, n, margin, alternative) == pytest.approx(best, rel=1e-4, abs=1e-9)


@pytest.mark.parametrize("b, c, n, margin", [
    (40, 20, 300, 0.10),  # the sup's highest of two peaks, missed by a grid refined around its best point
    (3, 0, 10, 0.05), (1, 3, 12, -0.1), (0, 0, 5, 0.3), (5, 1, 12, 0.1),  # small n
    (10, 8, 200, 0.001), (8, 10, 200, -0.001),  # margins near 0
    (190, 0, 200, 0.95), (0, 190, 200, -0.95), (20, 0, 20, 0.99), (148, 1, 150, 0.98), (2, 1, 40, -0.9),  # near ±1
    (5, 9, 60, -0.05), (10, 30, 300, -0.1),  # negative margins
    (120, 80, 2000, 0.01), (30, 10, 1500, 0.02),  # large n
])
def test_the_margin_tests_supremum_is_global_by_brute_force(b, c, n, margin):
    """The margin test's p is the sup over the nuisance rate ν of the extreme region's probability, which can have
    several peaks: on 300 items with 40 broken and 20 fixed, "drop < 10 %" has p 0.103297, where a 201-point grid
    refined around its best point reported 0.103211. Ours is a bound (never below the sup) within 1e-6 of a brute
    force over a 2001-point grid refined at every local maximum, on tables at the edges, both alternatives."""
    for alternative in ("greater", "less"):
        ours = paired_drop_p(b, c, n, margin, alternative)
        brute = margin_p(b, c, n, margin, alternative == "greater")
        assert brute - 1e-12 <= ours <= brute + 1e-6, (alternative, ours, brute)


def test_the_margin_test_at_plus_and_minus_100_percent():
    """No drop exceeds 100 % or falls below −100 %: "drop > 100 %" is never supported and "drop < 100 %" is shown
    unless every item broke; the mirror at −100 % (issue 73, case 5: both were inverted)."""
    assert paired_drop_p(0, 0, 200, 1.0) == 1.0 and paired_drop_p(0, 0, 200, 1.0, "less") == 0.0
    assert paired_drop_p(200, 0, 200, 1.0, "less") == 1.0
    assert paired_drop_p(80, 0, 200, -1.0) == 0.0 and paired_drop_p(80, 0, 200, -1.0, "less") == 1.0
    assert paired_drop_p(0, 200, 200, -1.0) == 1.0


def test_paired_drop_p_refuses_impossible_counts():
    with pytest.raises(ValueError, match="need 0 ≤ b \\+ c ≤ n"):
        paired_drop_p(8, 5, 10)
    with pytest.raises(ValueError, match="alternative"):
        paired_drop_p(1, 1, 10, alternative="two-sided")


@pytest.mark.parametrize("k, n", [(0, 18), (20, 20), (3, 18), (7, 400)])
def test_exact_intervals_match_statsmodels_and_stay_in_0_1(k, n):
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = exact_rate_ci(k, n)
    want = proportion_confint(k, n, alpha=0.05, method="beta")
    assert (lo, hi) == pytest.approx(want, abs=1e-9)
    assert 0 <= lo <= k / n <= hi <= 1 and hi > lo  # never [0, 0] at 0 flips, nor [1, 1] at n of n


def test_compare_intervals_are_exact_not_a_collapsed_bootstrap():
    m = flip_metrics([1] * 18, [1] * 18, interval="exact")
    assert m["nfr_ci"][0] == 0 and m["nfr_ci"][1] == pytest.approx(1 - 0.025 ** (1 / 18))
    m = flip_metrics([1] * 20, [0] * 20, interval="exact")
    assert m["nfr_ci"][1] == 1 and m["nfr_ci"][0] == pytest.approx(0.025 ** (1 / 20))


def test_the_combined_p_values_against_their_definitions_and_under_the_null():
    p = [0.01, 0.5, 0.9, 0.2]
    got = combined_drop_p(p)
    assert got["fisher"] == pytest.approx(chi2.sf(-2 * sum(map(math.log, p)), 2 * len(p)))
    assert got["max_drop"] == pytest.approx(1 - (1 - 0.01) ** 4)
    rng = np.random.default_rng(0)  # uniform p-values: each combination rejects at its level
    sims = [combined_drop_p(rng.random(6)) for _ in range(4000)]
    for key in ("max_drop", "fisher"):
        rate = np.mean([s[key] < 0.05 for s in sims])
        assert abs(rate - 0.05) < 4 * math.sqrt(0.05 * 0.95 / 4000), key


# ---------------------------------------------------------------------- the cases that used to pass (issue 63)
def test_a_threshold_the_items_cannot_show_is_undecided_not_passed():
    """18 items and no flip: the true NFR may still be 15 % — `nfr>2%` cannot be clear (exit 3); at 400 items it is."""
    g = gate({"small": entry(18, 12, 0, 0)}, "nfr>2%")
    assert g["status"] == "undecided" and exit_status(g) == 3
    (d,) = g["decisions"]
    assert d["decision"] == "undecided" and d["why"].startswith("within")
    assert d["p_within"] == pytest.approx(0.98 ** 18)  # P(0 flips | NFR = 2 %): far from rejecting
    assert "not shown below it" in describe(g) and "gate: UNDECIDED" in describe(g)
    g = gate({"same": entry(18, 12, 0, 0)}, "acc_drop>2%")  # no item changed: no spread, so no MDE to promise
    assert g["decisions"][0]["mde"] is None and "0.00% at 80 % power" not in describe(g)
    g = gate({"large": entry(400, 300, 0, 3)}, "nfr>2%")
    assert g["status"] == "clear" and exit_status(g) == 0 and g["decisions"][0]["p_within"] == pytest.approx(0.98 ** 400)


def test_an_observed_breach_without_support_is_undecided_and_says_so():
    """t_piqa: 3 of 18 broke (16.7 %) against nfr>10%: above the threshold, binomial p 0.27 — not a pass."""
    g = gate({"t_piqa": entry(18, 10, 3, 0)}, "t_piqa:nfr>10%")
    (d,) = g["decisions"]
    assert d["decision"] == "undecided" and d["why"].startswith("beyond")
    assert d["p_value"] == pytest.approx(binom.sf(2, 18, 0.10))
    assert exit_status(g) == 3 and "but not significantly" in describe(g)
    g = gate({"all": entry(20, 20, 20, 0)}, "nfr>90%")  # 20 of 20 broke: 0.9^20 = 0.12, not support for > 90 %
    assert g["decisions"][0]["p_value"] == pytest.approx(0.9 ** 20) and exit_status(g) == 3


def test_a_supported_breach_fails_and_one_breach_outranks_undecided():
    g = gate({"a": entry(100, 60, 12, 1), "b": entry(18, 12, 0, 0)}, "nfr>2%")
    kinds = {d["task"]: d["decision"] for d in g["decisions"]}
    assert kinds == {"a": "breach", "b": "undecided"} and exit_status(g) == 1
    assert g["decisions"][0]["p_value"] == pytest.approx(binom.sf(11, 100, 0.02))


def test_churn_leaves_the_flip_metrics_never_the_accuracy_test_and_nothing_left_is_undecided():
    tasks = {"social_iqa": entry(300, 100, 150, 60, churn=True), "strategyqa": entry(300, 150, 160, 120, churn=True)}
    g = gate(tasks, "nfr>2%")
    assert g["decisions"] == [] and exit_status(g) == 3 and g["nothing_decided"]
    assert "churn" in g["nothing_decided"] and "no (task, threshold) was left to decide" in describe(g)
    g = gate(tasks, "acc_drop>2%")  # accuracy tests stay: 11.3 points lost on 300 items is decided
    assert [d["task"] for d in g["decisions"]] == ["social_iqa", "strategyqa"]
    assert g["decisions"][0]["decision"] == "breach" and exit_status(g) == 1
    assert g["decisions"][0]["p_value"] == pytest.approx(margin_p(150, 60, 300, 0.02, True), rel=1e-6)


def test_accuracy_drop_against_a_margin_uses_tango_and_at_zero_the_exact_mcnemar():
    e = entry(200, 120, 14, 4)
    assert p_beyond(e, "acc_drop", 0.0, ">") == pytest.approx(binom.sf(13, 18, 0.5))
    assert p_beyond(e, "acc_drop", 0.02, ">") == pytest.approx(margin_p(14, 4, 200, 0.02, True), rel=1e-6)
    g = gate({"t": e}, "acc_drop>0", "acc_drop>12%")
    assert [d["decision"] for d in g["decisions"]] == ["breach", "clear"]


def test_every_decision_agrees_between_the_table_the_sentence_and_the_json():
    from adaptguard.compat.render.report import table_rows, task_sentence, to_json

    report = {"tasks": {"a": entry(100, 60, 12, 1), "b": entry(18, 12, 0, 0)}, "alpha": 0.05}
    report["gate"] = check_gate(report, [Threshold.parse("nfr>2%")], 0.05)
    header, rows = table_rows(report)
    verdicts = {r[0]: r[header.index("verdict")] for r in rows}
    assert verdicts == {"a": "BREACH (nfr>2%)", "b": "undecided (nfr>2%)"}
    assert "Gate breach: nfr = 12.00% > 2.00%" in task_sentence("a", report["tasks"]["a"], report["gate"])
    assert "Gate undecided" in task_sentence("b", report["tasks"]["b"], report["gate"])
    decided = json.loads(to_json(report))["gate"]["decisions"]
    assert [(d["task"], d["decision"]) for d in decided] == [("a", "breach"), ("b", "undecided")]


# ------------------------------------------------------------------ Kübler et al.'s verdict across tasks
def _across_report(rng, tasks, n, share, alpha=0.05):
    """K tasks of one run per side (`simulate_runs`: each item answered by each model at its own difficulty); the new
    model loses 3 logits on a `share` of every task's items. Returns (the verdict across tasks at α/3 each, whether
    per-task BH at α flags any task)."""
    from adaptguard.compat.decide import across_tasks, pooled_entry
    from adaptguard.compat.stats.replicates import benjamini_hochberg

    olds, news, entries = [], [], []
    for _ in range(tasks):
        old, new, _ = simulate_runs(rng, n, 1, 1, sd_run=0.0, drop=3.0, share=share)
        olds.append(old), news.append(new)
        entries.append(flip_metrics(old[0], new[0], n_boot=1))
    p = across_tasks(entries, pooled_entry(olds, news))
    per_task = [p_beyond(e, "acc_drop", 0.0, ">") for e in entries]
    return min(p.values()) < alpha / 3, any(benjamini_hochberg(per_task, alpha)[0])


def test_the_verdict_across_tasks_holds_alpha_and_finds_a_thin_regression_that_bh_misses():
    rng = np.random.default_rng(3)
    null = [_across_report(rng, 10, 300, 0.0) for _ in range(300)]
    assert np.mean([a for a, _ in null]) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)
    thin = [_across_report(rng, 10, 300, 0.08) for _ in range(150)]  # a few points lost on every task
    across, bh = np.mean([a for a, _ in thin]), np.mean([b for _, b in thin])
    assert across > 0.7 and across > bh + 0.2


def test_overall_acc_drop_in_the_gate_combines_the_tasks():
    from adaptguard.compat.decide import across_tasks, pooled_entry

    rng = np.random.default_rng(4)
    tasks, olds, news = {}, [], []
    for k in range(4):
        old = rng.random(250) < 0.6
        new = old & (rng.random(250) > 0.04)
        tasks[f"t{k}"] = {**flip_metrics(old, new, n_boot=1), "_runs": ([old.astype(float)], [new.astype(float)])}
        olds.append(old[None]), news.append(new[None])
    pooled = pooled_entry(olds, news)
    report = {"tasks": tasks, "across_tasks": {"new": {"tasks": list(tasks), "pooled": pooled}}}
    g = check_gate(report, [Threshold.parse("overall:acc_drop>0.5%")], 0.05)
    (d,) = g["decisions"]
    p = across_tasks(list(tasks.values()), pooled, 0.005)
    assert d["task"] == "overall" and d["p_methods"] == p and d["p_value"] == pytest.approx(min(1, 3 * min(p.values())))
    assert d["decision"] == "breach"
    with pytest.raises(ValueError, match="across tasks only acc_drop"):
        check_gate(report, [Threshold.parse("overall:nfr>1%")], 0.05)


def test_the_pooled_entry_reports_clopper_pearson_intervals_of_the_pooled_counts():
    """One run per side: the pooled entry's NFR/PFR intervals are the exact ones of the pooled counts (statsmodels),
    as every task's entry, not a one-resample bootstrap's point."""
    from statsmodels.stats.proportion import proportion_confint

    from adaptguard.compat.decide import pooled_entry

    rng = np.random.default_rng(11)
    olds = [(rng.random((1, n)) < 0.5) for n in (120, 80)]
    news = [o ^ (rng.random(o.shape) < 0.1) for o in olds]
    pooled = pooled_entry(olds, news)
    o, n = np.concatenate(olds, 1)[0], np.concatenate(news, 1)[0]
    for key, count in (("nfr_ci", int(np.sum(o & ~n))), ("pfr_ci", int(np.sum(~o & n)))):
        want = proportion_confint(count, 200, alpha=0.05, method="beta")
        assert pooled[key] == pytest.approx(list(want)) and want[1] > want[0]


# ------------------------------------------------------------------------------- items beyond rerun noise
def test_items_beyond_noise_recover_planted_breaks_and_hold_the_false_discovery_rate():
    rng = np.random.default_rng(7)
    found = planted_total = false = flagged_total = 0
    for _ in range(20):
        old, new, shift = simulate_runs(rng, 400, 8, 8, drop=8.0, share=0.05, sd_run=0.2)
        out = items_beyond_noise(old, new, q=0.1)
        flagged = np.asarray(out["flagged"])
        breakable = (shift < 0) & (old.mean(0) >= 0.75)  # planted where the old model was reliably right
        found += (flagged & breakable).sum()
        planted_total += breakable.sum()
        false += (flagged & (shift == 0)).sum()
        flagged_total += flagged.sum()
        pairs = np.asarray(out["broke_pairs"])
        assert (pairs == old.sum(0) * (8 - new.sum(0))).all() and out["pairs"] == 64
    assert false / max(flagged_total, 1) <= 0.1 + 0.05  # the FDR at q = 0.1, with slack for 20 draws
    assert found / planted_total >= 0.8
    old, new, _ = simulate_runs(rng, 400, 3, 3, sd_run=0.2)
    out = items_beyond_noise(old, new)
    assert out["min_p"] == pytest.approx(1 / 64) and not any(out["flagged"])  # 3 + 3 runs cannot name an item


# ------------------------------------------------------------------------ the CLI on runs as users have them
def _runs(root, answers: dict, ts="2026-11-27T00-00-00.000000", n_choices=4):
    """One lm-eval run folder per side: {side: {task: 0/1 answers}}, multiple choice, prompts and choices logged."""
    for side, tasks in answers.items():
        folder = root / side
        folder.mkdir(parents=True, exist_ok=True)
        for task, correct in tasks.items():
            with open(folder / f"samples_{task}_{ts}.jsonl", "w") as f:
                for i, ok in enumerate(correct):
                    gold = i % n_choices
                    pick = gold if ok else (gold + 1) % n_choices
                    lls = [-1.0 if k == pick else -5.0 for k in range(n_choices)]
                    f.write(json.dumps({
                        "doc_id": i, "target": gold, "filter": "none", "metrics": ["acc"], "acc": float(ok),
                        "arguments": {f"gen_args_{k}": {"arg_0": f"{task} question {i}", "arg_1": f" w{i}_{k}"}
                                      for k in range(n_choices)},
                        "filtered_resps": [[str(x), "False"] for x in lls], "doc_hash": f"{task}{i}",
                        "prompt_hash": f"p{i}", "target_hash": str(gold)}) + "\n")
        results = folder / f"results_{ts}.json"
        results.write_text(json.dumps({"configs": {t: {"output_type": "multiple_choice"} for t in tasks},
                                       "n-shot": {t: 0 for t in tasks}}))
    return root


def _cli(*args):
    from in_process import run_cli

    return run_cli(*args)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    rng = np.random.default_rng(9)
    old = {t: rng.random(200) < 0.7 for t in ("alpha", "beta")}
    new = {t: old[t] & (rng.random(200) > (0.15 if t == "alpha" else 0.0)) for t in old}
    return _runs(tmp_path_factory.mktemp("two"), {"old": old, "new": new}), old, new


def test_the_latest_of_several_runs_in_a_folder_and_an_earlier_one_by_timestamp(two_runs, tmp_path):
    import shutil

    root, old, new = two_runs
    folder = tmp_path / "new"
    shutil.copytree(root / "new", folder)
    _runs(tmp_path, {"new": {"alpha": old["alpha"], "beta": old["beta"]}}, ts="2026-11-28T09-00-00.000000")
    proc = _cli("compare", root / "old", folder, "--json", tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["tasks"]["alpha"]["nfr"] == 0  # the latest run there is the old model again
    assert any("compared the latest (2026-11-28T09-00-00.000000)" in n for n in report["notes"])
    assert "name another as" in proc.stdout
    proc = _cli("compare", root / "old", f"{folder}@2026-11-27", "--json", tmp_path / "d.json")
    want = flip_metrics(old["alpha"], new["alpha"])["nfr"]
    assert json.loads((tmp_path / "d.json").read_text())["tasks"]["alpha"]["nfr"] == pytest.approx(want)
    proc = _cli("compare", root / "old", f"{folder}@2025", "--json", tmp_path / "e.json")
    assert proc.returncode == 2 and "no run with that timestamp" in proc.stderr and not (tmp_path / "e.json").exists()


def test_task_globs_common_tasks_and_a_metric_per_task(two_runs, tmp_path):
    import shutil

    root, old, new = two_runs
    fewer = tmp_path / "fewer"
    shutil.copytree(root / "new", fewer)
    for f in fewer.glob("samples_beta_*"):
        f.unlink()
    proc = _cli("compare", root / "old", fewer, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and "--common-tasks" in proc.stderr and not (tmp_path / "x.json").exists()
    proc = _cli("compare", root / "old", fewer, "--common-tasks", "--json", tmp_path / "c.json")
    report = json.loads((tmp_path / "c.json").read_text())
    assert proc.returncode == 0 and list(report["tasks"]) == ["alpha"]
    assert any("only in" in n and "beta" in n for n in report["notes"])
    proc = _cli("compare", root / "old", root / "new", "--tasks", "b*", "--json", tmp_path / "t.json")
    assert list(json.loads((tmp_path / "t.json").read_text())["tasks"]) == ["beta"]
    proc = _cli("compare", root / "old", root / "new", "--tasks", "zeta*")
    assert proc.returncode == 2 and "matches none of the tasks" in proc.stderr
    proc = _cli("compare", root / "old", root / "new", "--metric", "a*:acc", "--metric", "*:acc", "--json",
                tmp_path / "m.json")
    assert proc.returncode == 0 and json.loads((tmp_path / "m.json").read_text())["tasks"]["beta"]["metric"] == "acc"
    proc = _cli("compare", root / "old", root / "new", "--metric", "a*:exact_match", "--metric", "*:acc")
    assert proc.returncode == 2 and "exact_match" in proc.stderr  # alpha asked for a metric its samples lack


def test_outputs_to_stdout_one_path_twice_and_an_unwritable_path(two_runs, tmp_path, monkeypatch):
    root, old, new = two_runs
    monkeypatch.chdir(tmp_path)
    proc = _cli("compare", root / "old", root / "new", "--json", "-")
    assert proc.returncode == 0 and not (tmp_path / "-").exists()
    nfr = sum(o and not w for o, w in zip(old["alpha"], new["alpha"])) / len(old["alpha"])  # by hand
    assert json.loads(proc.stdout)["tasks"]["alpha"]["nfr"] == pytest.approx(nfr)
    proc = _cli("compare", root / "old", root / "new", "--json", tmp_path / "a.json", "--html", tmp_path / "a.json")
    assert proc.returncode == 2 and "--json and --html both write to" in proc.stderr
    assert not (tmp_path / "a.json").exists()
    # /sys takes no new files, even from root: the error names the user's path, not the temporary file beside it
    proc = _cli("compare", root / "old", root / "new", "--json", "/sys/kernel/c.json")
    assert proc.returncode == 2 and "/sys/kernel/c.json" in proc.stderr and ".c.json." not in proc.stderr


# ------------------------------------------------------------------ the shipped pair, and evalsig on the same runs
def test_the_shipped_pair_compares_offline_and_agrees_with_evalsig(tmp_path):
    """README's path 1 on a fresh install: `example:fp32 example:int8`. The accuracy gate at 0 is evalsig's
    one-sided McNemar on the same samples files (exact below 26 discordant items, as evalsig computes it there), and
    its MDE is evalsig's up to the n − 1 of a sample standard deviation."""
    evalsig = pytest.importorskip("evalsig", reason="the cross-check needs evalsig (pip install evalsig)")
    from evalsig.inference.mcnemar import mcnemar_test
    from evalsig.io.lm_eval import read_lm_eval_json

    from adaptguard.compat.reading.runs import example_run_path, find_sample_files

    proc = _cli("compare", "example:fp32", "example:int8", "--fail-on", "acc_drop>0", "--fail-on", "nfr>10%",
                "--json", tmp_path / "c.json", "--html", tmp_path / "c.html")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    decisions = {(d["task"], d["metric"]): d for d in report["gate"]["decisions"]}
    files = {side: find_sample_files(example_run_path(f"example:{side}")) for side in ("fp32", "int8")}
    for task in ("bb_general_knowledge", "bb_date_understanding"):
        frames = {side: read_lm_eval_json(files[side][task], model_id=side, task_id=task) for side in files}
        ids = [i.item_id for i in frames["fp32"].items]
        old = np.array([i.score for i in frames["fp32"].items])
        new = np.array([{i.item_id: i.score for i in frames["int8"].items}[k] for k in ids])
        theirs = mcnemar_test(new, old, alternative="greater")  # "old better than new", evalsig's orientation
        ours = decisions[(task, "acc_drop")]
        if theirs.b_wins + theirs.c_wins <= 25:
            assert ours["p_value"] == pytest.approx(theirs.p_value)
        report_entry = report["tasks"][task]
        assert report_entry["n_negative_flips"] == theirs.c_wins and report_entry["n_positive_flips"] == theirs.b_wins
        # min_delta 0 divides by zero in evalsig 0.1.2 when not significant: the smallest positive drop instead
        gate = evalsig.gate(frames["int8"], frames["fp32"], min_delta=1e-9, one_sided=True, method="mcnemar")
        assert (ours["decision"] == "breach") == (gate.verdict.value == "ALLOW")  # same decision class
        n = len(old)
        assert ours["mde"] * math.sqrt(n / (n - 1)) == pytest.approx(gate.comparison.mde, rel=1e-9)
    page = (tmp_path / "c.html").read_text()
    assert '<span class="right">right: </span>' in page and '<span class="wrong">wrong: </span>' in page
    assert '<ul class="decisions breach">' in page


def test_with_replicates_the_page_and_flips_name_items_beyond_rerun_noise(tmp_path):
    rng = np.random.default_rng(11)
    old, new, shift = simulate_runs(rng, 300, 8, 8, drop=8.0, share=0.05, sd_run=0.2)
    for r in range(8):
        _runs(tmp_path, {f"old{r}": {"t": old[r].astype(bool)}, f"new{r}": {"t": new[r].astype(bool)}})
    olds = ",".join(str(tmp_path / f"old{r}") for r in range(8))
    news = ",".join(str(tmp_path / f"new{r}") for r in range(8))
    proc = _cli("compare", olds, news, "--flips-out", tmp_path / "f.jsonl", "--html", tmp_path / "p.html", "--json",
                tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "c.json").read_text())["tasks"]["t"]
    # one NFR interval per quantity: the run-level one, a rate inside [0, 1]; no item-level one beside it
    lo, hi = entry["replicates"]["nfr_ci"]
    assert entry["nfr_ci"] is None and 0 <= lo <= entry["nfr"] <= hi <= 1 and entry["counts_are_means"]
    items = entry["items"]
    want = items_beyond_noise(old, new, q=0.05)
    assert items["flagged"] == want["flagged"] and any(want["flagged"])
    flips = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    negative = [f for f in flips if f["kind"] == "negative"]
    flagged = [f for f in negative if f["beyond_noise"]]
    assert negative[: len(flagged)] == flagged  # beyond-noise items first
    assert {f["doc_id"] for f in flagged} == {i for i, x in enumerate(want["flagged"]) if x}
    for f in negative:
        i = f["doc_id"]
        assert f["pairs"] == want["broke_pairs"][i] > 0 and f["of_pairs"] == 64
        assert f["old"] == f" w{i}_{i % 4}" and f["new"] != f["old"]  # an old run that was right, a new one wrong
    page = (tmp_path / "p.html").read_text()
    assert f"broke in {flagged[0]['pairs']} of 64 pairs — beyond rerun noise" in page
    assert 'id="beyond"' in page and "means over run pairs" in page
