"""`adaptguard update`: what a model update breaks on your task, and which retraining gets it back."""

from __future__ import annotations

import argparse
import dataclasses

from .common import add_command, positive_int

UPDATE_EPILOG = """\
example: adaptguard update config.json --dry-run   (then without --dry-run; --preset tiny runs the embedded pair)

rows (train, dev, test: a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, a Hub dataset, or a list) are
prompt/completion pairs, plain text or conversational (lists of chat messages); the completion is the answer
scored by exact match of the greedy generation:
  {"prompt": "Q: capital of France? A:", "completion": " Paris"}
  {"prompt": [{"role": "user", "content": "capital of France?"}],
   "completion": [{"role": "assistant", "content": "Paris"}]}
your models: "old_model" is v1 as you ship it (a PEFT adapter on old_base, or a full model), "new_adapter" v2's own
adapter on new_base; both are used as they are. Without them, update trains them from train first.
beyond this process: every training and scoring is a job stored in its own folder (the same results anywhere; a
killed run resumes on any executor, redoing only unfinished jobs):
  --executor ray --workers 2                 a local Ray cluster, 2 jobs at a time
  --executor ray --ray-address auto          a running Ray cluster (config: cpus_per_job, gpus_per_job)
  --executor slurm --slurm-partition gpu     Slurm via submitit (config: slurm_time_min, gpus_per_job, slurm_args)
"""


def _update(ns: argparse.Namespace) -> int:
    import sys

    from ..update.executors import JobsFailed

    try:
        return _run(ns)
    except JobsFailed as err:  # the others are stored: a re-run redoes only these
        print(f"adaptguard update: {err}", file=sys.stderr)
        return 1


def _run(ns: argparse.Namespace) -> int:
    from ..update import (
        UpdateConfig,
        run_update,
        run_update_seeds,
        tiny_preset,
    )

    if (ns.config is None) == (ns.preset is None):
        raise ValueError("give a CONFIG file or --preset tiny (one of them)")
    if ns.seeds is not None:
        from ..utils.sweeps import seed_list

        seeds = seed_list(ns.seeds)  # before any model is built
    cfg = tiny_preset(ns.out or "update-out") if ns.preset else UpdateConfig.from_file(ns.config)
    if ns.out and not ns.preset:
        cfg.output_dir = ns.out
    where = {k: getattr(ns, k) for k in ("executor", "workers", "ray_address", "slurm_partition")
             if getattr(ns, k) is not None}
    if where:
        cfg = dataclasses.replace(cfg, **where)  # checked again, as in a config file
    if ns.dev_seeds is not None:
        if cfg.dev is None:
            raise ValueError("--dev-seeds averages the pick's dev scores over seeds: it needs a dev split (set dev)")
        cfg.dev_seeds = ns.dev_seeds
    if cfg.dev is not None:  # the pick: --seeds N tests the pick and the control over seeds 0..N-1
        if ns.seeds is not None:
            cfg.test_seeds = seeds
        report = run_update(cfg, dry_run=ns.dry_run)
        if ns.dry_run:
            return 0
        print(f"{report['verdict']}  ({cfg.output_dir}/report.md, chosen adapter: {cfg.output_dir}/chosen)")
        return report["exit_status"]  # by the verdict (`UpdateVerdict.exit_code`): 0 shipped, 1 worse, 3 undecided
    if ns.dry_run:
        run_update(cfg, dry_run=True)
        return 0
    if ns.seeds is not None:
        from ..utils.sweeps import format_spread

        def make_config(seed: int) -> UpdateConfig:  # the preset also re-draws its train/test split
            return (dataclasses.replace(tiny_preset(split_seed=seed, seed=seed), **where) if ns.preset
                    else dataclasses.replace(cfg, seed=seed))

        result = run_update_seeds(make_config, seeds, cfg.output_dir)
        s = result["summary"]
        print(
            f"{ns.seeds} seeds, mean (min-max): old acc {format_spread(s['old_acc'])}  new acc "
            f"{format_spread(s['new_acc'])}  compat acc {format_spread(s['compat_acc'])}  NFR "
            f"{format_spread(s['nfr'])} -> NFR_c {format_spread(s['nfr_compat'])}; NFR_c < NFR on "
            f"{result['nfr_compat_below_nfr']} of {ns.seeds} seeds  ({cfg.output_dir}/seeds.md)"
        )
        return 0
    report = run_update(cfg)
    print(
        f"old acc {report['old_acc']:.3f}  new acc {report['new_acc']:.3f}  compat acc {report['compat_acc']:.3f}  "
        f"NFR {report['nfr']:.3f} -> NFR_c {report['nfr_compat']:.3f}  ({cfg.output_dir}/report.md)"
    )
    return 0


def add(sub) -> None:
    upd = add_command(
        sub,
        "update",
        extra="train",
        help="Measure what a model update breaks on your task, and retrain to get it back (control and recipes).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=UPDATE_EPILOG,
    )
    upd.add_argument("config", nargs="?", help="JSON config (fields of adaptguard.update.UpdateConfig)")
    upd.add_argument("--preset", choices=["tiny"], help="run on the embedded default (tiny -> tiny-v2)")
    upd.add_argument("--out", help="output directory (overrides the config's output_dir)")
    upd.add_argument(
        "--seeds",
        type=int,
        help="repeat over seeds 0..N-1 (the preset also re-draws its split) and "
        "report mean and min-max: toy results move with the CPU's float noise; with a dev split, test "
        "the pick and the control over these seeds (two or more measure seed noise)",
    )
    upd.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (the models used or trained, the number "
        "of trainings and scorings, the time measured from the first steps) and stop; nothing is written",
    )
    upd.add_argument(
        "--dev-seeds",
        type=positive_int,
        help="with a dev split: average each candidate setting's dev "
        "scores over this many seeds before the pick (default 1; cost grows with it)",
    )
    upd.add_argument("--executor", choices=["local", "ray", "slurm"],
                     help="where the jobs run (the config's `executor`): this process (default), Ray, Slurm via submitit")
    upd.add_argument("--workers", type=positive_int, help="jobs at once on ray or slurm (the config's `workers`)")
    upd.add_argument("--ray-address", help="a running Ray cluster, e.g. auto or ray://head:10001 (default: a local one)")
    upd.add_argument("--slurm-partition", help="the Slurm partition of the jobs")
    upd.set_defaults(func=_update)
