"""The jobs of `pick.Pick`'s stages: each unfinished step (a training, a scoring) as one picklable description that an
executor (`executors`) runs in this process, on Ray or on Slurm, its output that step's folder of the pick's `Store`.

A job records what the driver knew (its resolved config, the grid, the task adapters it prepared), the step's name
and key, and the `Pick` class that made it: a worker builds that class's `Pick` of the run from the job
(`worker_pick`) and runs the step through it, the code path of the in-process run. This module imports no `Pick`:
`pick` makes the jobs, and a job knows its maker.

`python -m adaptguard.update.jobs JOB.pkl TMP` is one rank of a training spread over processes (`Pick._launch`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ..utils.store import digest
from .candidates import Setting
from .config import UpdateConfig


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainJob:
    """One training of the grid as a picklable description: what the driver knew (its resolved config, the grid, the
    task adapters it prepared), the setting and seed, and the run key it computed. Its output is the run's folder
    `steps/<name>`; a worker that computes another key (another adaptguard, other files) fails instead of storing
    elsewhere."""

    cfg: UpdateConfig
    settings: tuple
    adapters: tuple  # (v1's task adapter, v2's), as `Pick.prepare` found or trained them
    setting: Setting
    seed: int
    name: str
    key: dict
    needs: tuple = ()
    pick_class: type | None = None  # the `Pick` class that made the job: a worker builds one from it (`worker_pick`)
    kind = "train"

    @classmethod
    def of(cls, pick, setting: Setting, seed: int) -> TrainJob:
        """The training of `setting` at `seed` in `pick`'s run (a `pick.Pick`)."""
        return cls(pick.cfg, tuple(pick.settings), (pick.v1_adapter, pick.v2_adapter), setting, seed,
                   *pick.run_step(setting, seed), pick_class=type(pick))

    @property
    def label(self) -> str:
        return f"train {self.setting.label(epochs=False)} seed {self.seed}"

    def run(self, pick=None) -> Path:
        """The training, by `Pick.train_run` on `pick` (in-process: the driver's) or on this worker's `Pick`."""
        pick = pick or worker_pick(self)
        name, key = pick.run_step(self.setting, self.seed)
        if name != self.name or not _same(key, self.key):
            raise RuntimeError(f"{self.label}: this worker computes the run {name}, the driver {self.name}: is the "
                               "same adaptguard installed, and are the task adapters the same files here?")
        return pick.train_run(self.setting, self.seed)

    def train_rank(self, tmp: Path) -> None:
        """This process's rank of the training spread over processes (`Pick._launch`): rank 0 writes the adapters
        into `tmp`."""
        pick = worker_pick(self)
        pick._train(self.setting, self.seed, self.key["epochs"], sorted({s.epochs for s in pick.settings}), tmp)


@dataclasses.dataclass(frozen=True, eq=False)
class ScoreJob:
    """One scoring as a picklable description: a model ("v1", "v2", or a (setting, seed) of the grid, whose training
    it `needs`) on a split. Its output is the score's folder `steps/<name>`."""

    cfg: UpdateConfig
    settings: tuple
    adapters: tuple
    split: str
    model: object
    name: str
    key: dict
    needs: tuple = ()
    pick_class: type | None = None  # as `TrainJob.pick_class`
    kind = "score"

    @classmethod
    def of(cls, pick, split: str, model, needs: tuple = ()) -> ScoreJob:
        """The scoring of `model` on `split` in `pick`'s run (a `pick.Pick`)."""
        return cls(pick.cfg, tuple(pick.settings), (pick.v1_adapter, pick.v2_adapter), split, model,
                   *pick.score_step(*pick.model_identity(model), split), needs, pick_class=type(pick))

    @property
    def label(self) -> str:
        model = self.model if isinstance(self.model, str) else f"{self.model[0].label()} seed {self.model[1]}"
        return f"score {model} on {self.split}"

    def run(self, pick=None) -> Path:
        pick = pick or worker_pick(self)
        if self.model == "v1":
            pick.v1_scores(self.split)
        elif self.model == "v2":
            pick.v2_scores(self.split)
        else:
            pick.setting_scores(*self.model, self.split)
        return pick.store.root / self.name


_worker: tuple[str, object] | None = None  # a worker's Pick, kept for its next job of the same run (Ray reuses workers)


def worker_pick(job: TrainJob | ScoreJob):
    """The `Pick` of a job's run in a worker (of the job's `pick_class`): built from the job's config and grid
    (tokenizers, rows), with the task adapters the driver prepared (nothing is trained here but the job)."""
    global _worker
    ident = digest([dataclasses.asdict(job.cfg), job.settings, job.adapters])
    if _worker is None or _worker[0] != ident:
        import datasets
        import transformers

        if job.pick_class is None:
            raise ValueError(f"{job.label}: the job names no Pick class to build its run with (make it by `.of`)")
        datasets.disable_progress_bars()  # a worker's log keeps the trainings' own lines, as the driver's output does
        transformers.utils.logging.disable_progress_bar()
        pick = job.pick_class(job.cfg, settings=list(job.settings))
        pick.v1_adapter, pick.v2_adapter = job.adapters
        _worker = ident, pick
    return _worker[1]


if __name__ == "__main__":  # one rank of a training spread over processes (`Pick._launch`): JOB.pkl TMP
    import pickle

    # the job's class is the package module's (adaptguard.update.jobs), so its worker's Pick is kept there
    pickle.loads(Path(sys.argv[1]).read_bytes()).train_rank(Path(sys.argv[2]))
