"""Experiment E5 (issue 57, studies/preregistration.md § E5): seeds, not items.

Part A (`--stage report`): E1–E4 re-decided from their committed records with run-level statistics
(`compat.stats.replicates`: intervals over seeds and items, Benjamini–Hochberg over each experiment's family with
FCR-adjusted intervals, minimum detectable effects, chance churn), beside the registered verdicts; E4's trivial
domain baselines and its per-task general flips. Writes `studies/results/e5_report.{json,md}`.

Part B (`--stage runs`): E3's arms at their frozen dev choices on more seeds — U2 (continued training) and U1 (NF4)
every arm, U3 (NF4, matrixshapes) the control and focal — through E3's own runner, so the rows, items, scoring and
store keys are E3's. Before an update's new seeds, the rebuilt v1 and v2 task models are scored under names of
their own, so their agreement with the recorded reference answers can be reported. After every finished run the
small records are exported (only what is not already in E3's records), ready to commit.

    python -m adaptguard.experiments.seeds_not_items --stage runs --out /work/e5-out --export studies/results/e5_records

Resuming: copy `studies/results/e3_records/*` and then `studies/results/e5_records/*` into `--out` (the command does it
when `--out` is new).
"""

from __future__ import annotations

import filecmp
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from adaptguard.utils.quiet import hide_unused_library_noise
from adaptguard.utils.sweeps import machine_info

from .common import export_records
from .recipes_vs_control import E3, E3Config

E3_RECORDS = Path("studies/results/e3_records")
# registered order (cheapest first) and arms per update
PLAN = {"continued": ["control", "muscle", "ll_l", "focal", "kd"],
        "quantized": ["control", "muscle", "ll_l", "focal", "kd"],
        "generative": ["control", "focal"]}
NEW_SEEDS = [3, 4, 5, 6, 7]


def export_new(out: Path, to: Path, reference: Path = E3_RECORDS) -> int:
    """Export `out`'s records to `to`, leaving out every file that `reference` (E3's committed records) already holds
    unchanged. Returns the number of files written."""
    with tempfile.TemporaryDirectory() as tmp:
        export_records(out, Path(tmp))
        n = 0
        for path in sorted(Path(tmp).rglob("*")):
            rel = path.relative_to(tmp)
            old = reference / rel
            if path.is_file() and not (old.is_file() and filecmp.cmp(path, old, shallow=False)):
                target = to / rel
                if not (target.is_file() and filecmp.cmp(path, target, shallow=False)):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
                    n += 1
    return n


def seed_records(out: Path, sources: list[Path]) -> None:
    """Copy committed records into a new `out` (E3's first, then E5's), so the store resumes from them."""
    for src in sources:
        if src.is_dir():
            shutil.copytree(src, out, dirs_exist_ok=True)


