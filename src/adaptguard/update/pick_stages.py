"""The stages of a pick with a dev split (`pick.run_pick`): every setting scored on dev and the pick chosen, then the
pick and the best control tested over seeds, then the pick's adapter shipped.

Each stage takes the run's `pick.Pick` and runs its steps as jobs (`Pick.jobs`, `Pick.run_jobs`), then reads the
stored scores: its numbers are the same wherever the jobs ran. The dev stage writes `dev_choices.json` before the
test stage reads a test item.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..utils.files import atomic_write_text, finished_dir
from .candidates import pick_setting


def dev_stage(pick) -> dict:
    """Every setting on dev, and the pick, written to `dev_choices.json` (no test item read)."""
    from ..compat.stats.metrics import flip_metrics

    pick.prepare()
    seeds = pick.dev_seeds()
    pick.run_jobs(pick.jobs("dev", ["v1", "v2", *((s, seed) for s in pick.settings for seed in seeds)]))
    v1, v2 = pick.v1_scores("dev"), pick.v2_scores("dev")  # stored by the jobs, as is every score below
    rows = []
    for setting in pick.settings:  # each setting's dev scores, averaged over the dev seeds
        ms = [flip_metrics(v1["correct"], pick.setting_scores(setting, s, "dev")["correct"], seed=pick.cfg.seed)
              for s in seeds]
        mean = {k: sum(m[k] for m in ms) / len(ms) if all(m[k] is not None for m in ms) else None
                for k in ("new_acc", "nfr", "pfr", "btc")}
        rows.append({**setting.as_dict(), "label": setting.label(), "acc": mean["new_acc"], "nfr": mean["nfr"],
                     "pfr": mean["pfr"], "btc": mean["btc"], "seeds": len(seeds)})
    rule = pick_setting(rows, pick.cfg.max_accuracy_drop)
    v2m = flip_metrics(v1["correct"], v2["correct"], seed=pick.cfg.seed)
    choices = {"rule": f"lowest dev NFR among settings with dev accuracy ≥ the best control's − "
                       f"{pick.cfg.max_accuracy_drop:g}" + (f" (means over {len(seeds)} seeds)" if len(seeds) > 1
                                                            else ""), **rule, "dev_seeds": seeds,
               "chosen_setting": rows[rule["chosen"]], "best_control_setting": rows[rule["best_control"]],
               "v1_dev_acc": v2m["old_acc"], "v2_dev_acc": v2m["new_acc"], "v2_dev_nfr": v2m["nfr"],
               "n_dev": len(pick.rows["dev"]), "settings": rows}
    atomic_write_text(pick.out / "dev_choices.json", json.dumps(choices, indent=2))
    chosen = pick.settings[rule["chosen"]]
    pick.say(f"update: dev pick: {chosen.label()} (dev accuracy {rows[rule['chosen']]['acc']:.3f}, NFR "
             f"{rows[rule['chosen']]['nfr']:.3f}); best control {rows[rule['best_control']]['label']} (NFR "
             f"{rows[rule['best_control']]['nfr']:.3f})")
    return choices


def test_stage(pick, choices: dict) -> dict:
    """The pick and the best control over the test seeds, against v1, at run level: Δ NFR and Δ accuracy with
    intervals over seeds and items (`replicates.paired_runs_difference`), per-seed McNemar, and the noise floor —
    how many of the control's answers flip right → wrong between two of its own seeds."""
    from ..compat.stats.metrics import flip_indicators, flip_metrics, paired_seeds_difference
    from ..compat.stats.replicates import paired_runs_difference, replicate_flips

    chosen, control = pick.settings[choices["chosen"]], pick.settings[choices["best_control"]]
    seeds = pick.cfg.test_seeds or [pick.cfg.seed]
    arms = {"pick": chosen, "control": control} if chosen != control else {"control": control}
    pick.run_jobs(pick.jobs("test", ["v1", "v2", *((s, seed) for s in arms.values() for seed in seeds),
                                     (chosen, pick.cfg.seed)]))  # the last: the shipped adapter's flips
    v1, v2 = pick.v1_scores("test"), pick.v2_scores("test")
    correct = {arm: [pick.setting_scores(s, seed, "test")["correct"] for seed in seeds] for arm, s in arms.items()}
    summary = {}
    for arm, runs in [("v2", [v2["correct"]]), *correct.items()]:
        per_seed = [flip_metrics(v1["correct"], c, seed=pick.cfg.seed) for c in runs]
        summary[arm] = {k: sum(m[k] for m in per_seed) / len(per_seed) if all(m[k] is not None for m in per_seed)
                        else None for k in ("new_acc", "nfr", "pfr", "btc")}
        summary[arm]["per_seed_nfr"] = [m["nfr"] for m in per_seed]
    comparison = None
    if "pick" in correct:
        nfr = {arm: [flip_indicators(v1["correct"], c)["nfr"] for c in runs] for arm, runs in correct.items()}
        d_nfr = paired_runs_difference(nfr["pick"], nfr["control"])
        d_acc = paired_runs_difference(correct["pick"], correct["control"])
        mcnemar = paired_seeds_difference(nfr["pick"], nfr["control"], n_boot=1)["per_seed"]
        comparison = {"delta_nfr": d_nfr["diff"], "delta_nfr_ci": list(d_nfr["ci"]), "delta_nfr_se": d_nfr["se"],
                      "delta_nfr_df": d_nfr["df"], "delta_nfr_mde": d_nfr["mde"], "per_seed": mcnemar,
                      "delta_acc": d_acc["diff"], "delta_acc_ci": list(d_acc["ci"]),
                      "runs_fixed": d_nfr["runs_fixed"]}
    floor = replicate_flips(correct["control"], correct["control"])["noise_floor"] if len(seeds) > 1 else None
    return {"seeds": seeds, "v1_acc": sum(v1["correct"]) / len(v1["correct"]), "arms": summary,
            "pick_vs_control": comparison, "control_noise_floor": floor, "n_test": len(pick.rows["test"])}


def ship(pick, choices: dict) -> Path:
    """The pick's adapter (seed `cfg.seed`) as `output_dir/chosen/`, with the setting beside it."""
    setting = pick.settings[choices["chosen"]]
    source = pick.train_run(setting, pick.cfg.seed) / f"epoch-{setting.epochs}"
    with finished_dir(pick.out / "chosen") as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        (tmp / "adaptguard_choice.json").write_text(json.dumps(
            {"setting": setting.as_dict(), "seed": pick.cfg.seed, "base": pick.cfg.new_base}, indent=2))
    return pick.out / "chosen"
