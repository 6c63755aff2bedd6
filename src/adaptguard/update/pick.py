"""`adaptguard update` with a dev split: which way of retraining breaks the fewest of v1's answers on the user's task.

1. Every candidate setting (`candidates.expand_candidates`: recipe × learning rate × recipe fields; the control
   among them with the same budget) trains once on train, from the adapter v2 ships with, to the grid's largest
   epoch count; its adapter is kept after each epoch of the grid (the MUSCLE paper keeps its best epoch the same way).
2. Each kept adapter is scored on dev (exact match of the greedy answer); `candidates.pick_setting` picks by the
   registered rule, at matched accuracy; `dev_choices.json` is written before any test item is read.
3. The pick and the best control setting are trained for every test seed and scored on test: accuracy, NFR, PFR,
   BTC against v1, and the pick − control difference item by item (bootstrap CI over items, McNemar per seed).
4. `chosen/` holds the pick's adapter (seed `cfg.seed`); `report.json`, `report.md` (with the one-sentence verdict),
   `report.html` and `dev_tradeoff.png` (every setting's dev accuracy vs NFR) sit beside it (`pick_report`).

Every trained run and every per-item score is a step of a `Store` under `steps/`, kept with its settings: a killed
run resumes without redoing any finished step. Each unfinished step of a stage is a job (`jobs.TrainJob`,
`jobs.ScoreJob`: one picklable description, its output that step's folder) run by the config's executor (`executors`:
in this process by default, on Ray, or on Slurm through submitit); the stage then reads the stored steps, so the
numbers do not depend on where the jobs ran, and a run resumes on any executor. The trainings' callbacks are in
`callbacks`.

One job per module: `Pick` (here) holds a run's state and its steps — the models, each training and scoring stored
under its key, the jobs that run them; `pick_plan` says what the run will do and for how long, `pick_stages` runs
the dev and test stages and ships the pick, each a function of a `Pick`; `run_pick` (here) puts them in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..utils.files import atomic_write_text
from ..utils.generation import exact_match, generate_answers
from ..utils.store import Store, digest
from .callbacks import SaveAtEpochs, StepTimer
from .candidates import Setting, expand_candidates
from .config import UpdateConfig
from .executors import InProcess, Runtime, make_executor
from .jobs import ScoreJob, TrainJob
from .pick_plan import counts, pending_runs, plan
from .pick_report import flipped_test_items, markdown, plot_dev, update_page, verdict
from .pick_stages import dev_stage, ship, test_stage
from .scheduler import run_jobs


def _adapter_identity(adapter: Path | str | None):
    """What made a task adapter (its marker; for a user's adapter, its path and weights' digest), so a stored step
    built on it is redone when it changes."""
    if adapter is None:
        return None
    path = Path(adapter)
    marker = path / "adaptguard_task_adapter.json"
    if marker.exists():
        return json.loads(marker.read_text())
    weights = sorted(path.glob("adapter_model*"))
    weights_hash = hashlib.sha256(b"".join(w.read_bytes() for w in weights)).hexdigest()[:16] if weights else None
    return {"path": str(adapter), "weights": weights_hash}


class Pick:
    """The steps of one pick (see the module docstring), each stored and reused: one run's config, grid, rows and
    store, the models it loads, its trainings and scorings, and the jobs that run them. The plan (`pick_plan`) and
    the stages (`pick_stages`) read a `Pick`; a worker builds its own from a job (`jobs.worker_pick`)."""

    def __init__(self, cfg: UpdateConfig, say=print, settings: list[Setting] | None = None):
        """`settings`: the grid to train (default: the candidates' settings; `arms.arms_settings` without dev)."""
        from transformers import AutoTokenizer

        from ..muscle.trainer import check_same_vocabulary
        from .steps import load_rows, old_tokenizer_source, resolved

        self.cfg, self.say = resolved(cfg), say
        self.tok_old = AutoTokenizer.from_pretrained(old_tokenizer_source(self.cfg))
        self.tok_new = AutoTokenizer.from_pretrained(self.cfg.new_base_path)
        self.rows = load_rows(self.cfg)  # checked (non-empty, disjoint) before anything is written
        self.settings = settings or expand_candidates(self.cfg.candidates or self.cfg.default_candidates())
        if any(s.recipe != "control" for s in self.settings):  # the control reads no v1 logits
            check_same_vocabulary(self.tok_old, self.tok_new, "old_base/new_base: " if settings else
                                  "old_base/new_base (a candidate distils from v1): ")
        self.out = Path(self.cfg.output_dir)
        self.store = Store(self.out / "steps")
        self._v1 = None
        self.executor = None  # where the stages' jobs run (`run_pick` sets the config's; None: this process)

    def dev_seeds(self) -> list[int]:
        """The seeds every setting trains at on dev (the plan counts them, the dev stage averages over them)."""
        return [self.cfg.seed + k for k in range(self.cfg.dev_seeds)]

    # -- models -------------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        from .steps import store_new_base, task_adapters

        self.out.mkdir(parents=True, exist_ok=True)
        store_new_base(self.cfg)
        self.v1_adapter, self.v2_adapter = task_adapters(self.cfg, self.rows["train"], self.out, self.tok_old,
                                                         self.tok_new)

    def v1(self):
        """v1's task model, merged (the teacher of every distilling recipe)."""
        if self._v1 is None:
            from .steps import v1_task_model

            self._v1 = v1_task_model(self.cfg, self.v1_adapter)
        return self._v1

    def v1_vectors(self) -> Path | None:
        """v1 read once into an exact cache of teacher vectors (`muscle.logit_cache.build_vector_cache`, float32) that
        every distilling run of every candidate and seed reads instead of running v1 at each step; stored and reused
        like the other steps. None where the exact loss does not serve (the new base's output layer soft-caps, or the
        training packs rows, which a cache keyed by rows cannot follow): those runs keep v1 online."""
        import dataclasses

        import torch
        from datasets import Dataset
        from trl import SFTConfig

        from ..muscle.exact import check_reducible
        from ..muscle.heads import output_head
        from ..muscle.logit_cache import cache_logits_for_training, head_fingerprint
        from .steps import load_new_base

        cfg = self.cfg
        if cfg.extra_args.get("packing") or cfg.extra_args.get("padding_free"):
            return None
        head = output_head(load_new_base(cfg))
        head = head._replace(weight=head.weight.detach(), bias=None if head.bias is None else head.bias.detach())
        if check_reducible(head):
            return None
        sft_fields = {f.name for f in dataclasses.fields(SFTConfig)}
        key = {"v1": [cfg.old_base, cfg.old_model if cfg.old_is_full_model else None, _adapter_identity(self.v1_adapter)],
               "train": digest(self.rows["train"]), "head": head_fingerprint(head), "temperature": cfg.temperature,
               "max_length": cfg.max_length, "extra_args": cfg.extra_args}
        step = self.store.get(f"v1_vectors_{digest(key)}", key, lambda tmp: cache_logits_for_training(
            self.v1(), self.tok_new, Dataset.from_list(self.rows["train"]), tmp / "cache", max_length=cfg.max_length,
            student_head=head, temperature=cfg.temperature, dtype=torch.float32,
            sft_kwargs={k: v for k, v in cfg.extra_args.items() if k in sft_fields}))
        return step / "cache"

    def v2(self):
        from .steps import v2_task_model

        return v2_task_model(self.cfg, self.v2_adapter)

    def adapter_model(self, adapter: Path):
        from peft import PeftModel

        from .steps import load_new_base

        return PeftModel.from_pretrained(load_new_base(self.cfg), adapter)

    # -- steps ----------------------------------------------------------------------------------------------------
    def score_step(self, name: str, identity, split: str) -> tuple[str, dict]:
        """(folder name, settings) of the stored scores of a model (`identity`: what made it) on a split."""
        settings = {"split": split, "rows": digest(self.rows[split]), "max_new_tokens": self.cfg.max_new_tokens,
                    "model": name, "identity": identity}
        return f"score_{split}_{digest(settings)}", settings

    def scores(self, name: str, identity, split: str, model_fn, tokenizer=None) -> dict:
        """{"correct": [...], "pred": [...]} of a model (`identity`: what made it) on a split, stored."""
        from .steps import for_scoring

        rows = self.rows[split]

        def make(tmp: Path) -> None:
            self.say(f"update: scoring {name} on {split} ({len(rows)} items)")
            preds = generate_answers(for_scoring(model_fn(), self.cfg), tokenizer or self.tok_new, rows,
                                     self.cfg.max_new_tokens)
            correct = exact_match(preds, rows)
            (tmp / "scores.json").write_text(json.dumps({"correct": correct, "pred": preds}))

        folder = self.store.get(*self.score_step(name, identity, split), make)
        return json.loads((folder / "scores.json").read_text())

    def run_key(self, setting: Setting, seed: int) -> dict:
        cfg = self.cfg
        return {"recipe": setting.recipe, "learning_rate": setting.learning_rate, "fields": dict(setting.fields),
                "epochs": max(s.epochs for s in self.settings), "seed": seed, "train": digest(self.rows["train"]),
                "v2_adapter": _adapter_identity(self.v2_adapter), "new_base": cfg.new_base, "old_base": cfg.old_base,
                "v1_adapter": _adapter_identity(self.v1_adapter),  # the teacher of every distilling recipe
                **{k: getattr(cfg, k) for k in ("lora_r", "lora_alpha", "batch_size", "max_length", "temperature",
                                                "extra_args")},
                # a training spread over processes splits the batch among them: another run (float sums differ)
                **({"processes": cfg.processes_per_job} if cfg.processes_per_job > 1 else {})}

    def run_step(self, setting: Setting, seed: int) -> tuple[str, dict]:
        """(folder name, run key) of one training run."""
        key = self.run_key(setting, seed)
        return f"run_{setting.recipe}_{digest(key)}", key

    def train_run(self, setting: Setting, seed: int) -> Path:
        """One training run of `setting`'s recipe, learning rate and fields: adapters after each grid epoch (in this
        process, or spread over `processes_per_job` processes by `accelerate launch`)."""
        name, key = self.run_step(setting, seed)
        epochs = sorted({s.epochs for s in self.settings})
        if self.cfg.processes_per_job > 1:
            return self.store.get(name, key, lambda tmp: self._launch(setting, seed, tmp))
        return self.store.get(name, key, lambda tmp: self._train(setting, seed, key["epochs"], epochs, tmp))

    def _launch(self, setting: Setting, seed: int, tmp: Path) -> None:
        """`_train` in `processes_per_job` processes (`accelerate launch`, one per GPU; on CPU, gloo), each running
        `jobs` on the job's description (`TrainJob.train_rank`); rank 0 writes the adapters into `tmp`."""
        import pickle
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        job = TrainJob.of(self, setting, seed)
        (tmp / "job.pkl").write_bytes(pickle.dumps(job))
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1",
               "--num_processes", str(self.cfg.processes_per_job), "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), "-m", "adaptguard.update.jobs", str(tmp / "job.pkl"), str(tmp)]
        self.say(f"update: {job.label} over {self.cfg.processes_per_job} processes: {' '.join(cmd[2:])}")
        subprocess.run(cmd, check=True)
        (tmp / "job.pkl").unlink()

    def _train(self, setting: Setting, seed: int, max_epochs: int, epochs: list[int], tmp: Path) -> None:
        from datasets import Dataset
        from transformers import PrinterCallback

        from ..muscle.config import MUSCLEConfig
        from ..muscle.trainer import MUSCLETrainer
        from ..talr.config import TALRConfig
        from ..talr.trainer import TALRTrainer
        from ..utils.progress import TrainingProgress
        from .steps import adapter_start, training_kwargs

        cfg = self.cfg
        world = int(os.environ.get("WORLD_SIZE", "1"))  # under `_launch`: the batch split among the processes
        kwargs = training_kwargs(cfg, output_dir=str(tmp / "trainer"), learning_rate=setting.learning_rate,
                                  num_train_epochs=max_epochs, seed=seed,
                                  **({"per_device_train_batch_size": cfg.batch_size // world} if world > 1 else {}))
        model, peft_config = adapter_start(cfg, self.v2_adapter, seed)
        data = Dataset.from_list(self.rows["train"])
        if setting.recipe == "control":  # cross-entropy on the labels: v1 is not needed
            trainer = TALRTrainer(model=model, args=TALRConfig(**kwargs, weighting="none"), train_dataset=data,
                                  processing_class=self.tok_new, peft_config=peft_config)
        else:
            fields = {"temperature": cfg.temperature, **dict(setting.fields)}
            vectors = self.v1_vectors()  # v1 read once for every run; None: v1 runs online
            teacher = {"old_model": self.v1(), "old_processing_class": self.tok_old} if vectors is None else {}
            trainer = MUSCLETrainer(model=model, args=MUSCLEConfig(**kwargs, recipe=setting.recipe, **fields, **(
                {} if vectors is None else {"old_logits_cache": str(vectors)})), train_dataset=data,
                                    processing_class=self.tok_new, peft_config=peft_config, **teacher)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(TrainingProgress(f"update: {setting.label(epochs=False)} seed {seed}"))
        trainer.add_callback(SaveAtEpochs(epochs, tmp, getattr(trainer, "_student_adapter", None)))
        trainer.train()
        if trainer.is_world_process_zero():
            (tmp / "log_history.json").write_text(json.dumps(trainer.state.log_history))
            shutil.rmtree(tmp / "trainer", ignore_errors=True)

    def model_identity(self, model) -> tuple[str, object]:
        """(name, identity) of a scored model: "v1", "v2", or a (setting, seed) of the grid (its run's folder)."""
        if model == "v1":
            return "v1", [self.cfg.old_base, self.cfg.old_model if self.cfg.old_is_full_model else None,
                          _adapter_identity(self.v1_adapter)]
        if model == "v2":
            return "v2", [self.cfg.new_base, _adapter_identity(self.v2_adapter)]
        setting, seed = model
        return f"{setting.label()} seed {seed}", self.run_step(setting, seed)[0]

    def setting_scores(self, setting: Setting, seed: int, split: str) -> dict:
        run = self.train_run(setting, seed)
        return self.scores(*self.model_identity((setting, seed)), split,
                           lambda: self.adapter_model(run / f"epoch-{setting.epochs}"))

    def v1_scores(self, split: str) -> dict:
        return self.scores(*self.model_identity("v1"), split, self.v1, self.tok_old)

    def v2_scores(self, split: str) -> dict:
        return self.scores(*self.model_identity("v2"), split, self.v2)

    # -- jobs -----------------------------------------------------------------------------------------------------
    def jobs(self, split: str, models: list) -> list:
        """The unfinished steps of scoring `models` ("v1", "v2", (setting, seed)) on `split`, as jobs in the order the
        in-process loop runs them: each setting's training (once per run and seed), then its scoring, which waits for
        it. A finished step is no job: a job is done exactly when its folder is."""
        jobs, seen = [], set()
        for model in models:
            needs = ()
            if model not in ("v1", "v2"):
                train = TrainJob.of(self, *model)
                if train.name not in seen and self.store.find(train.name, train.key) is None:
                    jobs.append(train)
                seen.add(train.name)
                needs = tuple(j.name for j in jobs if j.name == train.name)
            score = ScoreJob.of(self, split, model, needs)
            if score.name not in seen and self.store.find(score.name, score.key) is None:
                jobs.append(score)
            seen.add(score.name)
        return jobs

    def run_jobs(self, jobs: list) -> dict[str, dict]:
        """`jobs` on this run's executor (`scheduler.run_jobs`; none set: in this process, at the config's
        `cpus_per_job` threads). Returns each finished job's folder and seconds."""
        if not jobs:
            return {}
        executor = self.executor or InProcess(Runtime(self.cfg.cpus_per_job, str(self.out.resolve() / "logs")), self)
        trainings = sum(j.kind == "train" for j in jobs)
        self.say(f"update: {len(jobs)} job(s) ({trainings} training(s), {len(jobs) - trainings} scoring(s)) on "
                 f"{executor.where()}")
        if any(j.kind == "train" and j.setting.recipe != "control" for j in jobs):
            self.v1_vectors()  # v1's teacher vectors, built once here: every distilling job reads them from the store
        return run_jobs(executor, jobs, self.say)

    # -- the plan's basis ----------------------------------------------------------------------------------------
    def measure(self) -> dict:
        """Seconds per training step (2 steps of the control on the new base, after one to warm up) and per scored
        item (one batch of dev answers), measured here: the estimate's basis."""
        import tempfile

        from datasets import Dataset
        from transformers import PrinterCallback

        from ..talr.config import TALRConfig
        from ..talr.trainer import TALRTrainer
        from .steps import adapter_start, load_new_base, training_kwargs

        with tempfile.TemporaryDirectory() as tmp:
            model, peft_config = adapter_start(self.cfg, None if self.cfg.new_adapter is None else self.cfg.new_adapter,
                                               self.cfg.seed)
            rows = (self.rows["train"] * 3)[: 3 * self.cfg.batch_size]
            trainer = TALRTrainer(model=model, args=TALRConfig(**training_kwargs(
                self.cfg, output_dir=tmp, learning_rate=1e-5, max_steps=3, logging_steps=1000), weighting="none"),
                train_dataset=Dataset.from_list(rows), processing_class=self.tok_new, peft_config=peft_config)
            trainer.remove_callback(PrinterCallback)
            times = []
            trainer.add_callback(StepTimer(times))
            trainer.train()
        batch = self.rows["dev" if "dev" in self.rows else "test"][:8]
        start = time.perf_counter()
        generate_answers(load_new_base(self.cfg), self.tok_new, batch, self.cfg.max_new_tokens)
        return {"step_s": sum(times[1:]) / max(1, len(times) - 1), "item_s": (time.perf_counter() - start) / len(batch)}


def _prepared(pick: Pick) -> bool:
    """The task adapters exist (a re-run): `prepare` then reads them without training."""
    out = Path(pick.cfg.output_dir)
    needs = [out / "v1_task_adapter"] if pick.cfg.old_model is None else []
    if pick.cfg.new_adapter is None and pick.cfg.new_task_adapter:
        needs.append(out / "v2_task_adapter")
    if not all((p / "adaptguard_task_adapter.json").exists() for p in needs):
        return False
    pick.prepare()
    return True


def run_pick(cfg: UpdateConfig, dry_run: bool = False) -> dict:
    """The pick (see the module docstring), after printing its plan; `dry_run`: the plan only, nothing written."""
    import datasets
    import transformers

    from ..utils.progress import say

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    start = time.perf_counter()
    pick = Pick(cfg, say=say)
    # the time estimate trains 3 steps and scores a batch: skipped when every dev run is stored (a finished re-run)
    stored = (Path(pick.cfg.output_dir) / "dev_choices.json").exists() and _prepared(pick) and not pending_runs(pick)
    say(plan(pick, None if stored else pick.measure()) + ("\n  every dev run is stored: nothing to train" if stored
                                                           else ""))
    if dry_run:
        return {"plan": counts(pick)}
    pick.executor = make_executor(pick.cfg, context=pick)  # Ray connected (or a local cluster started) here
    try:
        choices = dev_stage(pick)
        test = test_stage(pick, choices)
    finally:
        pick.executor.close()
        pick.executor = None
    ship(pick, choices)
    plot_dev(choices, pick.out / "dev_tradeoff.png")
    v = verdict(choices, test)
    report = {"old_base": pick.cfg.old_base, "new_base": pick.cfg.new_base, "n_train": len(pick.rows["train"]),
              "dev": choices, "test": test, "verdict": v.sentence,
              "status": None if v.status is None else v.status.value, "exit_status": v.exit_code,
              "config": {k: v for k, v in pick.cfg.__dict__.items() if k not in ("train", "dev", "test")},
              "seconds": time.perf_counter() - start}
    atomic_write_text(pick.out / "report.json", json.dumps(report, indent=2, default=str))
    atomic_write_text(pick.out / "report.md", markdown(report))
    shipped = pick.setting_scores(pick.settings[choices["chosen"]], pick.cfg.seed, "test")
    atomic_write_text(pick.out / "report.html", update_page(report, flipped_test_items(pick.rows["test"], pick.v1_scores(
        "test"), shipped), (pick.out / "dev_tradeoff.png").read_bytes()))
    return report