class E5Runs:
    def __init__(self, cfg: E3Config, export: Path | None, say=print):
        self.e3, self.export, self.say = E3(cfg, say=say), export, say
        self.choices = json.loads(self.e3.choices_path.read_text())

    def update(self, name: str):
        """(E1 steps, kind, setting) of a decided update, from its frozen dev choice (no gate is re-walked)."""
        entry = self.choices[name]
        if name == "generative":
            e = self.e3.generative(entry["task"])
        else:
            e = self.e3.multiple_choice()
        return e, entry["kind"], entry["setting"]

    def recorded_v1(self, name: str, e) -> Path:
        """The folder of E3's recorded v1 test answers of update `name` (the reference of every seed's NFR), found
        under the key its scoring stored it with; exits saying what to copy when the store lacks it."""
        lr = e.task_lr
        found = e.store.find(f"scores/test/v1_{lr:g}", e.score_settings({**e.common, "lr": lr}, "test"))
        if found is None:
            raise SystemExit(f"E5: {name}: the recorded v1 test answers are not in {e.root}: copy "
                             f"{E3_RECORDS} into it first (they are the reference of every seed)")
        return found

    def rebuilt_check(self, name: str) -> dict:
        """The rebuilt v1 and v2 task models' test answers, stored under their own names, against the recorded."""
        e, kind, setting = self.update(name)
        self.recorded_v1(name, e)
        machine = machine_info().get("cpu", "")
        common = {**e.common, "lr": e.task_lr, "rebuilt_on": machine}
        v1 = e.scores("v1_rebuilt", common, "test", e.v1_task_model)
        _, _, extra = e.update_base(kind, setting)
        v2 = e.scores(f"v2_{kind}_rebuilt", {**common, **extra}, "test", lambda: e.v2_task_model(kind, setting))
        rec_v1, rec_v2 = e.v1_scores("test"), e.v2_scores(kind, setting, "test")
        agree = {"v1": sum(a == b for a, b in zip(v1, rec_v1)) / len(v1),
                 "v2": sum(a == b for a, b in zip(v2, rec_v2)) / len(v2), "machine": machine}
        self.say(f"E5: {name}: rebuilt v1 agrees with the recorded on {agree['v1']:.3f} of test items, "
                 f"v2 on {agree['v2']:.3f}")
        self._export()
        return agree

    def run(self, updates: list[str], seeds: list[int]) -> None:
        for name in updates:
            e, kind, setting = self.update(name)
            self.rebuilt_check(name)
            chosen = self.choices[name]["chosen"]
            for seed in seeds:
                for arm in PLAN[name]:
                    c = chosen[arm]
                    self.e3.arm_scores(e, kind, setting, arm, c["learning_rate"], c["epochs"], seed, "test")
                    self._export()

    def _export(self) -> None:
        if self.export is not None:
            n = export_new(self.e3.root, self.export)
            if n:
                self.say(f"E5: {n} record file(s) exported to {self.export}")


# ----------------------------------------------------------------------------------------- Part A: re-analysis
E4_RECORDS, E5_RECORDS, E2_REPORT = Path("studies/results/e4_records"), Path("studies/results/e5_records"), \
    Path("studies/results/e2_report.json")
Q = 0.05  # the families' false discovery rate
MARGIN = 0.02  # "not reproduced": the adjusted interval inside ±2 points


def e5_verdict(lo: float, hi: float, margin: float = MARGIN) -> str:
    """The registered run-level verdict of "A breaks fewer than B" from the adjusted interval of Δ NFR = A − B."""
    if hi < 0:
        return "reproduced"
    if lo > 0:
        return "contradicted"
    return "not reproduced" if -margin <= lo and hi <= margin else "inconclusive"


def e1_rule(lo: float, hi: float) -> str:
    """E1's (and E2's, E4's H1) registered rule: half-width ≤ 5 points for "not reproduced"."""
    if hi < 0:
        return "reproduced"
    if lo > 0:
        return "contradicted"
    return "not reproduced" if (hi - lo) / 2 <= 0.05 else "inconclusive"


def fcr_level(q: float, n_selected: int, m: int) -> float:
    """The false-coverage-rate adjusted interval level of Benjamini & Yekutieli (2005): 1 − max(R, 1) · q / m, so a
    comparison's adjusted interval excludes 0 exactly when BH at q selects it."""
    return 1 - max(n_selected, 1) * q / m


def decide_family(comparisons: list[dict], q: float = Q) -> float:
    """BH at `q` over the family's two-sided p-values; each comparison gains `p_bh`, `selected`, the FCR-adjusted
    `level` and its `adjusted_ci`, and `mde` at that level. Returns the level."""
    from adaptguard.compat.stats.replicates import benjamini_hochberg, min_detectable_effect, t_interval

    selected, adjusted = benjamini_hochberg([c["p_value"] for c in comparisons], q)
    level = fcr_level(q, sum(selected), len(comparisons))
    for c, sel, p in zip(comparisons, selected, adjusted):
        c.update(p_bh=p, selected=sel, level=level, adjusted_ci=list(t_interval(c["diff"], c["se"], c["df"], level)),
                 mde=min_detectable_effect(c["se"], c["df"], 1 - level))
    return level


