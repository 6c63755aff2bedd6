"""`adaptguard update`: what a model update breaks on the user's task, and the adapters that get it back.

`config` (`UpdateConfig`, one JSON file), `candidates` and `pick` (`Pick`, the one training path: task adapters, the
recipes' settings trained, stored and scored; `run_pick`: with a dev split the grids are chosen on dev and the pick
tested against the control), `pick_plan` (the plan printed first: counts and time), `pick_stages` (the dev and test
stages, the shipped adapter), `jobs` (its steps as picklable jobs) run by `executors` in the order of `scheduler`
(`run_jobs`, `makespan`), `callbacks` (its trainers' callbacks), `pick_report` (the pick's verdict, `report.md`,
`report.html`, the dev figure), `arms` (without a dev split: the MUSCLE and control arms at the config's settings
through the same `Pick`, their flips; `run_update_seeds`), `steps` (rows, the user's models, task adapters: what `Pick`
runs), `report` (the arms' `report.md`, `seeds.md`), `presets` (`tiny_preset`: the experiment on the embedded bases)."""

from .arms import run_update_seeds
from .config import UpdateConfig
from .presets import paraphrase_split, tiny_preset

__all__ = ["UpdateConfig", "paraphrase_split", "run_update", "run_update_seeds", "tiny_preset"]


def run_update(cfg: UpdateConfig, dry_run: bool = False) -> dict:
    """`adaptguard update CONFIG`: with `cfg.dev`, choose among the candidates on dev and test the pick against the
    control (`pick.run_pick`); without, train and report the MUSCLE and control arms (`arms.run_update`). Both
    print their plan first; `dry_run` stops there, before anything is written."""
    if cfg.dev is not None:
        from .pick import run_pick

        return run_pick(cfg, dry_run=dry_run)
    from .arms import run_update as run_arms

    return run_arms(cfg, dry_run=dry_run)
