"""The demo's `report.md`: one function per section, each reading its part of `report.json`."""

from __future__ import annotations

from ..utils.sweeps import format_spread, machine_line

UPDATE_COLUMNS = "| v1 acc | v2 acc | v2+compat acc | NFR | NFR_c | ΔNFR_c | PFR | PFR_c |\n|---|---|---|---|---|---|---|---|"


def markdown_report(report: dict) -> str:
    sections = [_tradeoff(report), _token_analysis(report.get("token_analysis")), _update(report.get("update")),
                _composition(report.get("composition")), _drift(report.get("drift")), _footer(report)]
    return "\n".join(line for section in sections for line in section)


def _tradeoff(report: dict) -> list[str]:
    base, settings = report["base"], report["settings"]
    skills = settings["skills"]
    lines = [
        "# adaptguard demo: fine-tuning without losing general ability",
        "",
        "Embedded default model (`adaptguard.models.embedded`, shipped with the package), fine-tuned on a domain: its own "
        "knowledge asked in a question/answer format it never saw. Domain score = exact match on held-out "
        "questions; general score = mean exact match over the pretraining skills "
        f"({', '.join(skills)}). The layout of Lin et al.'s Fig. 1–2 (TALR).",
        "",
        f"Base model: domain {base['domain']:.3f}, general {base['general']:.3f}. Each row is the mean over "
        f"training seeds {settings['seeds']}"
        + (" with the min–max over the seeds in brackets; two methods differ only where their ranges do not "
           "overlap" if len(settings["seeds"]) > 1 else " (one seed: toy numbers move with the CPU's float noise, so "
           "compare methods with `--seeds 5`)")
        + f" ({settings['epochs']} epochs, {settings['train_rows']} training rows, {settings['test_rows']} held-out "
        f"questions, {settings['general_probes']} general probes).",
        "",
        "General NFR/PFR: negative/positive flip rate of the general probes against the base model "
        "(MUSCLE §3; `adaptguard.compat.stats.metrics.flip_metrics`): the share of probes the base answered right "
        "and the fine-tuned model gets wrong, and the reverse.",
        "",
        "| method | learning rate | domain | general | general NFR | general PFR | "
        + " | ".join(skills) + " | final train loss | train s |",
        "|---|---|---|---|---|---|" + "---|" * len(skills) + "---|---|",
    ]
    for r in report["runs"]:
        per_skill = " | ".join(f"{r['skills'][s]:.3f}" for s in skills)
        loss = "" if r["final_train_loss"] is None else f"{r['final_train_loss']:.4f}"
        lines.append(f"| {r['method']} | {r['learning_rate']:g} | {format_spread(r['domain_spread'])} | "
                     f"{format_spread(r['general_spread'])} | {r['general_nfr']:.3f} | {r['general_pfr']:.3f} | "
                     f"{per_skill} | {loss} | {r['train_seconds']:.1f} |")
    return lines + ["", "![trade-off](tradeoff.png)", "",
                    "One panel per method, its runs coloured by learning rate; the star is the base model and the "
                    "dashed staircase the Pareto front of all methods' runs (no run is above and to the right of it).",
                    ""]


def _token_analysis(ta: dict | None) -> list[str]:
    if not ta:
        return []
    return [f"## TALR token analysis (learning rate {ta['learning_rate']:g})", "",
            "Fraction of supervised tokens with p > 0.2 per epoch (the curriculum signal of Lin et al. §4.3):", "",
            "| epoch | frac p>0.2 | median p |", "|---|---|---|",
            *[f"| {e['epoch']:g} | {e['frac_p_gt_0.2']:.3f} | {e['quantiles']['p50']:.3f} |"
              for e in ta["epochs"] if "frac_p_gt_0.2" in e],
            "", "Heatmaps per epoch: `token_analysis/heatmap_epoch*.png` (completion tokens shaded by their "
            "probability, the prompt in grey).", ""]