def _secondary(family: list[dict], rule=None) -> dict[int, str]:
    """The verdicts the library's moment estimator (`compat.stats.replicates.crossed_variance`) gives the same family
    (BH and FCR-adjusted intervals as the registered one): reported beside the registered verdict."""
    from adaptguard.compat.stats.replicates import benjamini_hochberg, t_interval

    selected, _ = benjamini_hochberg([c["moments"]["p_value"] for c in family], Q)
    level = fcr_level(Q, sum(selected), len(family))
    return {id(c): (rule or e5_verdict)(*t_interval(c["diff"], c["moments"]["se"], c["moments"]["df"], level))
            for c in family}


def _scores(roots: list[Path], rel: str, prefix: str) -> list[bool] | dict | None:
    """The stored `scores.json` of the one step `rel/prefix*` found under the roots (None when absent)."""
    found = {p.parent.name: p for root in roots for p in (root / rel).glob(f"{prefix}*/scores.json")}
    if len(found) > 1:
        raise ValueError(f"{rel}/{prefix}*: {len(found)} steps match ({sorted(found)}); expected one")
    return json.loads(next(iter(found.values())).read_text()) if found else None


def e3_reanalysis(roots: list[Path], seeds: range = range(8)) -> dict:
    """E3's 12 recipe − control comparisons (4 recipes × 3 updates) at run level, over every seed stored for both."""
    import numpy as np

    from adaptguard.compat.stats.metrics import flip_indicators
    from adaptguard.compat.stats.replicates import paired_runs_difference

    choices = json.loads((E3_RECORDS / "e3" / "dev_choices.json").read_text())
    registered = json.loads((E3_RECORDS / "e3" / "report.json").read_text())["updates"]
    out, family = {}, []
    for name, entry in choices.items():
        rel = "scores/test" if name != "generative" else f"e3/generative/{entry['task']}/scores/test"
        v1 = _scores(roots, rel, "v1_0.0003_") or _scores(roots, rel, "v1_0.0003")
        runs = {}
        for arm, c in entry["chosen"].items():
            tag = f"e3_{entry['kind']}_{arm}_lr{c['learning_rate']:g}_ep{c['epochs']}_seed"
            runs[arm] = {s: got for s in seeds if (got := _scores(roots, rel, f"{tag}{s}_")) is not None}
        update = {"update": entry["update"], "task": entry["task"], "v1_test_acc": float(np.mean(v1)), "arms": {}}
        for arm, by_seed in runs.items():
            neg = {s: flip_indicators(v1, c)["nfr"] for s, c in by_seed.items()}
            update["arms"][arm] = {"seeds": sorted(by_seed), "acc": float(np.mean([np.mean(c) for c in by_seed.values()])),
                                   "nfr": float(np.mean([x.mean() for x in neg.values()])),
                                   "per_seed_nfr": [float(neg[s].mean()) for s in sorted(neg)]}
            if arm == "control":
                continue
            both = sorted(set(by_seed) & set(runs["control"]))
            pair = ([neg[s] for s in both], [flip_indicators(v1, runs["control"][s])["nfr"] for s in both])
            d_nfr = paired_runs_difference(*pair, method="bootstrap")  # the registered statistic
            moments = paired_runs_difference(*pair)
            d_acc = paired_runs_difference([by_seed[s] for s in both], [runs["control"][s] for s in both],
                                           method="bootstrap")
            reg = registered[name]["arms"][arm]["vs_control"]
            comparison = {"experiment": "E3", "update": entry["update"], "arm": arm, "seeds": both, **d_nfr,
                          "acc_diff": d_acc["diff"], "acc_ci": list(d_acc["ci"]),
                          "moments": {k: moments[k] for k in ("se", "df", "p_value")},
                          "registered": {"verdict": reg["verdict"], "helps": reg["helps"], "diff": reg["delta_nfr"],
                                         "ci": reg["delta_nfr_ci"]}}
            update["arms"][arm]["vs_control"] = comparison
            family.append(comparison)
        out[name] = update
    level = decide_family(family)
    moment_verdicts = _secondary(family)
    for c in family:
        c["verdict"] = e5_verdict(*c["adjusted_ci"])
        c["helps"] = c["verdict"] == "reproduced" and c["acc_ci"][0] > -MARGIN
        c["moments"]["verdict"] = moment_verdicts[id(c)]
    return {"updates": out, "family": len(family), "level": level,
            "helps": sorted({c["arm"] for c in family if c["helps"]})}


