"""What `pick.run_pick` writes beside the chosen adapter: the one-sentence verdict (`verdict`), `report.md`
(`markdown`), `report.html` (`update_page`, with the test items the shipped adapter flipped against v1:
`flipped_test_items`) and `dev_tradeoff.png` (`plot_dev`)."""

from __future__ import annotations

from pathlib import Path


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


def verdict(choices: dict, test: dict) -> str:
    """The report's one sentence (and what seed noise amounts to)."""
    chosen, control = choices["chosen_setting"], choices["best_control_setting"]
    ctrl = test["arms"]["control"]
    if test["pick_vs_control"] is None:
        others = [r for r in choices["settings"] if r["recipe"] != "control"]
        if others:
            best = min(others, key=lambda r: r["nfr"])
            why = (f"no recipe beat it on dev (lowest dev NFR among the others: {best['label']}, {best['nfr']:.3f} "
                   f"at dev accuracy {best['acc']:.3f})")
        else:  # the default since E5: say so, not "no recipe beat it"
            why = ("no other recipe was a candidate (name them in `candidates` to compare them; none is by default, "
                   "as none helped in E5, studies/results.md §10)")
        return (f"ship the control ({_settings(control)}): {why}; on test its NFR is {ctrl['nfr']:.3f} at accuracy "
                f"{ctrl['new_acc']:.3f}." + _noise(test))
    c = test["pick_vs_control"]
    lo, hi = c["delta_nfr_ci"]
    over = "items only (one seed)" if c.get("runs_fixed") else f"over {len(test['seeds'])} seeds and the items"
    confirmed = ("the test confirms it" if hi < 0 else
                 "on test it broke MORE answers than the control" if lo > 0 else
                 "within seed noise: the test does not confirm it (the interval contains 0)")
    p = ", ".join(f"{s['mcnemar_p']:.3g}" for s in c["per_seed"])
    return (f"ship `{chosen['recipe']}` ({_settings(chosen)}): NFR "
            f"{test['arms']['pick']['nfr']:.3f} vs control {ctrl['nfr']:.3f} on test, Δ {c['delta_nfr']:+.3f} "
            f"(95% CI {lo:+.3f} to {hi:+.3f}, {over}; McNemar p per seed {p}); accuracy "
            f"{test['arms']['pick']['new_acc']:.3f} vs {ctrl['new_acc']:.3f}; {confirmed}." + _noise(test))


def markdown(report: dict) -> str:
    ch, test = report["dev"], report["test"]

    def f(v):
        return "–" if v is None else f"{v:.3f}"

    lines = ["# Update: the recipe chosen on dev, tested against the control", "",
             f"**{report['verdict']}**", "",
             f"Old base `{report['old_base']}` → new base `{report['new_base']}`; {report['n_train']} train, "
             f"{ch['n_dev']} dev, {test['n_test']} test items (exact match of the greedy answer). Rule: "
             f"{ch['rule']}; accuracy floor {ch['accuracy_floor']:.3f}.", "",
             "## Dev: every setting (flips against v1)", "",
             f"v1 {ch['v1_dev_acc']:.3f}, v2 {ch['v2_dev_acc']:.3f} (NFR {ch['v2_dev_nfr']:.3f}).", "",
             "| setting | dev acc | NFR | PFR | BTC | eligible | |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ch["settings"]):
        mark = "**pick**" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""
        lines.append(f"| {r['label']} | {f(r['acc'])} | {f(r['nfr'])} | {f(r['pfr'])} | {f(r['btc'])} | "
                     f"{'yes' if r['acc'] >= ch['accuracy_floor'] - 1e-12 else 'no'} | {mark} |")
    lines += ["", "![dev trade-off](dev_tradeoff.png)", "",
              f"## Test (seeds {test['seeds']}, mean over seeds; v1 accuracy {test['v1_acc']:.3f})", "",
              "| model | acc | NFR | PFR | BTC |", "|---|---|---|---|---|"]
    for arm, m in test["arms"].items():
        lines.append(f"| {arm} | {f(m['new_acc'])} | {f(m['nfr'])} | {f(m['pfr'])} | {f(m['btc'])} |")
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
    """`report.html`: the verdict first, the dev trade-off (every setting, the figure), the pick against the control
    on test, and the items the shipped adapter flipped against v1 on test."""
    from ..compat.html import figure, flips_section, page, table

    ch, test = report["dev"], report["test"]

    def f(v):
        return "–" if v is None else f"{v:.3f}"

    dev_rows = [[r["label"], f(r["acc"]), f(r["nfr"]), f(r["pfr"]), f(r["btc"]),
                 "yes" if r["acc"] >= ch["accuracy_floor"] - 1e-12 else "no",
                 "pick" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""]
                for i, r in enumerate(ch["settings"])]
    test_rows = [[arm, f(m["new_acc"]), f(m["nfr"]), f(m["pfr"]), f(m["btc"])] for arm, m in test["arms"].items()]
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
    return page("Update: the recipe chosen on dev, tested against the control", report["verdict"],
                "failed" if "MORE answers" in report["verdict"] else "passed" if "test confirms it" in report["verdict"]
                else "undecided" if "within seed noise" in report["verdict"] else "none", sections)


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
