"""`adaptguard update` with a dev split: which way of retraining breaks the fewest of v1's answers on the user's task.

1. Every candidate setting (`candidates.expand_candidates`: recipe × learning rate × recipe fields; the control
   among them with the same budget) trains once on train, from the adapter v2 ships with, to the grid's largest
   epoch count; its adapter is kept after each epoch of the grid (the MUSCLE paper keeps its best epoch the same way).
2. Each kept adapter is scored on dev (exact match of the greedy answer); `candidates.pick_setting` picks by the
   registered rule, at matched accuracy; `dev_choices.json` is written before any test item is read.
3. The pick and the best control setting are trained for every test seed and scored on test: accuracy, NFR, PFR,
   BTC against v1, and the pick − control difference item by item (bootstrap CI over items, McNemar per seed).
4. `chosen/` holds the pick's adapter (seed `cfg.seed`); `report.json`, `report.md` (with the one-sentence verdict)
   and `dev_tradeoff.png` (every setting's dev accuracy vs NFR) sit beside it.

Every trained run and every per-item score is a step of a `Store` under `steps/`, kept with its settings: a killed
run resumes without redoing any finished step. Each unfinished step of a stage is a job (`TrainJob`, `ScoreJob`: one
picklable description, its output that step's folder) run by the config's executor (`executors`: in this process by
default, on Ray, or on Slurm through submitit); the stage then reads the stored steps, so the numbers do not depend
on where the jobs ran, and a run resumes on any executor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

from ..utils.files import atomic_write_text, finished_dir
from ..utils.generation import exact_match, generate_answers
from ..utils.store import Store, digest
from .candidates import Setting, expand_candidates, pick_setting
from .config import UpdateConfig
from .executors import InProcess, Runtime, describe, job_resources, make_executor, makespan, run_jobs


class SaveAtEpochs(TrainerCallback):
    """Saves the trained adapter as `out/epoch-<e>` at the end of each epoch e in `epochs`."""

    def __init__(self, epochs, out: Path, adapter_name: str | None):
        self.epochs, self.out, self.adapter_name = set(epochs), out, adapter_name

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        epoch = round(state.epoch)
        if epoch in self.epochs and state.is_world_process_zero:
            model.save_pretrained(self.out / f"epoch-{epoch}",
                                  **({"selected_adapters": [self.adapter_name]} if self.adapter_name else {}))


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


class _StepTimer(TrainerCallback):
    """Seconds of each optimizer step, into `times`."""

    def __init__(self, times: list):
        self.times, self.start = times, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


class Pick:
    """The steps of one pick (see the module docstring), each stored and reused."""

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
        this module on the job's description; rank 0 writes the adapters into `tmp`."""
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
               "--main_process_port", str(port), "-m", "adaptguard.update.pick", str(tmp / "job.pkl"), str(tmp)]
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
        """`jobs` on this run's executor (`executors.run_jobs`; none set: in this process, at the config's
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

    # -- the plan -------------------------------------------------------------------------------------------------
    def counts(self) -> dict:
        """How many trainings and scorings the run needs at most (a stored step is reused, not redone)."""
        runs = {s.run for s in self.settings}
        dev_seeds, test_seeds = self.dev_seeds(), self.cfg.test_seeds or [self.cfg.seed]
        extra_test = [s for s in test_seeds if s not in dev_seeds]
        epochs = max(s.epochs for s in self.settings)
        steps = -(-len(self.rows["train"]) // self.cfg.batch_size) * epochs
        return {"runs": len(runs) * len(dev_seeds) + 2 * len(extra_test), "steps_per_run": steps,
                "distilling_runs": len({r for r in runs if r[0] != "control"}) * len(dev_seeds),
                "dev_scorings": len(self.settings) * len(dev_seeds) + 2,
                "test_scorings": 2 * len(test_seeds) + 2, "task_adapters": int(self.cfg.old_model is None) + int(
                    self.cfg.new_adapter is None and self.cfg.new_task_adapter),
                "task_adapter_steps": -(-len(self.rows["train"]) // self.cfg.batch_size) * self.cfg.task_epochs}

    def estimate(self, measured: dict, workers: int | None) -> float:
        """Seconds of the grid's jobs at most (every step to do) on `workers` (`executors.makespan`, as `run_jobs`
        orders them): the dev stage's trainings and scorings, then the test stage's."""
        c, dev, test = self.counts(), len(self.rows["dev"]), len(self.rows["test"])
        durations, needs = [dev * measured["item_s"]] * 2, [(), ()]  # v1 and v2 on dev
        for run in dict.fromkeys(s.run for s in self.settings):
            for _ in self.dev_seeds():
                needs.append(())
                durations.append(c["steps_per_run"] * measured["step_s"] * (1 if run[0] == "control" else 1.5))
                kept = [s for s in self.settings if s.run == run]
                needs += [(len(durations) - 1,)] * len(kept)
                durations += [dev * measured["item_s"]] * len(kept)
        seconds = makespan(durations, needs, workers)
        test_seeds = self.cfg.test_seeds or [self.cfg.seed]
        extra = [s for s in test_seeds if s not in self.dev_seeds()]
        durations, needs = [test * measured["item_s"]] * 2, [(), ()]  # v1 and v2 on test
        for seed in test_seeds:
            for _ in ("pick", "control"):
                if seed in extra:
                    needs.append(())
                    durations.append(c["steps_per_run"] * measured["step_s"])
                needs.append((len(durations) - 1,) if seed in extra else ())
                durations.append(test * measured["item_s"])
        return seconds + makespan(durations, needs, workers)

    def pending_runs(self) -> int:
        """Dev-stage training runs not stored yet (needs `prepare`'s adapters; 0 on a finished run's re-run)."""
        seen, pending = set(), 0
        for setting in self.settings:
            for seed in self.dev_seeds():
                key = self.run_key(setting, seed)
                name = f"run_{setting.recipe}_{digest(key)}"
                if name not in seen and self.store.find(name, key) is None:
                    pending += 1
                seen.add(name)
        return pending

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
            trainer.add_callback(_StepTimer(times))
            trainer.train()
        batch = self.rows["dev" if "dev" in self.rows else "test"][:8]
        start = time.perf_counter()
        generate_answers(load_new_base(self.cfg), self.tok_new, batch, self.cfg.max_new_tokens)
        return {"step_s": sum(times[1:]) / max(1, len(times) - 1), "item_s": (time.perf_counter() - start) / len(batch)}

    def plan(self, measured: dict | None) -> str:
        """What the run will use, train and score, and for how long (from `measure`)."""
        cfg, c = self.cfg, self.counts()
        old = (f"your {'model' if cfg.old_is_full_model else 'adapter'} {cfg.old_model} (used as is)"
               if cfg.old_model else f"a task adapter trained on {cfg.old_base} from train ({len(self.rows['train'])} "
                                     f"rows, lr {cfg.task_learning_rate:g}, {cfg.task_epochs:g} epochs)")
        new_base = (f"{cfg.new_base_path} quantized ({cfg.new_quantization.get('library', '?')})"
                    if cfg.new_quantization else cfg.new_base_path)
        new = (f"{new_base} + your adapter {cfg.new_adapter} (used as is)" if cfg.new_adapter else
               f"{new_base} + its own task adapter, trained from train" if cfg.new_task_adapter else
               f"{new_base}" + (" + v1's adapter" if cfg.new_quantization and not cfg.old_is_full_model else ""))
        lines = ["update: the plan", f"  v1: {old}", f"  v2: {new}",
                 f"  trainings: {c['runs']} ({len(self.settings)} settings of {len({s.run for s in self.settings})} "
                 f"runs × {len(self.dev_seeds())} dev seed(s), then the pick and the control on the other test "
                 f"seeds), {c['steps_per_run']} steps each; {c['task_adapters']} task adapter(s) to train first",
                 f"  scorings: {c['dev_scorings']} on dev ({len(self.rows['dev'])} items), {c['test_scorings']} on test "
                 f"({len(self.rows['test'])} items)"]
        workers = job_resources(cfg)[0]
        lines.append(f"  jobs: each training and scoring on {describe(cfg)}")
        if measured:
            task = c["task_adapters"] * c["task_adapter_steps"] * measured["step_s"]
            one, wall = self.estimate(measured, 1), self.estimate(measured, workers)
            lines.append(f"  time: about {_duration(task + one)} at most (measured here: {measured['step_s']:.2f} s "
                         f"per training step, {measured['item_s']:.2f} s per scored item; distilling runs counted "
                         f"1.5× a control step, E3's anchor, not measured); stored steps are reused")
            if workers != 1:
                lines.append(f"  on {workers or 'as many'} workers: about {_duration(task + wall)} (the jobs' own "
                             "start-up — imports, loading the models — not counted; docs/results.md measures it)")
        return "\n".join(lines)

    # -- stages ---------------------------------------------------------------------------------------------------
    def dev_stage(self) -> dict:
        """Every setting on dev, and the pick, written to `dev_choices.json` (no test item read)."""
        from ..compat.metrics import flip_metrics

        self.prepare()
        seeds = self.dev_seeds()
        self.run_jobs(self.jobs("dev", ["v1", "v2", *((s, seed) for s in self.settings for seed in seeds)]))
        v1, v2 = self.v1_scores("dev"), self.v2_scores("dev")  # stored by the jobs, as is every score below
        rows = []
        for setting in self.settings:  # each setting's dev scores, averaged over the dev seeds
            ms = [flip_metrics(v1["correct"], self.setting_scores(setting, s, "dev")["correct"], seed=self.cfg.seed)
                  for s in seeds]
            mean = {k: sum(m[k] for m in ms) / len(ms) if all(m[k] is not None for m in ms) else None
                    for k in ("new_acc", "nfr", "pfr", "btc")}
            rows.append({**setting.as_dict(), "label": setting.label(), "acc": mean["new_acc"], "nfr": mean["nfr"],
                         "pfr": mean["pfr"], "btc": mean["btc"], "seeds": len(seeds)})
        rule = pick_setting(rows, self.cfg.max_accuracy_drop)
        v2m = flip_metrics(v1["correct"], v2["correct"], seed=self.cfg.seed)
        choices = {"rule": f"lowest dev NFR among settings with dev accuracy ≥ the best control's − "
                           f"{self.cfg.max_accuracy_drop:g}" + (f" (means over {len(seeds)} seeds)" if len(seeds) > 1
                                                                else ""), **rule, "dev_seeds": seeds,
                   "chosen_setting": rows[rule["chosen"]], "best_control_setting": rows[rule["best_control"]],
                   "v1_dev_acc": v2m["old_acc"], "v2_dev_acc": v2m["new_acc"], "v2_dev_nfr": v2m["nfr"],
                   "n_dev": len(self.rows["dev"]), "settings": rows}
        atomic_write_text(self.out / "dev_choices.json", json.dumps(choices, indent=2))
        chosen = self.settings[rule["chosen"]]
        self.say(f"update: dev pick: {chosen.label()} (dev accuracy {rows[rule['chosen']]['acc']:.3f}, NFR "
                 f"{rows[rule['chosen']]['nfr']:.3f}); best control {rows[rule['best_control']]['label']} (NFR "
                 f"{rows[rule['best_control']]['nfr']:.3f})")
        return choices

    def dev_seeds(self) -> list[int]:
        return [self.cfg.seed + k for k in range(self.cfg.dev_seeds)]

    def test_stage(self, choices: dict) -> dict:
        """The pick and the best control over the test seeds, against v1, at run level: Δ NFR and Δ accuracy with
        intervals over seeds and items (`replicates.paired_runs_difference`), per-seed McNemar, and the noise floor —
        how many of the control's answers flip right → wrong between two of its own seeds."""
        from ..compat.metrics import flip_indicators, flip_metrics, paired_seeds_difference
        from ..compat.replicates import paired_runs_difference, replicate_flips

        chosen, control = self.settings[choices["chosen"]], self.settings[choices["best_control"]]
        seeds = self.cfg.test_seeds or [self.cfg.seed]
        arms = {"pick": chosen, "control": control} if chosen != control else {"control": control}
        self.run_jobs(self.jobs("test", ["v1", "v2", *((s, seed) for s in arms.values() for seed in seeds),
                                         (chosen, self.cfg.seed)]))  # the last: the shipped adapter's flips
        v1, v2 = self.v1_scores("test"), self.v2_scores("test")
        correct = {arm: [self.setting_scores(s, seed, "test")["correct"] for seed in seeds] for arm, s in arms.items()}
        summary = {}
        for arm, runs in [("v2", [v2["correct"]]), *correct.items()]:
            per_seed = [flip_metrics(v1["correct"], c, seed=self.cfg.seed) for c in runs]
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
                "pick_vs_control": comparison, "control_noise_floor": floor, "n_test": len(self.rows["test"])}

    def ship(self, choices: dict) -> Path:
        """The pick's adapter (seed `cfg.seed`) as `output_dir/chosen/`, with the setting beside it."""
        setting = self.settings[choices["chosen"]]
        source = self.train_run(setting, self.cfg.seed) / f"epoch-{setting.epochs}"
        with finished_dir(self.out / "chosen") as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
            (tmp / "adaptguard_choice.json").write_text(json.dumps(
                {"setting": setting.as_dict(), "seed": self.cfg.seed, "base": self.cfg.new_base}, indent=2))
        return self.out / "chosen"


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
    kind = "train"

    @classmethod
    def of(cls, pick: Pick, setting: Setting, seed: int) -> TrainJob:
        return cls(pick.cfg, tuple(pick.settings), (pick.v1_adapter, pick.v2_adapter), setting, seed,
                   *pick.run_step(setting, seed))

    @property
    def label(self) -> str:
        return f"train {self.setting.label(epochs=False)} seed {self.seed}"

    def run(self, pick: Pick | None = None) -> Path:
        """The training, by `Pick.train_run` on `pick` (in-process: the driver's) or on this worker's `Pick`."""
        pick = pick or worker_pick(self)
        name, key = pick.run_step(self.setting, self.seed)
        if name != self.name or not _same(key, self.key):
            raise RuntimeError(f"{self.label}: this worker computes the run {name}, the driver {self.name}: is the "
                               "same adaptguard installed, and are the task adapters the same files here?")
        return pick.train_run(self.setting, self.seed)


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
    kind = "score"

    @classmethod
    def of(cls, pick: Pick, split: str, model, needs: tuple = ()) -> ScoreJob:
        return cls(pick.cfg, tuple(pick.settings), (pick.v1_adapter, pick.v2_adapter), split, model,
                   *pick.score_step(*pick.model_identity(model), split), needs)

    @property
    def label(self) -> str:
        model = self.model if isinstance(self.model, str) else f"{self.model[0].label()} seed {self.model[1]}"
        return f"score {model} on {self.split}"

    def run(self, pick: Pick | None = None) -> Path:
        pick = pick or worker_pick(self)
        if self.model == "v1":
            pick.v1_scores(self.split)
        elif self.model == "v2":
            pick.v2_scores(self.split)
        else:
            pick.setting_scores(*self.model, self.split)
        return pick.store.root / self.name


