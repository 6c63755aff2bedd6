"""The update's verdict (issue 88.3): one frozen `UpdateVerdict` built by `pick_report.verdict` from the dev choices
and the test results, its status a decision of the project's one vocabulary (`compat.verdicts`). The page's status
and colour and the Markdown's sentence come from it in each of the four cases, never from reading a sentence back."""

import html

import pytest

from adaptguard.compat.verdicts import NOTHING_GATED, OUTCOMES, Decision

CONTROL = {"recipe": "control", "label": "control (lr 0.002, 1 epoch)", "acc": 0.80, "nfr": 0.10, "pfr": 0.05,
           "btc": 0.90}
FOCAL = {"recipe": "focal", "label": "focal (lr 0.002, 2 epochs, distill_weight 1)", "acc": 0.79, "nfr": 0.06,
         "pfr": 0.04, "btc": 0.92}


def choices(shipped: str) -> dict:
    """Hand-built dev choices: the pick is focal (`shipped` "pick") or the control itself ("control")."""
    chosen = 1 if shipped == "pick" else 0
    return {"rule": "lowest dev NFR among settings with dev accuracy ≥ the best control's − 0.01", "chosen": chosen,
            "best_control": 0, "accuracy_floor": 0.79, "matched": True, "dev_seeds": [0],
            "chosen_setting": [CONTROL, FOCAL][chosen], "best_control_setting": CONTROL, "v1_dev_acc": 0.82,
            "v2_dev_acc": 0.78, "v2_dev_nfr": 0.12, "n_dev": 40, "settings": [CONTROL, FOCAL]}


def results_on_test(ci: tuple[float, float] | None) -> dict:
    """Hand-built test results; `ci`: the 95 % interval of the pick − control Δ NFR (None: the control shipped)."""
    arms = {"v2": {"new_acc": 0.76, "nfr": 0.125, "pfr": 0.05, "btc": 0.88, "per_seed_nfr": [0.125]},
            "control": {"new_acc": 0.80, "nfr": 0.100, "pfr": 0.05, "btc": 0.90, "per_seed_nfr": [0.1, 0.1]}}
    comparison = None
    if ci is not None:
        arms = {"v2": arms["v2"], "pick": {"new_acc": 0.79, "nfr": 0.075, "pfr": 0.04, "btc": 0.92,
                                           "per_seed_nfr": [0.075, 0.075]}, "control": arms["control"]}
        comparison = {"delta_nfr": (ci[0] + ci[1]) / 2, "delta_nfr_ci": list(ci), "delta_nfr_se": 0.01,
                      "delta_nfr_df": 1, "delta_nfr_mde": 0.05, "delta_acc": -0.01, "delta_acc_ci": [-0.04, 0.02],
                      "runs_fixed": False, "per_seed": [{"mcnemar_p": 0.031, "n_a_only": 1, "n_b_only": 6},
                                                        {"mcnemar_p": 0.22, "n_a_only": 2, "n_b_only": 5}]}
    return {"seeds": [0, 1], "v1_acc": 0.82, "arms": arms, "pick_vs_control": comparison,
            "control_noise_floor": 0.0125, "n_test": 40}


# (shipped, Δ NFR interval, the status the interval decides, the page's word)
CASES = [("pick", (-0.06, -0.01), Decision.CLEAR, "passed"),
         ("pick", (0.01, 0.06), Decision.BREACH, "failed"),
         ("pick", (-0.04, 0.02), Decision.UNDECIDED, "undecided"),
         ("control", None, None, "none")]


def report_of(shipped: str, ci) -> dict:
    from adaptguard.update.pick_report import verdict

    dev, test = choices(shipped), results_on_test(ci)
    return {"old_base": "tiny", "new_base": "tiny-v2", "n_train": 108, "dev": dev, "test": test,
            "verdict": verdict(dev, test).sentence, "config": {}, "seconds": 12.0}


