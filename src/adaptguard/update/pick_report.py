"""What `pick.run_pick` writes beside the chosen adapter: the verdict (`UpdateVerdict`: its status and its one
sentence, built by `verdict` alone), `report.md` (`markdown`), `report.html` (`update_page`, with the test items the
shipped adapter flipped against v1: `flipped_test_items`) and `dev_tradeoff.png` (`plot_dev`).

The status is a decision of the project's one vocabulary (`compat.verdicts.Decision`), from the interval of the
pick − control difference in NFR on test; the page shows it as the compare page does (`OUTCOMES[status].word`,
`NOTHING_GATED` when the control is shipped). The renderers take a report as report.json holds it and rebuild its
verdict from its dev choices and test results by `verdict`, so a report read back shows what the run showed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..compat.verdicts import EXIT_PASSED, NOTHING_GATED, OUTCOMES, Decision


@dataclass(frozen=True)
class UpdateVerdict:
    """The update's verdict: `status`, what the test says of the pick against the control (CLEAR: the interval of
    Δ NFR lies below 0, the test confirms the pick; BREACH: above 0, it broke MORE of v1's answers than the control;
    UNDECIDED: the interval contains 0, within seed noise; None: the control is shipped, nothing was tested against
    a control), and `sentence`, the report's one sentence (report.json's "verdict")."""

    status: Decision | None
    sentence: str

    @property
    def word(self) -> str:
        """The page's status: failed, undecided, passed, or none (the compare page's words)."""
        return NOTHING_GATED if self.status is None else OUTCOMES[self.status].word

    @property
    def exit_code(self) -> int:
        """`adaptguard update`'s exit status: 0 something shipped with nothing against it (the control, or a pick the
        test confirms), 1 the pick broke more of v1's answers than the control on test, 3 within seed noise."""
        return EXIT_PASSED if self.status is None else OUTCOMES[self.status].exit_code


def status_of(test: dict) -> Decision | None:
    """What the test says of the pick against the control (see `UpdateVerdict.status`), from the 95 % interval of
    the pick − control difference in NFR; None when the control is shipped."""
    c = test["pick_vs_control"]
    if c is None:
        return None
    lo, hi = c["delta_nfr_ci"]
    return Decision.CLEAR if hi < 0 else Decision.BREACH if lo > 0 else Decision.UNDECIDED


_CONFIRMED = {Decision.CLEAR: "the test confirms it",
              Decision.BREACH: "on test it broke MORE answers than the control",
              Decision.UNDECIDED: "within seed noise: the test does not confirm it (the interval contains 0)"}


def _settings(row: dict) -> str:
    """'lr 0.002, 2 epochs, …' of a dev row's label `recipe (…)`."""
    return row["label"].split(" (", 1)[1][:-1]


def _noise(test: dict) -> str:
    """What reruns alone do, or that it was not measured."""
    if test.get("control_noise_floor") is None:
        return (" Seed noise was not measured (one test seed): set test_seeds to two or more seeds to see how many "
                "answers a rerun alone flips.")
    return (f" Retraining the control with another seed alone flips {100 * test['control_noise_floor']:.1f} % of "
            f"the items right → wrong (the noise floor over {len(test['seeds'])} seeds).")