_worker: tuple[str, Pick] | None = None  # a worker's Pick, kept for its next job of the same run (Ray reuses workers)


def worker_pick(job: TrainJob | ScoreJob) -> Pick:
    """The `Pick` of a job's run in a worker: built from the job's config and grid (tokenizers, rows), with the task
    adapters the driver prepared (nothing is trained here but the job)."""
    global _worker
    ident = digest([dataclasses.asdict(job.cfg), job.settings, job.adapters])
    if _worker is None or _worker[0] != ident:
        import datasets
        import transformers

        datasets.disable_progress_bars()  # a worker's log keeps the trainings' own lines, as the driver's output does
        transformers.utils.logging.disable_progress_bar()
        pick = Pick(job.cfg, settings=list(job.settings))
        pick.v1_adapter, pick.v2_adapter = job.adapters
        _worker = ident, pick
    return _worker[1]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _settings(row: dict) -> str:
    """'lr 0.002, 2 epochs, …' of a dev row's label `recipe (…)`."""
    return row["label"].split(" (", 1)[1][:-1]


def _noise(test: dict) -> str:
    """What reruns alone do, or that it was not measured."""
    if test.get("control_noise_floor") is None:
        return (" Seed noise was not measured (one test seed): set test_seeds to two or more seeds to see how many "
                "answers a rerun alone flips.")
    return (f" Retraining the control with another seed alone flips {100 * test['control_noise_floor']:.1f} % of "
            f"the items right → wrong (the noise floor over {len(test['seeds'])} seeds).")


