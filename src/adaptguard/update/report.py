"""`report.md` of an update and `seeds.md` of a seed sweep: the tables a reader compares."""

from __future__ import annotations

from ..utils.sweeps import format_spread, machine_line


def _base(new_base, old_base: str) -> str:
    """The new base as a reader names it: a model, or the old one quantized by a library."""
    if isinstance(new_base, str):
        return new_base
    q = new_base.get("quantization") or {}
    return f"{new_base.get('base', old_base)} quantized ({q.get('library', 'quantized')})"


def update_markdown(r: dict) -> str:
    def pct(v):
        return "–" if v is None else f"{100 * v:.2f}"

    rel = "–" if r["delta_nfr_pct"] is None else f"{r['delta_nfr_pct']:.1f}"
    return "\n".join([
        f"# What the update `{r['old_base']}` → `{_base(r['new_base'], r['old_base'])}` breaks, and the compatibility adapter "
        f"(MUSCLE, mask `{(r.get('config') or {}).get('mask', 'student_wrong')}`)", "",
        f"Old base `{r['old_base']}` → new base `{r['new_base']}`; task adapters trained on {r['n_train']} rows, "
        f"evaluated on {r['n_test']} test rows (exact match of the greedy completion). All rates in %.", "",
        "| M_v1 acc | M_v2 acc | M_v2^C acc | NFR | NFR_c | ΔNFR_c | Δ%NFR_c | PFR | PFR_c | incons. | incons._c |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {pct(r['old_acc'])} | {pct(r['new_acc'])} | {pct(r['compat_acc'])} | {pct(r['nfr'])} | "
        f"{pct(r['nfr_compat'])} | {pct(r['delta_nfr'])} | {rel} | {pct(r['pfr'])} | {pct(r['pfr_compat'])} | "
        f"{pct(r['inconsistency_flips'])} | {pct(r['inconsistency_flips_compat'])} |", "",
        f"Exact McNemar p (discordant pairs): v1→v2 {r['mcnemar_p_v1_v2']:.3g}, v1→compat "
        f"{r['mcnemar_p_v1_compat']:.3g}. NFR 95% bootstrap CI: v2 [{pct(r['nfr_ci'][0])}, {pct(r['nfr_ci'][1])}], "
        f"compat [{pct(r['nfr_compat_ci'][0])}, {pct(r['nfr_compat_ci'][1])}].", "",
        *([f"Control (the same adapter training on the labels by cross-entropy, without v1): accuracy "
           f"{pct(r['control_acc'])}, NFR {pct(r['nfr_control'])} [{pct(r['nfr_control_ci'][0])}, "
           f"{pct(r['nfr_control_ci'][1])}], PFR {pct(r['pfr_control'])}. NFR_c − NFR_control = "
           f"{pct(r['nfr_compat_minus_control'])} (95% paired bootstrap CI [{pct(r['nfr_compat_minus_control_ci'][0])}, "
           f"{pct(r['nfr_compat_minus_control_ci'][1])}]; McNemar p {r['mcnemar_p_compat_vs_control']:.3g}).", ""]
          if r.get("control_acc") is not None else []),
        "![flips](flips.png)", "",
        *_lm_eval_lines(r.get("lm_eval")),
        f"Total {r['seconds']:.0f} s.", ""])


def _lm_eval_lines(tasks: dict | None) -> list[str]:
    if not tasks:
        return []
    lines = ["## lm-eval tasks", "", "| task | v1 | v2 | v2+compat | NFR | NFR_c | ΔNFR_c | PFR | PFR_c |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, e in tasks.items():
        if "nfr" not in e:  # similarity-only tasks: smooth flips
            continue
        c = e["compatible"]
        lines.append(f"| {name} | {e['old_acc']:.3f} | {e['new_acc']:.3f} | {c['new_acc']:.3f} | {e['nfr']:.3f} | "
                     f"{c['nfr']:.3f} | {e['delta_nfr']:+.3f} | {e['pfr']:.3f} | {c['pfr']:.3f} |")
    return [*lines, ""]


def seeds_markdown(r: dict) -> str:
    """The seed sweep's table: mean (min–max) in % per rate, one row per seed, and the verdict."""
    names = {"old_acc": "M_v1 acc", "new_acc": "M_v2 acc", "compat_acc": "M_v2^C acc", "nfr": "NFR",
             "nfr_compat": "NFR_c", "delta_nfr": "ΔNFR_c", "pfr": "PFR", "pfr_compat": "PFR_c"}
    if "nfr_control" in r["summary"]:
        names |= {"control_acc": "control acc", "nfr_control": "NFR_control", "nfr_compat_minus_control":
                  "NFR_c − NFR_control"}
    n = len(r["seeds"])
    verdict = ("holds beyond the spread: NFR_c < NFR on every seed" if r["holds_beyond_spread"] else
               f"does NOT hold beyond the spread: NFR_c < NFR on {r['nfr_compat_below_nfr']} of {n} seeds, "
               f"NFR_c ≤ NFR on {r['nfr_compat_at_most_nfr']}; v2 had no negative flip to remove on "
               f"{r['seeds_without_regressions']}")
    return "\n".join([
        f"# What the update `{r['config']['old_base']}` → `{_base(r['config']['new_base'], r['config']['old_base'])}` "
        "breaks, and the compatibility "
        f"adapter (MUSCLE, mask `{r['config']['mask']}`), over {n} seeds", "",
        f"Mask `{r['config']['mask']}`; seeds {r['seeds']} (each seed: its own run under `seed-<seed>/`). "
        "All rates in %, mean (min–max) over the seeds.", "",
        "| " + " | ".join(names.values()) + " |", "|---" * len(names) + "|",
        "| " + " | ".join(format_spread(r["summary"][k], ".2f", 100) for k in names) + " |", "",
        "| seed | " + " | ".join(names.values()) + " |", "|---" * (len(names) + 1) + "|",
        *[f"| {row['seed']} | " + " | ".join(f"{100 * row[k]:.2f}" for k in names) + " |" for row in r["per_seed"]],
        "", f"The reduction of negative flips {verdict}.", "", machine_line(r["machine"]), ""])