def _general_rows() -> dict[str, list[dict]]:
    """E2's and E4's general test rows per task (their registered splits)."""
    from .talr_vs_sft import add_general_splits
    from .talr_worked_answers import E4Config

    return add_general_splits(E4Config(), {"dev": {}, "test": {}})["test"]


def churn_tasks(base: dict[str, list[bool]], rows: dict[str, list[dict]], alpha: float = Q) -> dict[str, dict]:
    """Per general task: the base model's test accuracy, chance (`replicates.chance_rate`) and the exact one-sided
    test of "above chance"; `churn` where it fails."""
    from adaptguard.compat.stats.replicates import above_chance_p, chance_rate

    out = {}
    for task, correct in base.items():
        items = rows[task]
        chance = chance_rate([len(r["choices"]) for r in items], [r["choices"][r["label"]] for r in items])
        p = above_chance_p(sum(correct), len(correct), chance)
        out[task] = {"base_acc": sum(correct) / len(correct), "chance": chance, "p_above_chance": p,
                     "churn": p >= alpha}
    return out


def e4_reanalysis(records: Path = E4_RECORDS) -> dict:
    """E4 at run level: TALR − SFT and DFT − SFT on general NFR (the family), churn tasks left out (and kept, for
    comparison); domain Δ accuracy; H1/H2 by E4's rules; per-task general flips; the trivial domain baselines."""
    import numpy as np

    from adaptguard.compat.stats.metrics import flip_indicators
    from adaptguard.compat.stats.replicates import paired_runs_difference

    test = records / "scores" / "test"
    base = json.loads((test / "general" / "base" / "scores.json").read_text())
    rows = _general_rows()
    churn = churn_tasks(base, rows)
    kept = [t for t in base if not churn[t]["churn"]]
    arms = {}
    for arm in ("SFT", "TALR", "DFT"):
        arms[arm] = [(json.loads((test / "general" / f"{arm}_lr0.0001_seed{s}_set1" / "scores.json").read_text()),
                      json.loads((test / "domain" / f"{arm}_lr0.0001_seed{s}_set1" / "scores.json").read_text())
                      ["correct"]) for s in range(3)]

    def negative(arm: str, tasks: list[str]) -> list[np.ndarray]:
        return [np.concatenate([flip_indicators(base[t], g[t])["nfr"] for t in tasks]) for g, _ in arms[arm]]

    per_task = {arm: {t: {"nfr": float(np.mean([flip_indicators(base[t], g[t])["nfr"].mean() for g, _ in arms[arm]])),
                          "pfr": float(np.mean([flip_indicators(base[t], g[t])["pfr"].mean() for g, _ in arms[arm]]))}
                      for t in base} for arm in arms}
    registered = {c["arm"]: c for c in json.loads((records / "report.json").read_text())["comparisons"]}
    family, both_ways = [], {}
    for arm in ("TALR", "DFT"):
        d = paired_runs_difference(negative(arm, kept), negative("SFT", kept), method="bootstrap")
        moments = paired_runs_difference(negative(arm, kept), negative("SFT", kept))
        dom = paired_runs_difference([c for _, c in arms[arm]], [c for _, c in arms["SFT"]], method="bootstrap")
        every = paired_runs_difference(negative(arm, list(base)), negative("SFT", list(base)), method="bootstrap")
        reg = registered[arm]
        c = {"experiment": "E4", "arm": arm, "vs": "SFT", **d, "domain_diff": dom["diff"], "domain_ci": list(dom["ci"]),
             "moments": {k: moments[k] for k in ("se", "df", "p_value")},
             "with_churn": {"diff": every["diff"], "ci": list(every["ci"]), "p_value": every["p_value"]},
             "registered": {"h1": reg["h1_less_forgetting"], "h2": reg["h2_better_tradeoff"],
                            "diff": reg["general_nfr"]["diff"], "ci": reg["general_nfr"]["ci"]}}
        family.append(c)
        both_ways[arm] = c
    level = decide_family(family)
    moment_verdicts = _secondary(family, e1_rule)
    for c in family:
        c["moments"]["verdict"] = moment_verdicts[id(c)]
        c["h1"] = e1_rule(*c["adjusted_ci"])
        lo_dom = c["domain_ci"][0]
        c["h2"] = ("reproduced" if c["h1"] == "reproduced" and lo_dom >= -0.05 else
                   "not reproduced" if c["h1"] in ("not reproduced", "contradicted") or c["domain_ci"][1] < -0.05
                   else "inconclusive")
    return {"churn": churn, "kept_tasks": kept, "per_task": per_task, "comparisons": both_ways, "level": level,
            "domain_baselines": e4_domain_baselines(arms)}