@pytest.mark.parametrize("shipped, ci, status, word", CASES)
def test_the_status_the_page_and_the_markdown_come_from_the_verdict(shipped, ci, status, word):
    from adaptguard.update.pick_report import UpdateVerdict, markdown, update_page, verdict

    report = report_of(shipped, ci)
    v = verdict(report["dev"], report["test"])
    assert isinstance(v, UpdateVerdict) and v.status is status
    assert v.word == word == (NOTHING_GATED if status is None else OUTCOMES[status].word)
    # `adaptguard update` exits by it: 0 shipped (the control, or a pick the test confirms), 1 the pick broke more
    # than the control on test, 3 within seed noise
    assert v.exit_code == {"passed": 0, "failed": 1, "undecided": 3, "none": 0}[word]
    with pytest.raises(AttributeError):  # frozen
        v.status = Decision.CLEAR

    # report.json's "verdict" stays the sentence; the renderers rebuild the verdict from dev and test, so a stale or
    # misleading text under "verdict" changes neither the page's status nor what either report says
    assert report["verdict"] == v.sentence
    report["verdict"] = "on test it broke MORE answers than the control; the test confirms it; within seed noise"
    md = markdown(report)
    assert md.splitlines()[2] == f"**{v.sentence}**"
    page = update_page(report, [], None)
    assert f'<div class="verdict {word}" id="verdict">{html.escape(v.sentence)}</div>' in page
    assert report["verdict"] not in md and html.escape(report["verdict"]) not in page


def test_the_status_is_the_interval_of_delta_nfr_against_zero():
    """Below 0: the test confirms the pick; above 0: it broke more than the control; touching or containing 0:
    undecided; no comparison (the control shipped): no status."""
    from adaptguard.update.pick_report import status_of

    def of(ci):
        return status_of(results_on_test(ci))

    assert [of((-0.2, -1e-9)), of((1e-9, 0.2)), of((-0.1, 0.0)), of((0.0, 0.1)), of((0.0, 0.0)), of(None)] == \
        [Decision.CLEAR, Decision.BREACH, Decision.UNDECIDED, Decision.UNDECIDED, Decision.UNDECIDED, None]


def test_the_sentences_are_the_ones_users_read():
    """The four sentences as report.json, report.md and report.html have always written them (the citation now
    studies/results.md)."""
    from adaptguard.update.pick_report import verdict

    noise = (" Retraining the control with another seed alone flips 1.2 % of the items right → wrong (the noise floor "
             "over 2 seeds).")
    head = ("ship `focal` (lr 0.002, 2 epochs, distill_weight 1): NFR 0.075 vs control 0.100 on test, Δ {d:+.3f} "
            "(95% CI {lo:+.3f} to {hi:+.3f}, over 2 seeds and the items; McNemar p per seed 0.031, 0.22); accuracy "
            "0.790 vs 0.800; ")
    ends = {Decision.CLEAR: "the test confirms it", Decision.BREACH: "on test it broke MORE answers than the control",
            Decision.UNDECIDED: "within seed noise: the test does not confirm it (the interval contains 0)"}
    for shipped, ci, status, _ in CASES[:3]:
        assert verdict(choices(shipped), results_on_test(ci)).sentence == \
            head.format(d=(ci[0] + ci[1]) / 2, lo=ci[0], hi=ci[1]) + ends[status] + "." + noise
    assert verdict(choices("control"), results_on_test(None)).sentence == (
        "ship the control (lr 0.002, 1 epoch): no recipe beat it on dev (lowest dev NFR among the others: focal (lr "
        "0.002, 2 epochs, distill_weight 1), 0.060 at dev accuracy 0.790); on test its NFR is 0.100 at accuracy "
        "0.800." + noise)
    alone = {**choices("control"), "settings": [CONTROL]}
    assert "as none helped in E5, studies/results.md §10)" in verdict(alone, results_on_test(None)).sentence