def _update(u: dict | None) -> list[str]:
    if not u:
        return []
    title = ["## Model update with a compatibility adapter (MUSCLE, Echterhoff et al.)", ""]
    if "summary" in u:  # a seed sweep
        keys = ("old_acc", "new_acc", "compat_acc", "nfr", "nfr_compat", "delta_nfr", "pfr", "pfr_compat")
        return title + [
            "Task adapters on the embedded `tiny` (v1) and `tiny-v2` (v2: larger, trained longer) bases, then "
            f"the compatibility adapter on v2 (`adaptguard update --preset tiny --seeds {len(u['seeds'])}`; "
            f"mask `{u['config']['mask']}`), over seeds {u['seeds']} (each re-draws the train/test split): "
            "mean (min–max).", "", UPDATE_COLUMNS,
            "| " + " | ".join(format_spread(u["summary"][k]) for k in keys) + " |", "",
            f"NFR_c < NFR on {u['nfr_compat_below_nfr']} of {len(u['seeds'])} seeds (v2 had no negative flip to "
            f"remove on {u['seeds_without_regressions']}): "
            + ("the reduction holds on every seed." if u["holds_beyond_spread"] else
               "not a reduction beyond the spread; on this toy v2 regresses on too few items to measure "
               "MUSCLE's effect (docs/muscle.md; the real-model experiments are where it is measured)."), ""]
    aligned = " / ".join(f"{x:.2f}" for x in u["frac_aligned_old_first_last"] or [])
    return title + [
        "Task adapters on the embedded `tiny` (v1) and `tiny-v2` (v2: larger, trained longer) bases, then "
        "the compatibility adapter on v2 (`adaptguard update --preset tiny`; full report in `update/`).", "",
        UPDATE_COLUMNS,
        f"| {u['old_acc']:.3f} | {u['new_acc']:.3f} | {u['compat_acc']:.3f} | {u['nfr']:.3f} | "
        f"{u['nfr_compat']:.3f} | {u['delta_nfr']:+.3f} | {u['pfr']:.3f} | {u['pfr_compat']:.3f} |", "",
        f"Mask `{u['config']['mask']}` (MUSCLE §4.1, §6.5); share of training tokens aligned to v1 "
        f"(first/last log): {aligned}. The task adapters fit every training token, "
        "so eq. 1's `student_wrong` mask never fires on this toy; docs/muscle.md has that run, the control "
        "and other splits. One run: a difference of a few items is float noise on this toy (it moves with "
        "the CPU); `adaptguard demo --seeds 5` gives the spread.", ""]


def _composition(c: dict | None) -> list[str]:
    if not c:
        return []
    one_seed = "" if "per_seed" in c else " One seed: `adaptguard demo --seeds 5` gives the spread over seeds."
    return [c["markdown"],
            "The paper's pattern (simple tasks in context, composites only with composite demonstrations) "
            "shows here only in part: see the numbers above and lm_eval_tasks/compose_logic/ for the "
            "suite on real models." + one_seed, ""]


def _drift(d: dict | None) -> list[str]:
    if not d:
        return []
    s = d["settings"]
    return ["## Similarity drift (Ni et al. App. B, quick sweep)", "",
            f"Small GPT-2s trained on {s['n0']} samples of a base bit string c0 plus {s['n1']} samples of a string "
            f"of similarity r to it; next-bit loss on c0 ({s['repetitions']} repetitions, `adaptguard drift "
            "experiment` for the full sweep):", "",
            "| r | loss mean | min | max |", "|---|---|---|---|",
            *[f"| {r:.3f} | {m:.4f} | {lo:.4f} | {hi:.4f} |"
              for r, m, lo, hi in zip(d["r"], d["loss_mean"], d["loss_min"], d["loss_max"])], "",
            f"Highest mean loss at r = {d['peak_r']:.3f} (the paper reports its maximum near and below 1/2; "
            f"the min–max bars overlap). Theorem A2's bound with `adaptguard drift bound`'s defaults peaks at "
            f"r = {d['bound_argmax']:.3f}. Plot: `drift/drift.png`.", ""]


def _footer(report: dict) -> list[str]:
    stages = ", ".join(f"{name.replace('_', ' ')} {seconds:.0f} s"
                       for name, seconds in report.get("stage_seconds", {}).items())
    workers = report.get("parallel_sections", 1)
    if workers > 1:
        stages += f"; the sections after the base ran {workers} at a time, one core each"
    return [f"Total time: {report['seconds']:.0f} s" + (f" ({stages})" if stages else "")
            + f". Reproduce: `{report['settings']['command']}`. " + machine_line(report["machine"]), ""]