def e4_domain_baselines(arms: dict) -> dict:
    """The domain's trivial baselines on E4's test items (S2), scored by the registered rule: each calculator's
    most common training answer; one constant answer for all (the most common over every calculator's training
    rows: the format alone); beside each arm's accuracy."""
    from collections import Counter

    import numpy as np

    from adaptguard.data.medcalc import is_correct, medcalc_splits

    from .talr_worked_answers import E4Config, calculators

    c = E4Config()
    split = medcalc_splits(calculators(c.calculator_sets[1]), c.train_per_calculator[1], c.dev_per_calculator,
                           c.test_per_calculator, c.domain_seed)
    per_calc = {k: Counter(r["answer"] for r in split["train"] if r["calculator"] == k).most_common(1)[0][0]
                for k in {r["calculator"] for r in split["train"]}}
    overall = Counter(r["answer"] for r in split["train"]).most_common(1)[0][0]

    def accuracy(answer_of) -> float:
        return float(np.mean([is_correct(f"Answer: {answer_of(r)}", r["answer"], r["kind"]) for r in split["test"]]))

    return {"per_calculator_mode": {"answers": per_calc, "acc": accuracy(lambda r: per_calc[r["calculator"]])},
            "one_constant": {"answer": overall, "acc": accuracy(lambda r: overall)},
            "arms": {arm: float(np.mean([np.mean(d) for _, d in runs])) for arm, runs in arms.items()},
            "n_test": len(split["test"])}


def e2_reanalysis(report: Path = E2_REPORT) -> dict:
    """E2 from its per-seed general NFRs (no per-item records were kept): a t-interval over the 3 seed-paired
    differences, BH over the 4 comparisons (TALR, DFT − SFT at each learning rate)."""
    import numpy as np

    from adaptguard.compat.stats.replicates import t_sf

    data = json.loads(report.read_text())
    arms = {(a["arm"], a["lr"]): [s["general_nfr"] for s in a["per_seed"]] for a in data["arms"]}
    family = []
    for c in data["comparisons"]:
        d = np.array(arms[(c["arm"], c["lr"])]) - np.array(arms[("SFT", c["lr"])])
        se = float(d.std(ddof=1) / np.sqrt(len(d)))
        diff = float(d.mean())
        family.append({"experiment": "E2", "arm": c["arm"], "vs": "SFT", "lr": c["lr"], "diff": diff, "se": se,
                       "df": float(len(d) - 1), "per_seed": d.tolist(),
                       "p_value": min(1.0, 2 * t_sf(abs(diff) / se, len(d) - 1)) if se > 0 else float(diff == 0),
                       "registered": {"h1": c["h1_less_forgetting"], "diff": c["general_nfr"]["diff"],
                                      "ci": c["general_nfr"]["ci"]}})
    level = decide_family(family)
    for c in family:
        c["verdict"] = e5_verdict(*c["adjusted_ci"])
    return {"comparisons": family, "level": level,
            "note": "per-seed general NFRs only: the interval counts seeds, not items; churn tasks cannot be removed"}