def verdict(choices: dict, test: dict) -> UpdateVerdict:
    """The report's verdict from the dev choices and the test results: its status (`status_of`) and its one
    sentence (and what seed noise amounts to)."""
    chosen, control = choices["chosen_setting"], choices["best_control_setting"]
    ctrl = test["arms"]["control"]
    status = status_of(test)
    if status is None:
        others = [r for r in choices["settings"] if r["recipe"] != "control"]
        if others:
            best = min(others, key=lambda r: r["nfr"])
            why = (f"no recipe beat it on dev (lowest dev NFR among the others: {best['label']}, {best['nfr']:.3f} "
                   f"at dev accuracy {best['acc']:.3f})")
        else:  # the default since E5: say so, not "no recipe beat it"
            why = ("no other recipe was a candidate (name them in `candidates` to compare them; none is by default, "
                   "as none helped in E5, studies/results.md §10)")
        return UpdateVerdict(None, f"ship the control ({_settings(control)}): {why}; on test its NFR is "
                                   f"{ctrl['nfr']:.3f} at accuracy {ctrl['new_acc']:.3f}." + _noise(test))
    c = test["pick_vs_control"]
    lo, hi = c["delta_nfr_ci"]
    over = "items only (one seed)" if c.get("runs_fixed") else f"over {len(test['seeds'])} seeds and the items"
    p = ", ".join(f"{s['mcnemar_p']:.3g}" for s in c["per_seed"])
    return UpdateVerdict(status, f"ship `{chosen['recipe']}` ({_settings(chosen)}): NFR "
                                 f"{test['arms']['pick']['nfr']:.3f} vs control {ctrl['nfr']:.3f} on test, Δ "
                                 f"{c['delta_nfr']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}, {over}; McNemar p per seed "
                                 f"{p}); accuracy {test['arms']['pick']['new_acc']:.3f} vs {ctrl['new_acc']:.3f}; "
                                 f"{_CONFIRMED[status]}." + _noise(test))


