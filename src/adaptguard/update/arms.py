"""`adaptguard update CONFIG` without a dev split: Echterhoff et al.'s model-update experiment in one command.

The task LoRA adapters on the old base (v1) and the new base (v2) — or the user's own, used as is — then the MUSCLE
compatibility adapter (on v2, from v2's task adapter, distilled from both task models) and the cross-entropy control
at the config's settings, all through the pick's steps (`pick.Pick` on the one-setting grid `arms_settings`, so
both modes train, store and reuse runs the same way); each is scored on test, and `report.json`, `report.md`
(Echterhoff et al. Tables 3–6 layout) and flip-quadrant plots go into the output directory. The trainings and scorings are
the pick's jobs, on the config's executor (`executors`).

CONFIG is a JSON file (see `UpdateConfig`); `--preset tiny` runs on the embedded default
(bases `tiny` → `tiny-v2`, their knowledge asked in six question phrasings). `--seeds N` repeats the
experiment over N seeds (`run_update_seeds`) and reports the mean and min–max of every rate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..utils.files import atomic_write_text, finished_dir
from .config import UpdateConfig
from .executors import describe, make_executor
from .report import seeds_markdown, update_markdown

logger = logging.getLogger(__name__)


def arms_settings(cfg: UpdateConfig) -> list:
    """The update without a dev split as the pick's one-setting grid: MUSCLE at the config's mask, `ce_weight`,
    learning rate and epochs, and (with `control`) the cross-entropy control at the same budget."""
    from .candidates import Setting

    if not float(cfg.compat_epochs).is_integer() or cfg.compat_epochs < 1:
        raise ValueError(f"compat_epochs: a whole number of epochs ≥ 1, got {cfg.compat_epochs}")
    epochs = int(cfg.compat_epochs)
    muscle = Setting("muscle", cfg.compat_learning_rate, epochs, (("ce_weight", cfg.ce_weight), ("mask", cfg.mask)))
    return [muscle, *([Setting("control", cfg.compat_learning_rate, epochs)] if cfg.control else [])]


def arms_plan(cfg: UpdateConfig, rows: dict, measured: dict | None = None) -> str:
    """The plan of an update without a dev split: what it uses, trains and scores, and for how long (`measured`:
    `Pick.measure`'s seconds per step and per item)."""
    steps = -(-len(rows["train"]) // cfg.batch_size)
    trained = [*([] if cfg.old_model else [f"v1's task adapter on {cfg.old_base}"]),
               *([f"v2's task adapter on {cfg.new_base_path}"] if cfg.new_adapter is None and cfg.new_task_adapter
                 else [])]
    scorings = 3 + int(cfg.control)
    lines = [
        "update: the plan (no dev split: the MUSCLE and control arms at the config's settings)",
        f"  v1: {'your ' + cfg.old_model + ' (used as is)' if cfg.old_model else 'trained: ' + trained[0]}",
        f"  v2: {cfg.new_base_path}" + (f" + your adapter {cfg.new_adapter} (used as is)" if cfg.new_adapter else ""),
        f"  trainings: {len(trained)} task adapter(s) ({steps * cfg.task_epochs:g} steps each), then the MUSCLE "
        f"adapter{' and the control' if cfg.control else ''} ({steps * cfg.compat_epochs:g} steps each)",
        f"  scorings: {scorings} on test ({len(rows['test'])} items)"
        + (f", and lm-eval tasks {cfg.lm_eval_tasks}" if cfg.lm_eval_tasks else ""),
        f"  jobs: each training and scoring on {describe(cfg)}"]
    if measured:
        # distilling steps counted 1.5× a control step (E3's anchor), as in the pick's plan
        train = measured["step_s"] * steps * (len(trained) * cfg.task_epochs + (1.5 + cfg.control) * cfg.compat_epochs)
        score = measured["item_s"] * scorings * len(rows["test"])
        lines.append(f"  time: about {(train + score) / 60:.0f} min (measured here: {measured['step_s']:.2f} s per "
                     f"training step, {measured['item_s']:.2f} s per scored item); stored steps are reused")
    return "\n".join(lines)


def run_update(cfg: UpdateConfig, dry_run: bool = False) -> dict:
    """One update without a dev split: the pick's steps (`pick.Pick`) on its one-setting grid (`arms_settings`) —
    task adapters, the MUSCLE adapter and the control at the config's settings and seed, each scored on test —
    then their flips against v1 (`report.json`, `report.md`, `flips.png`). The adapters are copied to
    `compat_adapter/` and `control_adapter/`; a re-run reuses every stored step."""
    import shutil

    import datasets
    import transformers

    from ..compat.comparison import Comparison, TaskComparison
    from ..compat.render.figure import plot_quadrants
    from ..compat.stats.metrics import delta_metrics, flip_indicators, flip_metrics, paired_rate_difference
    from ..utils.progress import say
    from .pick import Pick

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    start = time.perf_counter()
    pick = Pick(cfg, say=say, settings=arms_settings(cfg))  # tokenizers and rows checked before anything is written
    cfg, rows = pick.cfg, pick.rows
    if dry_run:
        plan = arms_plan(cfg, rows)
        say(plan)
        return {"plan": plan}
    say(arms_plan(cfg, rows, pick.measure()))
    train_rows, test_rows = rows["train"], rows["test"]
    out = Path(cfg.output_dir)

    timings = {}
    t = time.perf_counter()
    pick.prepare()
    timings["task_adapters_s"] = time.perf_counter() - t
    pick.executor = make_executor(cfg, context=pick)  # each training and scoring a job, on the config's executor
    try:
        seconds = pick.run_jobs(pick.jobs("test", ["v1", "v2", *((s, cfg.seed) for s in pick.settings)]))
    finally:
        pick.executor.close()
        pick.executor = None
    v1, v2 = pick.v1_scores("test"), pick.v2_scores("test")  # stored by the jobs, as is everything below
    scores, runs = {}, {}
    for arm, setting in zip(("compat", "control"), pick.settings):
        runs[arm] = pick.train_run(setting, cfg.seed) / f"epoch-{setting.epochs}"
        job = seconds.get(pick.run_step(setting, cfg.seed)[0])
        timings[f"{arm}_adapter_s"] = job["seconds"] if job else 0.0  # 0: stored before
        with finished_dir(out / f"{arm}_adapter") as tmp:
            shutil.copytree(runs[arm], tmp, dirs_exist_ok=True)
        scores[arm] = pick.setting_scores(setting, cfg.seed, "test")
    log = runs["compat"].parent / "log_history.json"
    aligned = [h["compat/frac_aligned_old"] for h in (json.loads(log.read_text()) if log.exists() else [])
               if "compat/frac_aligned_old" in h]

    old_ok, old_pred = v1["correct"], v1["pred"]
    lm_eval_report = _lm_eval_flips(cfg, {"v1": (pick.v1(), pick.tok_old),
                                          "compat": (pick.adapter_model(runs["compat"]), pick.tok_new)},
                                    new_model=(pick.v2(), pick.tok_new)) if cfg.lm_eval_tasks else None
    plain = flip_metrics(old_ok, v2["correct"], old_pred, v2["pred"], seed=cfg.seed)
    compat = flip_metrics(old_ok, scores["compat"]["correct"], old_pred, scores["compat"]["pred"], seed=cfg.seed)
    deltas = delta_metrics(plain, compat)
    control, control_fields = None, {}
    if cfg.control:
        control_ok = scores["control"]["correct"]
        control = flip_metrics(old_ok, control_ok, old_pred, scores["control"]["pred"], seed=cfg.seed)
        # the primary comparison: compat's negative flips against the control's, item by item
        versus = paired_rate_difference(flip_indicators(old_ok, scores["compat"]["correct"])["nfr"],
                                        flip_indicators(old_ok, control_ok)["nfr"], seed=cfg.seed)
        control_fields = {"control_acc": control["new_acc"], "nfr_control": control["nfr"],
                          "nfr_control_ci": control["nfr_ci"], "pfr_control": control["pfr"],
                          "mcnemar_p_v1_control": control["mcnemar_p"],
                          "nfr_compat_minus_control": versus["diff"], "nfr_compat_minus_control_ci": versus["ci"],
                          "mcnemar_p_compat_vs_control": versus["mcnemar_p"]}
    report = {
        "old_base": cfg.old_base, "new_base": cfg.new_base, "n_train": len(train_rows), "n_test": len(test_rows),
        "old_acc": plain["old_acc"], "new_acc": plain["new_acc"], "compat_acc": compat["new_acc"],
        "nfr": plain["nfr"], "nfr_compat": compat["nfr"], "delta_nfr": deltas["delta_nfr"],
        "delta_nfr_pct": deltas["delta_nfr_pct"], "pfr": plain["pfr"], "pfr_compat": compat["pfr"],
        "inconsistency_flips": plain["inconsistency_flips"], "inconsistency_flips_compat": compat["inconsistency_flips"],
        "nfr_ci": plain["nfr_ci"], "nfr_compat_ci": compat["nfr_ci"], "mcnemar_p_v1_v2": plain["mcnemar_p"],
        "mcnemar_p_v1_compat": compat["mcnemar_p"],
        **control_fields, "new_task_adapter": pick.v2_adapter is not None,
        "frac_aligned_old_first_last": [aligned[0], aligned[-1]] if aligned else None,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("train", "test")},
        "lm_eval": lm_eval_report, "timings": timings, "seconds": time.perf_counter() - start,
    }
    quadrants = Comparison(old="v1", new="v2", compatible="v2 + compat", tasks={
        "v1 → v2": TaskComparison(plain, correct=(old_ok, v2["correct"])),
        "v1 → v2 + compatibility adapter": TaskComparison(compat, correct=(old_ok, scores["compat"]["correct"])),
        **({"v1 → v2 + control adapter": TaskComparison(control, correct=(old_ok, scores["control"]["correct"]))}
           if control else {})})
    plot_quadrants(quadrants, out / "flips.png")
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    atomic_write_text(out / "report.md", update_markdown(report))
    return report


SWEEP_KEYS = ("old_acc", "new_acc", "compat_acc", "nfr", "nfr_compat", "delta_nfr", "pfr", "pfr_compat")
CONTROL_KEYS = ("control_acc", "nfr_control", "nfr_compat_minus_control")  # with UpdateConfig.control


def run_update_seeds(make_config: Callable[[int], UpdateConfig], seeds: Sequence[int],
                     output_dir: str | Path) -> dict:
    """`run_update(make_config(seed))` for each seed, into `output_dir/seed-<seed>/`, then the spread.

    Writes `output_dir/seeds.json` and `seeds.md`: per rate (`SWEEP_KEYS`) the mean and min–max over the
    seeds, every seed's rates, the machine, and whether NFR_c < NFR holds beyond the spread (on every
    seed: the largest ΔNFR_c is below 0)."""
    from ..utils.sweeps import machine_info, spread

    if not seeds:
        raise ValueError("seeds: give at least one seed")
    out = Path(output_dir)
    per_seed = []
    for seed in seeds:
        cfg = make_config(seed)
        cfg.output_dir = str(out / f"seed-{seed}")
        report = run_update(cfg)
        keys = SWEEP_KEYS + (CONTROL_KEYS if cfg.control else ())
        per_seed.append({"seed": seed, **{k: report[k] for k in keys}, "n_test": report["n_test"],
                         "mcnemar_p_v1_v2": report["mcnemar_p_v1_v2"],
                         "mcnemar_p_v1_compat": report["mcnemar_p_v1_compat"]})
        logger.info("seed %s: NFR %.4f -> NFR_c %.4f", seed, report["nfr"], report["nfr_compat"])
    summary = {k: spread([r[k] for r in per_seed]) for k in keys}
    result = {"seeds": list(seeds), "summary": summary, "per_seed": per_seed,
              "nfr_compat_below_nfr": sum(r["nfr_compat"] < r["nfr"] for r in per_seed),
              "nfr_compat_at_most_nfr": sum(r["nfr_compat"] <= r["nfr"] for r in per_seed),
              "seeds_without_regressions": sum(r["nfr"] == 0 for r in per_seed),
              "holds_beyond_spread": summary["delta_nfr"]["max"] < 0, "machine": machine_info(),
              "config": {k: v for k, v in dataclasses.asdict(make_config(seeds[0])).items()
                         if k not in ("train", "test", "output_dir", "seed")}}
    atomic_write_text(out / "seeds.json", json.dumps(result, indent=2))
    atomic_write_text(out / "seeds.md", seeds_markdown(result))
    return result


def _lm_eval_flips(cfg: UpdateConfig, models: dict, new_model) -> dict:
    """Per lm-eval task: scores of v1, v2 and v2 + compatibility adapter, and their flips against v1."""

    from ..compat.compare import compare_task
    from ..compat.harness.callback import evaluate_with_lm_eval, task_runs_from_output

    def runs(model, tok):
        out = evaluate_with_lm_eval(model, tok, cfg.lm_eval_tasks, limit=cfg.lm_eval_limit,
                                    num_fewshot=cfg.lm_eval_num_fewshot, batch_size=cfg.batch_size,
                                    gen_kwargs=cfg.lm_eval_gen_kwargs, metadata=cfg.lm_eval_metadata,
                                    include_path=cfg.lm_eval_include_path)
        return task_runs_from_output(out)

    v1_runs = runs(*models["v1"])
    v2_runs = runs(*new_model)
    compat_runs = runs(*models["compat"])
    report = {}
    for task in sorted(v1_runs):
        for filt, entry in compare_task(v1_runs[task], v2_runs[task], compatible=compat_runs[task]).items():
            report[task if filt == "none" else f"{task},{filt}"] = entry.metrics
    return report