def verdict(choices: dict, test: dict) -> str:
    """The report's one sentence (and what seed noise amounts to)."""
    chosen, control = choices["chosen_setting"], choices["best_control_setting"]
    ctrl = test["arms"]["control"]
    if test["pick_vs_control"] is None:
        others = [r for r in choices["settings"] if r["recipe"] != "control"]
        if others:
            best = min(others, key=lambda r: r["nfr"])
            why = (f"no recipe beat it on dev (lowest dev NFR among the others: {best['label']}, {best['nfr']:.3f} "
                   f"at dev accuracy {best['acc']:.3f})")
        else:  # the default since E5: say so, not "no recipe beat it"
            why = ("no other recipe was a candidate (name them in `candidates` to compare them; none is by default, "
                   "as none helped in E5, docs/results.md §10)")
        return (f"ship the control ({_settings(control)}): {why}; on test its NFR is {ctrl['nfr']:.3f} at accuracy "
                f"{ctrl['new_acc']:.3f}." + _noise(test))
    c = test["pick_vs_control"]
    lo, hi = c["delta_nfr_ci"]
    over = "items only (one seed)" if c.get("runs_fixed") else f"over {len(test['seeds'])} seeds and the items"
    confirmed = ("the test confirms it" if hi < 0 else
                 "on test it broke MORE answers than the control" if lo > 0 else
                 "within seed noise: the test does not confirm it (the interval contains 0)")
    p = ", ".join(f"{s['mcnemar_p']:.3g}" for s in c["per_seed"])
    return (f"ship `{chosen['recipe']}` ({_settings(chosen)}): NFR "
            f"{test['arms']['pick']['nfr']:.3f} vs control {ctrl['nfr']:.3f} on test, Δ {c['delta_nfr']:+.3f} "
            f"(95% CI {lo:+.3f} to {hi:+.3f}, {over}; McNemar p per seed {p}); accuracy "
            f"{test['arms']['pick']['new_acc']:.3f} vs {ctrl['new_acc']:.3f}; {confirmed}." + _noise(test))


