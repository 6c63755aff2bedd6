"""The plan `adaptguard update` prints before any work: what the pick (`pick.Pick`) will use, train and score, and
for how long.

Each function reads a `Pick` — its config, grid, rows and store — and loads no model: the seconds per training step
and per scored item are `Pick.measure`'s, passed in, and the wall time on several workers replays the scheduler's
order on them (`scheduler.makespan`).
"""

from __future__ import annotations

from .executors import describe, job_resources
from .scheduler import makespan


def counts(pick) -> dict:
    """How many trainings and scorings the run needs at most (a stored step is reused, not redone)."""
    runs = {s.run for s in pick.settings}
    dev_seeds, test_seeds = pick.dev_seeds(), pick.cfg.test_seeds or [pick.cfg.seed]
    extra_test = [s for s in test_seeds if s not in dev_seeds]
    epochs = max(s.epochs for s in pick.settings)
    steps = -(-len(pick.rows["train"]) // pick.cfg.batch_size) * epochs
    return {"runs": len(runs) * len(dev_seeds) + 2 * len(extra_test), "steps_per_run": steps,
            "distilling_runs": len({r for r in runs if r[0] != "control"}) * len(dev_seeds),
            "dev_scorings": len(pick.settings) * len(dev_seeds) + 2,
            "test_scorings": 2 * len(test_seeds) + 2, "task_adapters": int(pick.cfg.old_model is None) + int(
                pick.cfg.new_adapter is None and pick.cfg.new_task_adapter),
            "task_adapter_steps": -(-len(pick.rows["train"]) // pick.cfg.batch_size) * pick.cfg.task_epochs}


def estimate(pick, measured: dict, workers: int | None) -> float:
    """Seconds of the grid's jobs at most (every step to do) on `workers` (`scheduler.makespan`, as `run_jobs`
    orders them): the dev stage's trainings and scorings, then the test stage's."""
    c, dev, test = counts(pick), len(pick.rows["dev"]), len(pick.rows["test"])
    durations, needs = [dev * measured["item_s"]] * 2, [(), ()]  # v1 and v2 on dev
    for run in dict.fromkeys(s.run for s in pick.settings):
        for _ in pick.dev_seeds():
            needs.append(())
            durations.append(c["steps_per_run"] * measured["step_s"] * (1 if run[0] == "control" else 1.5))
            kept = [s for s in pick.settings if s.run == run]
            needs += [(len(durations) - 1,)] * len(kept)
            durations += [dev * measured["item_s"]] * len(kept)
    seconds = makespan(durations, needs, workers)
    test_seeds = pick.cfg.test_seeds or [pick.cfg.seed]
    extra = [s for s in test_seeds if s not in pick.dev_seeds()]
    durations, needs = [test * measured["item_s"]] * 2, [(), ()]  # v1 and v2 on test
    for seed in test_seeds:
        for _ in ("pick", "control"):
            if seed in extra:
                needs.append(())
                durations.append(c["steps_per_run"] * measured["step_s"])
            needs.append((len(durations) - 1,) if seed in extra else ())
            durations.append(test * measured["item_s"])
    return seconds + makespan(durations, needs, workers)


def pending_runs(pick) -> int:
    """Dev-stage training runs not stored yet (needs `prepare`'s adapters; 0 on a finished run's re-run)."""
    seen, pending = set(), 0
    for setting in pick.settings:
        for seed in pick.dev_seeds():
            name, key = pick.run_step(setting, seed)
            if name not in seen and pick.store.find(name, key) is None:
                pending += 1
            seen.add(name)
    return pending


def plan(pick, measured: dict | None) -> str:
    """What the run will use, train and score, and for how long (from `Pick.measure`'s seconds)."""
    cfg, c = pick.cfg, counts(pick)
    old = (f"your {'model' if cfg.old_is_full_model else 'adapter'} {cfg.old_model} (used as is)"
           if cfg.old_model else f"a task adapter trained on {cfg.old_base} from train ({len(pick.rows['train'])} "
                                 f"rows, lr {cfg.task_learning_rate:g}, {cfg.task_epochs:g} epochs)")
    new_base = (f"{cfg.new_base_path} quantized ({cfg.new_quantization.get('library', '?')})"
                if cfg.new_quantization else cfg.new_base_path)
    new = (f"{new_base} + your adapter {cfg.new_adapter} (used as is)" if cfg.new_adapter else
           f"{new_base} + its own task adapter, trained from train" if cfg.new_task_adapter else
           f"{new_base}" + (" + v1's adapter" if cfg.new_quantization and not cfg.old_is_full_model else ""))
    lines = ["update: the plan", f"  v1: {old}", f"  v2: {new}",
             f"  trainings: {c['runs']} ({len(pick.settings)} settings of {len({s.run for s in pick.settings})} "
             f"runs × {len(pick.dev_seeds())} dev seed(s), then the pick and the control on the other test "
             f"seeds), {c['steps_per_run']} steps each; {c['task_adapters']} task adapter(s) to train first",
             f"  scorings: {c['dev_scorings']} on dev ({len(pick.rows['dev'])} items), {c['test_scorings']} on test "
             f"({len(pick.rows['test'])} items)"]
    workers = job_resources(cfg)[0]
    lines.append(f"  jobs: each training and scoring on {describe(cfg)}")
    if measured:
        task = c["task_adapters"] * c["task_adapter_steps"] * measured["step_s"]
        one, wall = estimate(pick, measured, 1), estimate(pick, measured, workers)
        lines.append(f"  time: about {_duration(task + one)} at most (measured here: {measured['step_s']:.2f} s "
                     f"per training step, {measured['item_s']:.2f} s per scored item; distilling runs counted "
                     f"1.5× a control step, E3's anchor, not measured); stored steps are reused")
        if workers != 1:
            lines.append(f"  on {workers or 'as many'} workers: about {_duration(task + wall)} (the jobs' own "
                         "start-up — imports, loading the models — not counted; studies/results.md measures it)")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