def _f(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def markdown(report: dict) -> str:
    """`report.md`: the verdict's sentence first, every setting on dev, the arms on test, the pick − control
    difference."""
    ch, test = report["dev"], report["test"]
    lines = ["# Update: the recipe chosen on dev, tested against the control", "",
             f"**{verdict(ch, test).sentence}**", "",
             f"Old base `{report['old_base']}` → new base `{report['new_base']}`; {report['n_train']} train, "
             f"{ch['n_dev']} dev, {test['n_test']} test items (exact match of the greedy answer). Rule: "
             f"{ch['rule']}; accuracy floor {ch['accuracy_floor']:.3f}.", "",
             "## Dev: every setting (flips against v1)", "",
             f"v1 {ch['v1_dev_acc']:.3f}, v2 {ch['v2_dev_acc']:.3f} (NFR {ch['v2_dev_nfr']:.3f}).", "",
             "| setting | dev acc | NFR | PFR | BTC | eligible | |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ch["settings"]):
        mark = "**pick**" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""
        lines.append(f"| {r['label']} | {_f(r['acc'])} | {_f(r['nfr'])} | {_f(r['pfr'])} | {_f(r['btc'])} | "
                     f"{'yes' if r['acc'] >= ch['accuracy_floor'] - 1e-12 else 'no'} | {mark} |")
    lines += ["", "![dev trade-off](dev_tradeoff.png)", "",
              f"## Test (seeds {test['seeds']}, mean over seeds; v1 accuracy {test['v1_acc']:.3f})", "",
              "| model | acc | NFR | PFR | BTC |", "|---|---|---|---|---|"]
    for arm, m in test["arms"].items():
        lines.append(f"| {arm} | {_f(m['new_acc'])} | {_f(m['nfr'])} | {_f(m['pfr'])} | {_f(m['btc'])} |")
    c = test["pick_vs_control"]
    if c:
        lines += ["", f"Pick − control over {len(test['seeds'])} seed(s), intervals over seeds and items: Δ NFR "
                  f"{c['delta_nfr']:+.3f} "
                  f"(95% CI {c['delta_nfr_ci'][0]:+.3f} to {c['delta_nfr_ci'][1]:+.3f}), Δ accuracy "
                  f"{c['delta_acc']:+.3f} (95% CI {c['delta_acc_ci'][0]:+.3f} to {c['delta_acc_ci'][1]:+.3f}); "
                  "McNemar per seed: " + ", ".join(f"p {s['mcnemar_p']:.3g} ({s['n_a_only']} vs {s['n_b_only']} "
                                                    "discordant)" for s in c["per_seed"]) + "."]
    lines += ["", f"The chosen adapter: `chosen/` (load it on the new base with `PeftModel.from_pretrained`). "
              f"Total {report['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def update_page(report: dict, test_flips: list[dict], dev_png: bytes | None) -> str:
    """`report.html`: the verdict first (its sentence, coloured by its status), the dev trade-off (every setting, the
    figure), the pick against the control on test, and the items the shipped adapter flipped against v1 on test."""
    from ..compat.render.html import figure, flips_section, page, table

    ch, test = report["dev"], report["test"]
    dev_rows = [[r["label"], _f(r["acc"]), _f(r["nfr"]), _f(r["pfr"]), _f(r["btc"]),
                 "yes" if r["acc"] >= ch["accuracy_floor"] - 1e-12 else "no",
                 "pick" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""]
                for i, r in enumerate(ch["settings"])]
    test_rows = [[arm, _f(m["new_acc"]), _f(m["nfr"]), _f(m["pfr"]), _f(m["btc"])] for arm, m in test["arms"].items()]
    sections = [f"<p>Old base {report['old_base']} → new base {report['new_base']}; {report['n_train']} train, "
                f"{ch['n_dev']} dev, {test['n_test']} test items. Rule: {ch['rule']}; accuracy floor "
                f"{ch['accuracy_floor']:.3f}.</p>", "<h2>Dev: every setting (flips against v1)</h2>",
                table(["setting", "dev accuracy", "NFR", "PFR", "BTC", "eligible", ""], dev_rows)]
    if dev_png:
        sections.append(figure(dev_png, "every setting's dev accuracy against its NFR"))
    sections += [f"<h2>Test: the pick against the control (seeds {test['seeds']}, means over seeds)</h2>",
                 table(["model", "accuracy", "NFR", "PFR", "BTC"], test_rows)]
    counts: dict[str, dict[str, int]] = {}
    for x in test_flips:
        counts.setdefault(x["task"], {}).setdefault(x["kind"], 0)
        counts[x["task"]][x["kind"]] += 1
    sections.append(flips_section(test_flips, counts, note="The shipped adapter (seed of chosen/) against v1 on the "
                                                           "test items. "))
    v = verdict(ch, test)
    return page("Update: the recipe chosen on dev, tested against the control", v.sentence, v.word, sections)


def flipped_test_items(rows: list[dict], v1: dict, shipped: dict) -> list[dict]:
    """The test items the shipped adapter flipped against v1, broke first: prompt, gold, v1's and its answer."""
    from ..utils.generation import answer_text

    out = []
    for i, (r, o, n) in enumerate(zip(rows, v1["correct"], shipped["correct"])):
        if o != n:
            prompt = r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"]
            out.append({"task": "test", "doc_id": i, "kind": "negative" if o else "positive", "prompt": prompt,
                        "gold": answer_text(r["completion"]), "old": v1["pred"][i], "new": shipped["pred"][i]})
    return sorted(out, key=lambda x: x["kind"] != "negative")


def plot_dev(choices: dict, path: Path) -> None:
    """Dev accuracy vs NFR of every setting, by recipe; the accuracy floor; the pick and the best control marked."""
    from ..utils.figures import new_figure, save_figure

    fig = new_figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    rows = choices["settings"]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        pts = [r for r in rows if r["recipe"] == recipe]
        ax.scatter([r["acc"] for r in pts], [r["nfr"] for r in pts], label=recipe, s=40,
                   marker="s" if recipe == "control" else "o", alpha=0.8)
    for key, style in (("chosen", dict(s=220, facecolors="none", edgecolors="red", linewidths=1.5, label="pick")),
                       ("best_control", dict(s=220, facecolors="none", edgecolors="black", linewidths=1,
                                             label="best control"))):
        r = rows[choices[key]]
        ax.scatter([r["acc"]], [r["nfr"]], **style)
    ax.axvline(choices["accuracy_floor"], color="grey", linestyle="--", linewidth=1, label="accuracy floor")
    ax.set_xlabel("dev accuracy (exact match)")
    ax.set_ylabel("dev NFR against v1 (lower is better)")
    ax.set_title("Every candidate setting on dev", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
