"""`adaptguard update`'s grid on each executor (issue 77): wall time, speedup over the in-process run, and each
executor's overhead per job.

    python benchmarks/bench_update_executors.py                # 4 settings × 2 seeds, 20 epochs; local, ray, submitit
    python benchmarks/bench_update_executors.py --quick        # a smoke run: 2 settings × 1 seed, 2 epochs, 8 + 8 items

The grid: the preset task on the embedded bases (tiny → tiny-v2; 108 train rows, 40 dev, 40 test), the control and
kd at two learning rates each (4 settings, each its own run of `--epochs`) over 2 dev seeds: 8 trainings and 8 + 2
dev scorings, then the pick and the control scored on test for both seeds. On the toy a training step took ~0.08 s
at one thread and about the same at two (AMD EPYC, 2 cores; its matrices are too small to share): in-process, one
core of two works; at 2 epochs a job lasts about a second and the executors' fixed start-up (a Ray cluster, each
worker's imports) would be all one measures: the default 20 epochs make each job 10-20 s, as a grid worth spreading
is. The task adapters are trained once beforehand and copied into each executor's output folder, so each wall time
is `run_update` from the config to `report.json`: the plan (with its 3 measured steps), v1's teacher vectors, every
job, the report. Executors:

- `local`: this process, torch's threads as they are (all cores): `update` as it always ran;
- `ray`: a local Ray cluster started by the run, `--workers` jobs at a time, cores ÷ workers threads each;
- `submitit`: submitit's local executor (a subprocess per job), the same workers and threads: the Slurm path.

Per job, `overhead_s` is the driver's seconds from submitting the job to its result, minus the seconds inside
`executors.run_job` in the worker: starting a process or a Ray task, importing torch and adaptguard, unpickling the
job, returning. The JSON (default studies/results/update_executors.json) also records whether ray and submitit gave the
same `dev_choices.json` and test report (they run at the same threads per job; the in-process run at all cores may
differ in the last float bits of a training). Run it alone: other processes on the cores change every number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def grid_config(out: Path, quick: bool, epochs: int, **kw):
    from adaptguard.update import tiny_preset

    cfg = tiny_preset(str(out))
    rows = cfg.test
    lrs = [2e-3] if quick else [1e-3, 2e-3]
    n = 8 if quick else 40
    return dataclasses.replace(cfg, **{
        "task_epochs": 8, "task_learning_rate": 3e-3, "dev": rows[:n], "test": rows[n:2 * n],
        "candidates": [{"recipe": "control", "learning_rate": lrs, "epochs": [epochs]},
                       {"recipe": "kd", "learning_rate": lrs, "epochs": [epochs]}],
        "dev_seeds": 1 if quick else 2, "test_seeds": [0] if quick else [0, 1], **kw})


def run(name: str, prepared: Path, root: Path, quick: bool, epochs: int, workers: int) -> dict:
    """One executor's run of the grid from the prepared task adapters: wall time, and each job's seconds."""
    from adaptguard.update import pick as pick_module
    from adaptguard.update import run_update

    threads = max(1, (os.cpu_count() or 1) // workers)
    kw = {"local": {}, "ray": {"executor": "ray", "workers": workers, "cpus_per_job": threads},
          "submitit": {"executor": "slurm", "slurm_cluster": "local", "workers": workers,
                       "cpus_per_job": threads}}[name]
    out = root / name
    for folder in ("v1_task_adapter", "v2_task_adapter"):
        shutil.copytree(prepared / folder, out / folder)
    jobs: dict[str, dict] = {}
    started: list[float] = []
    real, real_make = pick_module.run_jobs, pick_module.make_executor

    def recorded(executor, batch, *args, **kwargs):
        result = real(executor, batch, *args, **kwargs)
        jobs.update(result)
        return result

    def timed(*args, **kwargs):
        start = time.perf_counter()
        executor = real_make(*args, **kwargs)
        started.append(time.perf_counter() - start)
        return executor

    pick_module.run_jobs, pick_module.make_executor = recorded, timed
    try:
        start = time.perf_counter()
        report = run_update(grid_config(out, quick, epochs, **kw))
        wall = time.perf_counter() - start
    finally:
        pick_module.run_jobs, pick_module.make_executor = real, real_make
    overheads = [j["seconds"] - j["in_job_s"] for j in jobs.values()]
    return {"wall_s": wall, "executor_start_s": started[0], "jobs": len(jobs),
            "job_s_sum": sum(j["seconds"] for j in jobs.values()),
            "in_job_s_sum": sum(j["in_job_s"] for j in jobs.values()),
            "overhead_s_mean": statistics.mean(overheads), "overhead_s_median": statistics.median(overheads),
            "overhead_s_max": max(overheads), "threads_per_job": kw.get("cpus_per_job"), "workers": kw.get("workers", 1),
            "pick": report["dev"]["chosen_setting"]["label"], "out": str(out)}


def same(a: Path, b: Path) -> bool:
    ra, rb = (json.loads((d / "report.json").read_text()) for d in (a, b))
    return ((a / "dev_choices.json").read_bytes() == (b / "dev_choices.json").read_bytes()
            and (ra["test"], ra["verdict"]) == (rb["test"], rb["verdict"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 settings × 1 seed, 8 dev and test items")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None, help="epochs of every training (default 20: about 140 "
                        "steps, 10-20 s a job on 2 cores, so that a job outlasts an executor's start-up; --quick: 2)")
    parser.add_argument("--executors", nargs="+", default=["local", "ray", "submitit"],
                        choices=["local", "ray", "submitit"])
    parser.add_argument("--json", default=None, help="where to write the results (default: studies/results/"
                        "update_executors.json; --quick: none)")
    args = parser.parse_args()

    import datasets

    from adaptguard.update.pick import Pick
    from adaptguard.utils.sweeps import machine_info

    datasets.disable_progress_bars()
    root = Path(tempfile.mkdtemp(prefix="bench_update_executors_"))
    try:
        epochs = args.epochs or (2 if args.quick else 20)
        prepared = root / "prepared"  # the task adapters, once (the driver's part, the same for every executor)
        Pick(grid_config(prepared, args.quick, epochs)).prepare()
        results = {name: run(name, prepared, root, args.quick, epochs, args.workers) for name in args.executors}
        for name, r in results.items():
            print(f"{name}: {r['wall_s']:.1f} s wall ({r['executor_start_s']:.1f} s to start the executor), {r['jobs']} "
                  f"jobs, overhead per job {r['overhead_s_mean']:.2f} s "
                  f"(median {r['overhead_s_median']:.2f}, max {r['overhead_s_max']:.2f}); pick {r['pick']}")
        summary = {"machine": {**machine_info(), "cores": os.cpu_count()}, "quick": args.quick,
                   "grid": f"4 settings (control, kd × lr 1e-3, 2e-3; {epochs} epochs) × 2 dev seeds, test seeds [0, 1]"
                   if not args.quick else f"2 settings × 1 seed, {epochs} epochs (smoke)", "executors": results}
        if "local" in results and "ray" in results:
            summary["speedup_ray_vs_local"] = results["local"]["wall_s"] / results["ray"]["wall_s"]
            print(f"speedup, ray ({args.workers} workers) over in-process: {summary['speedup_ray_vs_local']:.2f}×")
        if "ray" in results and "submitit" in results:
            summary["ray_equals_submitit"] = same(Path(results["ray"]["out"]), Path(results["submitit"]["out"]))
        if "local" in results and "ray" in results:
            summary["local_equals_ray"] = same(Path(results["local"]["out"]), Path(results["ray"]["out"]))
        for r in results.values():
            r.pop("out")
        if args.json or not args.quick:
            path = Path(args.json or ROOT / "studies/results/update_executors.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=2) + "\n")
            print(f"written: {path}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