def markdown(report: dict) -> str:
    ch, test = report["dev"], report["test"]

    def f(v):
        return "–" if v is None else f"{v:.3f}"

    lines = ["# Update: the recipe chosen on dev, tested against the control", "",
             f"**{report['verdict']}**", "",
             f"Old base `{report['old_base']}` → new base `{report['new_base']}`; {report['n_train']} train, "
             f"{ch['n_dev']} dev, {test['n_test']} test items (exact match of the greedy answer). Rule: "
             f"{ch['rule']}; accuracy floor {ch['accuracy_floor']:.3f}.", "",
             "## Dev: every setting (flips against v1)", "",
             f"v1 {ch['v1_dev_acc']:.3f}, v2 {ch['v2_dev_acc']:.3f} (NFR {ch['v2_dev_nfr']:.3f}).", "",
             "| setting | dev acc | NFR | PFR | BTC | eligible | |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(ch["settings"]):
        mark = "**pick**" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""
        lines.append(f"| {r['label']} | {f(r['acc'])} | {f(r['nfr'])} | {f(r['pfr'])} | {f(r['btc'])} | "
                     f"{'yes' if r['acc'] >= ch['accuracy_floor'] - 1e-12 else 'no'} | {mark} |")
    lines += ["", "![dev trade-off](dev_tradeoff.png)", "",
              f"## Test (seeds {test['seeds']}, mean over seeds; v1 accuracy {test['v1_acc']:.3f})", "",
              "| model | acc | NFR | PFR | BTC |", "|---|---|---|---|---|"]
    for arm, m in test["arms"].items():
        lines.append(f"| {arm} | {f(m['new_acc'])} | {f(m['nfr'])} | {f(m['pfr'])} | {f(m['btc'])} |")
    c = test["pick_vs_control"]
    if c:
        lines += ["", f"Pick − control over {len(test['seeds'])} seed(s), intervals over seeds and items: Δ NFR "
                  f"{c['delta_nfr']:+.3f} "
                  f"(95% CI {c['delta_nfr_ci'][0]:+.3f} to {c['delta_nfr_ci'][1]:+.3f}), Δ accuracy "
                  f"{c['delta_acc']:+.3f} (95% CI {c['delta_acc_ci'][0]:+.3f} to {c['delta_acc_ci'][1]:+.3f}); "
                  "McNemar per seed: " + ", ".join(f"p {s['mcnemar_p']:.3g} ({s['n_a_only']} vs {s['n_b_only']} "
                                                    "discordant)" for s in c["per_seed"]) + "."]
    lines += ["", f"The chosen adapter: `chosen/` (load it on the new base with `PeftModel.from_pretrained`). "
              f"Total {report['seconds']:.0f} s.", ""]
    return "\n".join(lines)


def update_page(report: dict, test_flips: list[dict], dev_png: bytes | None) -> str:
    """`report.html`: the verdict first, the dev trade-off (every setting, the figure), the pick against the control
    on test, and the items the shipped adapter flipped against v1 on test."""
    from ..compat.html import figure, flips_section, page, table

    ch, test = report["dev"], report["test"]

    def f(v):
        return "–" if v is None else f"{v:.3f}"

    dev_rows = [[r["label"], f(r["acc"]), f(r["nfr"]), f(r["pfr"]), f(r["btc"]),
                 "yes" if r["acc"] >= ch["accuracy_floor"] - 1e-12 else "no",
                 "pick" if i == ch["chosen"] else "best control" if i == ch["best_control"] else ""]
                for i, r in enumerate(ch["settings"])]
    test_rows = [[arm, f(m["new_acc"]), f(m["nfr"]), f(m["pfr"]), f(m["btc"])] for arm, m in test["arms"].items()]
    sections = [f"<p>Old base {report['old_base']} → new base {report['new_base']}; {report['n_train']} train, "
                f"{ch['n_dev']} dev, {test['n_test']} test items. Rule: {ch['rule']}; accuracy floor "
                f"{ch['accuracy_floor']:.3f}.</p>", "<h2>Dev: every setting (flips against v1)</h2>",
                table(["setting", "dev accuracy", "NFR", "PFR", "BTC", "eligible", ""], dev_rows)]
    if dev_png:
        sections.append(figure(dev_png, "every setting's dev accuracy against its NFR"))
    sections += [f"<h2>Test: the pick against the control (seeds {test['seeds']}, means over seeds)</h2>",
                 table(["model", "accuracy", "NFR", "PFR", "BTC"], test_rows)]
    counts: dict[str, dict[str, int]] = {}
    for x in test_flips:
        counts.setdefault(x["task"], {}).setdefault(x["kind"], 0)
        counts[x["task"]][x["kind"]] += 1
    sections.append(flips_section(test_flips, counts, note="The shipped adapter (seed of chosen/) against v1 on the "
                                                           "test items. "))
    return page("Update: the recipe chosen on dev, tested against the control", report["verdict"],
                "failed" if "MORE answers" in report["verdict"] else "passed" if "test confirms it" in report["verdict"]
                else "undecided" if "within seed noise" in report["verdict"] else "none", sections)


def flipped_test_items(rows: list[dict], v1: dict, shipped: dict) -> list[dict]:
    """The test items the shipped adapter flipped against v1, broke first: prompt, gold, v1's and its answer."""
    from ..utils.generation import answer_text

    out = []
    for i, (r, o, n) in enumerate(zip(rows, v1["correct"], shipped["correct"])):
        if o != n:
            prompt = r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"]
            out.append({"task": "test", "doc_id": i, "kind": "negative" if o else "positive", "prompt": prompt,
                        "gold": answer_text(r["completion"]), "old": v1["pred"][i], "new": shipped["pred"][i]})
    return sorted(out, key=lambda x: x["kind"] != "negative")


def plot_dev(choices: dict, path: Path) -> None:
    """Dev accuracy vs NFR of every setting, by recipe; the accuracy floor; the pick and the best control marked."""
    from ..utils.figures import new_figure, save_figure

    fig = new_figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    rows = choices["settings"]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        pts = [r for r in rows if r["recipe"] == recipe]
        ax.scatter([r["acc"] for r in pts], [r["nfr"] for r in pts], label=recipe, s=40,
                   marker="s" if recipe == "control" else "o", alpha=0.8)
    for key, style in (("chosen", dict(s=220, facecolors="none", edgecolors="red", linewidths=1.5, label="pick")),
                       ("best_control", dict(s=220, facecolors="none", edgecolors="black", linewidths=1,
                                             label="best control"))):
        r = rows[choices[key]]
        ax.scatter([r["acc"]], [r["nfr"]], **style)
    ax.axvline(choices["accuracy_floor"], color="grey", linestyle="--", linewidth=1, label="accuracy floor")
    ax.set_xlabel("dev accuracy (exact match)")
    ax.set_ylabel("dev NFR against v1 (lower is better)")
    ax.set_title("Every candidate setting on dev", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


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
    stored = (Path(pick.cfg.output_dir) / "dev_choices.json").exists() and _prepared(pick) and not pick.pending_runs()
    say(pick.plan(None if stored else pick.measure()) + ("\n  every dev run is stored: nothing to train" if stored
                                                           else ""))
    if dry_run:
        return {"plan": pick.counts()}
    pick.executor = make_executor(pick.cfg, context=pick)  # Ray connected (or a local cluster started) here
    try:
        choices = pick.dev_stage()
        test = pick.test_stage(choices)
    finally:
        pick.executor.close()
        pick.executor = None
    pick.ship(choices)
    plot_dev(choices, pick.out / "dev_tradeoff.png")
    report = {"old_base": pick.cfg.old_base, "new_base": pick.cfg.new_base, "n_train": len(pick.rows["train"]),
              "dev": choices, "test": test, "verdict": verdict(choices, test),
              "config": {k: v for k, v in pick.cfg.__dict__.items() if k not in ("train", "dev", "test")},
              "seconds": time.perf_counter() - start}
    atomic_write_text(pick.out / "report.json", json.dumps(report, indent=2, default=str))
    atomic_write_text(pick.out / "report.md", markdown(report))
    shipped = pick.setting_scores(pick.settings[choices["chosen"]], pick.cfg.seed, "test")
    atomic_write_text(pick.out / "report.html", update_page(report, flipped_test_items(pick.rows["test"], pick.v1_scores(
        "test"), shipped), (pick.out / "dev_tradeoff.png").read_bytes()))
    return report


if __name__ == "__main__":  # one rank of a training spread over processes (`Pick._launch`): JOB.pkl TMP
    import pickle

    from adaptguard.update.pick import worker_pick as _worker_pick  # the job's classes are the package module's

    _job = pickle.loads(Path(sys.argv[1]).read_bytes())
    _pick = _worker_pick(_job)
    _pick._train(_job.setting, _job.seed, _job.key["epochs"], sorted({s.epochs for s in _pick.settings}),
                 Path(sys.argv[2]))