def report(roots: list[Path]) -> dict:
    return {"E1": {"note": "not re-decidable at run level from the records: e1_report.json keeps arm means and "
                           "per-seed McNemar p, neither per-item scores nor per-seed NFR; E3 re-tests U1 and U2"},
            "E2": e2_reanalysis(), "E3": e3_reanalysis(roots), "E4": e4_reanalysis()}


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _ci(ci) -> str:
    return f"{_pts(ci[0])} to {_pts(ci[1])}"


def markdown(r: dict) -> str:
    """E5's report: per experiment, the registered verdict beside the one re-decided at run level."""
    e3, e4, e2 = r["E3"], r["E4"], r["E2"]
    lines = ["# E5: E1–E4 re-decided with run-level statistics", "",
             "Intervals count seeds and items: the registered two-level paired bootstrap (seeds, then items; 10 000 "
             "resamples, seed 0) for the SE, Student's t on S − 1 df; beside it, the verdict of the library's moment "
             f"estimator (`compat.stats.replicates`). Benjamini–Hochberg at q = {Q} over each experiment's family, "
             "intervals at the FCR-adjusted level "
             "(Benjamini & Yekutieli 2005); MDE = the Δ the comparison detects with 80 % power at that level. Points "
             "are percentage points.", "",
             f"## E3 — recipe − control, Δ NFR against v1 (family of {e3['family']}, adjusted level "
             f"{100 * e3['level']:.2f} %)", "",
             "`seeds`: the seed-paired runs of each comparison recorded so far (registered: 8 for U1 and U2, and U3's "
             "focal; 3 for U3's other recipes); with fewer, the verdict is interim.", "",
             "| update | recipe | seeds | Δ NFR | adjusted CI | p (BH) | MDE | Δ accuracy (95 % CI) | registered "
             "(3 seeds, items only) | re-decided | moments | helps |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for u in e3["updates"].values():
        for arm, a in u["arms"].items():
            c = a.get("vs_control")
            if c is None:
                continue
            reg = c["registered"]
            lines.append(f"| {u['update']} | {arm} | {len(c['seeds'])} | {_pts(c['diff'])} | {_ci(c['adjusted_ci'])} | "
                         f"{c['p_value']:.2g} ({c['p_bh']:.2g}) | {100 * c['mde']:.1f} | {_pts(c['acc_diff'])} "
                         f"({_ci(c['acc_ci'])}) | {reg['verdict']}{' (helps)' if reg['helps'] else ''} "
                         f"({_pts(reg['diff'])}, {_ci(reg['ci'])}) | **{c['verdict']}** | {c['moments']['verdict']} | "
                         f"{'yes' if c['helps'] else 'no'} |")
    lines += ["", "Control NFR per seed: " + "; ".join(
        f"{u['update']} " + ", ".join(f"{x:.3f}" for x in u["arms"]["control"]["per_seed_nfr"])
        for u in e3["updates"].values()), "",
        f"Recipes that help on some update (the product's default candidates besides the control): "
        f"{', '.join(e3['helps']) or 'none'}.", "",
        f"## E4 — TALR and DFT against SFT (family of 2, adjusted level {100 * e4['level']:.1f} %)", "",
        "Chance churn among the general tasks (the base model, 100 test items each):", "",
        "| task | base accuracy | chance | p (above chance) | churn | NFR SFT / TALR / DFT | PFR SFT / TALR / DFT |",
        "|---|---|---|---|---|---|---|"]
    for task, ch in e4["churn"].items():
        nfr = " / ".join(f"{100 * e4['per_task'][a][task]['nfr']:.1f}" for a in ("SFT", "TALR", "DFT"))
        pfr = " / ".join(f"{100 * e4['per_task'][a][task]['pfr']:.1f}" for a in ("SFT", "TALR", "DFT"))
        lines.append(f"| {task} | {ch['base_acc']:.2f} | {ch['chance']:.2f} | {ch['p_above_chance']:.2g} | "
                     f"{'**yes**' if ch['churn'] else 'no'} | {nfr} | {pfr} |")
    lines += ["", "| arm − SFT | Δ general NFR, churn out | adjusted CI | p (BH) | MDE | with churn tasks (95 % CI) | "
              "Δ domain (95 % CI) | registered H1 / H2 | re-decided H1 / H2 | moments (H1 rule) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, c in e4["comparisons"].items():
        w = c["with_churn"]
        lines.append(f"| {arm} | {_pts(c['diff'])} | {_ci(c['adjusted_ci'])} | {c['p_value']:.2g} ({c['p_bh']:.2g}) | "
                     f"{100 * c['mde']:.1f} | {_pts(w['diff'])} ({_ci(w['ci'])}) | {_pts(c['domain_diff'])} "
                     f"({_ci(c['domain_ci'])}) | {c['registered']['h1']} / {c['registered']['h2']} | "
                     f"**{c['h1']} / {c['h2']}** | {c['moments']['verdict']} |")
    b = e4["domain_baselines"]
    lines += ["", f"Trivial domain baselines on the {b['n_test']} domain test items: each calculator's most common "
              f"training answer ({', '.join(f'{k} {v}' for k, v in sorted(b['per_calculator_mode']['answers'].items()))}"
              f") scores {b['per_calculator_mode']['acc']:.3f}; one constant answer "
              f"({b['one_constant']['answer']}, the format alone) {b['one_constant']['acc']:.3f}; the arms: "
              + ", ".join(f"{a} {v:.3f}" for a, v in b["arms"].items()) + ".", "",
              f"## E2 — TALR and DFT against SFT, general NFR (family of 4, adjusted level {100 * e2['level']:.1f} %)",
              "", f"{e2['note']}.", "",
              "| arm − SFT | lr | Δ NFR | per seed | adjusted CI | p (BH) | registered H1 (items) | re-decided |",
              "|---|---|---|---|---|---|---|---|"]
    for c in e2["comparisons"]:
        lines.append(f"| {c['arm']} | {c['lr']:g} | {_pts(c['diff'])} | {', '.join(_pts(x) for x in c['per_seed'])} | "
                     f"{_ci(c['adjusted_ci'])} | {c['p_value']:.2g} ({c['p_bh']:.2g}) | {c['registered']['h1']} "
                     f"({_pts(c['registered']['diff'])}, {_ci(c['registered']['ci'])}) | **{c['verdict']}** |")
    lines += ["", "## E1", "", f"{r['E1']['note']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from transformers import HfArgumentParser

    @dataclass
    class Cli:
        stage: str = field(default="runs", metadata={"help": "runs: Part B's new seeds; report: Part A, the "
                                                                     "re-analysis, from the committed records."})
        out: str = field(default="e5-out", metadata={"help": "The store (E3's records are copied in when new)."})
        export: str = field(default="", metadata={"help": "Copy each finished run's new records here (to commit)."})
        updates: list[str] = field(default_factory=lambda: list(PLAN), metadata={
            "help": "continued (U2), quantized (U1), generative (U3), in the registered order."})
        seeds: list[int] = field(default_factory=lambda: list(NEW_SEEDS))

    hide_unused_library_noise()
    (cli,) = HfArgumentParser(Cli).parse_args_into_dataclasses(argv)
    if cli.stage == "report":
        from adaptguard.utils.files import atomic_write_text

        result = report([E3_RECORDS, E5_RECORDS])
        atomic_write_text(Path("studies/results/e5_report.json"), json.dumps(result, indent=2, default=float))
        atomic_write_text(Path("studies/results/e5_report.md"), markdown(result))
        print(markdown(result))
        return
    if cli.stage != "runs":
        raise SystemExit(f"--stage: unknown stage {cli.stage!r}; known: runs, report")
    out = Path(cli.out)
    if not out.exists():
        seed_records(out, [E3_RECORDS] + ([Path(cli.export)] if cli.export else []))
    cfg = E3Config(out=str(out), seeds=[0, 1, 2, *cli.seeds])
    E5Runs(cfg, Path(cli.export) if cli.export else None).run(cli.updates, cli.seeds)


if __name__ == "__main__":
    main()
