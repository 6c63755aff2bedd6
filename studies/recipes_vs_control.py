"""Experiment E3 (issue 36, studies/preregistration.md § E3): does v1's signal help beyond retraining on the labels,
when every arm — the cross-entropy control included — is tuned on dev by the same rule?

Updates: E1's U1 (bitsandbytes NF4) and U2 (200 steps of continued training) on hyperbaton — v1, the updates,
their task adapters and lm-eval scoring are E1's steps (`real_update.E1`, reused from its store when `out` is E1's)
— and U3, a BIG-bench task with generated multi-token answers (exact match), the first of `generative_tasks` that
passes the registered dev gates (its items: those whose prompt + answer fit `max_length`). Arms: the recipes of
`adaptguard.muscle.recipes` (`ARMS`), each continuing v2's task adapter on the first `arm_rows` train rows, over one
grid (learning rate × epochs; an epoch-e adapter is the checkpoint of the run to the grid's last epoch). Per arm,
the pick rule of `adaptguard update` (`candidates.pick_setting(..., recipe=arm)`) chooses its setting on seed 0's dev
scores; `dev_choices.json` holds it before any test item of that update is scored. On test: every arm's chosen
setting over the seeds, compared item by item with the control's, and seed 0's whole grid (the figure).

Every run and per-item score is a step of E1's store (`out/`), kept with its settings: a killed run resumes; the
per-item scores (`out/scores/`) are small JSON files that a later session can copy back to skip their runs.

    python -m adaptguard.experiments.recipes_vs_control --stage dev --updates quantized  # one chunk: U1 on dev
    python -m adaptguard.experiments.recipes_vs_control --stage test                     # everything, then the report
    python -m adaptguard.experiments.recipes_vs_control --quick                          # the mechanics, small
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaptguard.utils.files import atomic_write_text
from adaptguard.utils.quiet import hide_unused_library_noise
from adaptguard.utils.sweeps import machine_line

from .common import export_records, task_rows, training_rows, verdict, write_report
from .real_update import E1, MIX_TASKS, E1Config, _args, _key, load_base

# the registered arms: recipe name -> its fields (temperature T is common)
ARMS = {"control": {}, "muscle": {"ce_weight": 1.0}, "ll_l": {"ce_weight": 1.0},
        "focal": {"focal_alpha": 1.0, "focal_beta": 5.0, "distill_weight": 1.0}, "kd": {"distill_weight": 1.0}}
# the registered four, then (amendments 2026-11-26, studies/preregistration.md § E3) three more, and three more again,
# each set appended when none before it had passed
GENERATIVE_TASKS = ("arithmetic", "word_unscrambling", "modified_arithmetic", "unit_conversion",
                    "linguistic_mappings", "contextual_parametric_knowledge_conflicts", "disfl_qa",
                    "unnatural_in_context_learning", "mult_data_wrangling", "matrixshapes")
UPDATE_NAMES = {"quantized": "U1", "continued": "U2", "generative": "U3"}


@dataclass
class E3Config:
    out: str = field(default="e3-out", metadata={"help": "Output directory (E1's out reuses E1's v1/v2 steps)."})
    model: str = field(default="built:smollm2", metadata={"help": "v1 base: Hub id, path, built:<name> or embedded:<name>."})
    task: str = field(default="bigbench:hyperbaton", metadata={"help": "U1/U2's multiple-choice task (as E1)."})
    split_seed: int = 1234
    n_train: int = 400
    n_dev: int = 300
    n_test: int = 400
    updates: list[str] = field(default_factory=lambda: ["quantized", "continued", "generative"], metadata={
        "help": "quantized (U1), continued (U2), generative (U3); a subset runs one chunk."})
    task_lr: float = field(default=3e-4, metadata={"help": "U1/U2 task adapters' lr (E1's registered choice)."})
    continued: list[float] = field(default_factory=lambda: [200, 1e-5], metadata={"help": "(steps, lr) of U2."})
    mix_tasks: list[str] = field(default_factory=lambda: list(MIX_TASKS))
    mix_rows_per_task: int = 400
    generative_tasks: list[str] = field(default_factory=lambda: list(GENERATIVE_TASKS), metadata={
        "help": "U3's candidates in order: BIG-bench task names, or JSONL files of {input, target} rows."})
    generative_split_seed: int = 36
    generative_task_lrs: list[float] = field(default_factory=lambda: [1e-4, 3e-4], metadata={
        "help": "U3's task adapters' lr, chosen by v1 dev accuracy (E1's rule)."})
    min_generative_items: int = 1100
    min_v1_accuracy: float = field(default=0.30, metadata={"help": "U3 gate: v1's dev accuracy."})
    min_nfr: float = field(default=0.05, metadata={"help": "U3 gate: the update's dev NFR against v1."})
    max_new_tokens: int = 16
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    arm_rows: int = field(default=200, metadata={"help": "Train rows of every arm (the first of train)."})
    fallback_arm_rows: int = field(default=100, metadata={"help": "Arm rows if U1's projected dev cost exceeds "
                                                                   "budget_hours (registered)."})
    budget_hours: float = 2.5
    learning_rates: list[float] = field(default_factory=lambda: [1e-4, 3e-4])
    epochs: list[int] = field(default_factory=lambda: [1, 2])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    max_accuracy_drop: float = 0.01
    lora_r: int = 16
    lora_alpha: int = 32
    batch_size: int = 8
    max_length: int = 128
    temperature: float = 2.0
    eval_batch_size: int = 16
    use_cpu: bool = True


def quick_config(out: str = "e3-quick") -> E3Config:
    """The mechanics in minutes: small splits, one test seed besides seed 0, no gates."""
    return E3Config(out=out, n_train=40, n_dev=40, n_test=60, continued=[20, 1e-5], mix_rows_per_task=40,
                    seeds=[0, 1], arm_rows=40, fallback_arm_rows=20, min_v1_accuracy=0.0, min_nfr=0.0,
                    generative_task_lrs=[3e-4], min_generative_items=140)


class GenerativeE1(E1):
    """E1's steps on a task with one generated answer per item (rows `{input, choices: [target], label: 0}`), scored
    by exact match of the greedy answer instead of lm-eval's log-likelihood of each choice."""

    max_new_tokens = 16
    bases: E1 | None = None  # the E1 whose continued base this one uses (U3's fallback is U2's base, as registered)

    def update_base(self, update: str, setting) -> tuple[str, str | None, dict]:
        if update == "continued" and self.bases is not None:  # the base does not depend on the task: build it once
            return self.bases.update_base(update, setting)
        return super().update_base(update, setting)

    def scores(self, name: str, settings: dict, split: str, model_fn) -> list[bool]:
        from adaptguard.utils.generation import exact_match, generate_answers

        def make(tmp: Path):
            rows = [{"prompt": r["input"], "completion": r["choices"][0]} for r in self.rows[split]]
            preds = generate_answers(model_fn(), self.tokenizer, rows, self.max_new_tokens, self.cfg.eval_batch_size)
            (tmp / "scores.json").write_text(json.dumps(exact_match(preds, rows)))
            (tmp / "predictions.json").write_text(json.dumps(preds))

        folder = self.store.get(f"scores/{split}/{name}", self.score_settings(settings, split),
                                self._timed(f"scoring {name} on {split}", make))
        return json.loads((folder / "scores.json").read_text())

    def score_settings(self, settings: dict, split: str) -> dict:
        return {**super().score_settings(settings, split), "scoring": "exact_match", "max_new_tokens": self.max_new_tokens}


def generative_rows(spec: str) -> list[dict]:
    """{input, choices: [target], label: 0} rows of a BIG-bench task with generated answers, or of a JSONL file of
    {input, target} rows (so E1's steps train on `" " + target` and `GenerativeE1` scores the greedy answer)."""
    if spec.endswith(".jsonl"):
        rows = task_rows(spec, "generative_tasks")
    else:
        from adaptguard.data.bigbench import load_generative_task

        rows = load_generative_task(spec.removeprefix("bigbench:"))
    return [{"input": r["input"], "choices": [r["target"]], "label": 0} for r in rows]


def fits_max_length(rows: list[dict], tokenizer, max_length: int) -> list[bool]:
    """Per `{input, choices, label}` row: its prompt, the answer after a space and EOS fit `max_length` tokens, as
    SFTTrainer tokenizes a prompt-completion row. A longer row would train on a cut answer, or on nothing (TRL drops
    rows whose answer lies wholly past the cut)."""
    texts = [r["input"] + " " + r["choices"][r["label"]] for r in rows]
    return [len(ids) + 1 <= max_length for ids in tokenizer(texts)["input_ids"]]


def arm_summary(v1: list[bool], arms: dict[str, list[list[bool]]], seed: int = 0, n_boot: int = 4000) -> dict:
    """Per arm (each: seeds × items correctness on test): accuracy, NFR, PFR (mean over seeds); against the control,
    Δ NFR and Δ accuracy item-paired (an item's seeds resampled together), per-seed McNemar on the negative flips,
    the registered verdict, and whether the arm "helps beyond retraining" (reproduced and the Δ accuracy CI above
    −2 points)."""
    from adaptguard.compat.stats.metrics import flip_indicators, paired_seeds_difference

    out = {}
    negative = {a: [flip_indicators(v1, s)["nfr"] for s in runs] for a, runs in arms.items()}
    positive = {a: [flip_indicators(v1, s)["pfr"] for s in runs] for a, runs in arms.items()}
    for arm, runs in arms.items():
        out[arm] = {"acc": float(np.mean(runs)), "nfr": float(np.mean(negative[arm])),
                    "pfr": float(np.mean(positive[arm])), "per_seed_nfr": [float(np.mean(x)) for x in negative[arm]]}
        if arm == "control":
            continue
        d_nfr = paired_seeds_difference(negative[arm], negative["control"], n_boot=n_boot, seed=seed)
        d_acc = paired_seeds_difference(runs, arms["control"], n_boot=n_boot, seed=seed)
        v = verdict(*d_nfr["ci"])
        out[arm]["vs_control"] = {"delta_nfr": d_nfr["diff"], "delta_nfr_ci": list(d_nfr["ci"]),
                                  "mcnemar_p_per_seed": [x["mcnemar_p"] for x in d_nfr["per_seed"]],
                                  "delta_acc": d_acc["diff"], "delta_acc_ci": list(d_acc["ci"]), "verdict": v,
                                  "helps": v == "reproduced" and d_acc["ci"][0] > -0.02}
    return out


class E3:
    """The experiment's steps (see the module docstring); every step is stored and reused."""

    def __init__(self, cfg: E3Config, say=print):
        self.cfg, self.say = cfg, say
        self.root = Path(cfg.out)
        self._e1 = {}
        self._v1 = {}
        self._tokenizer = None  # v1's, to count a U3 candidate's tokens
        self.choices_path = self.root / "e3" / "dev_choices.json"

    # -- the updates -------------------------------------------------------------------------------------------
    def _e1_config(self, **kw) -> E1Config:
        c = self.cfg
        kw = {"out": c.out, **kw}
        return E1Config(model=c.model, n_train=c.n_train, n_dev=c.n_dev, n_test=c.n_test, seeds=c.seeds,
                        quant_types=["nf4"], continued_settings=[list(c.continued)], mix_tasks=c.mix_tasks,
                        mix_rows_per_task=c.mix_rows_per_task, min_nfr=c.min_nfr, lora_r=c.lora_r,
                        lora_alpha=c.lora_alpha, batch_size=c.batch_size, max_length=c.max_length,
                        temperature=c.temperature, eval_batch_size=c.eval_batch_size, use_cpu=c.use_cpu, **kw)

    def multiple_choice(self) -> E1:
        """U1/U2's steps: E1's, with E1's registered task lr."""
        if "mc" not in self._e1:
            self._e1["mc"] = E1(self._e1_config(task=self.cfg.task, split_seed=self.cfg.split_seed,
                                                task_lrs=[self.cfg.task_lr]), say=self.say)
        return self._e1["mc"]

    def generative_items(self, spec: str) -> tuple[list[dict], int]:
        """(the rows of U3 candidate `spec` that fit `max_length`, how many it has in all): longer items are removed
        before the split (amendment 2026-11-26, studies/preregistration.md § E3)."""
        from transformers import AutoTokenizer

        from adaptguard.models.embedded import resolve_model

        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.cfg.model))
        rows = generative_rows(spec)
        fit = fits_max_length(rows, self._tokenizer, self.cfg.max_length)
        return [r for r, ok in zip(rows, fit) if ok], len(rows)

    def generative(self, spec: str) -> GenerativeE1:
        if spec not in self._e1:
            rows, total = self.generative_items(spec)
            name = Path(spec).stem if spec.endswith(".jsonl") else spec.removeprefix("bigbench:")
            path = self.root / "e3" / "tasks" / f"{name}.jsonl"
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
            # a store of its own: E1's step names (v1_adapter_<lr>, scores/<split>/v1_<lr>) do not name the task
            e = GenerativeE1(self._e1_config(task=str(path), split_seed=self.cfg.generative_split_seed,
                                             task_lrs=list(self.cfg.generative_task_lrs),
                                             out=str(self.root / "e3" / "generative" / name)), say=self.say)
            e.max_new_tokens = self.cfg.max_new_tokens
            e.bases = self.multiple_choice()
            e.common["task"] = spec  # the store key names the source, not where its rows were written
            if len(rows) < total:  # fewer items than the source: a key of their own (unchanged where all fit)
                e.common["items"] = f"prompt + answer <= {self.cfg.max_length} tokens"
            self._e1[spec] = e
        return self._e1[spec]

    def choose_generative(self) -> dict:
        """U3 by the registered rule: the first task with ≥ `min_generative_items` items (that fit `max_length`) whose
        v1 dev accuracy is ≥ `min_v1_accuracy` and whose NF4 update (else continued training) has dev NFR ≥
        `min_nfr`."""
        tried = []
        for spec in self.cfg.generative_tasks:
            rows, total = self.generative_items(spec)
            n = len(rows)
            entry = {"task": spec, "items": n, "items_in_source": total}
            tried.append(entry)
            if n < self.cfg.min_generative_items:
                entry["outcome"] = f"{n} items < {self.cfg.min_generative_items}"
                continue
            e = self.generative(spec)
            entry["task_lr"] = e.task_lr
            entry["v1_dev_acc"] = float(np.mean(e.v1_scores("dev")))
            if entry["v1_dev_acc"] < self.cfg.min_v1_accuracy:
                entry["outcome"] = f"v1 dev accuracy {entry['v1_dev_acc']:.3f} < {self.cfg.min_v1_accuracy}"
                continue
            for kind in ("quantized", "continued"):
                setting, dev = e.fixed_update(kind)
                entry[f"{kind}_dev_nfr"] = dev
                if setting is not None:
                    entry["outcome"] = f"chosen: {kind} update {setting}"
                    return {"task": spec, "kind": kind, "setting": setting, "tried": tried}
            entry["outcome"] = f"no update reaches dev NFR {self.cfg.min_nfr}"
        return {"task": None, "kind": None, "setting": None, "tried": tried}

    def update(self, name: str) -> tuple[E1, str, object, dict]:
        """(E1 steps, E1's update kind, its setting, what chose it) of update `name`."""
        if name == "quantized":
            return self.multiple_choice(), "quantized", "nf4", {}
        if name == "continued":
            return self.multiple_choice(), "continued", list(self.cfg.continued), {}
        if name == "generative":
            chosen = self.choose_generative()
            if chosen["task"] is None:
                raise RuntimeError(f"U3: no generative task passes the registered gates: {chosen['tried']}")
            return self.generative(chosen["task"]), chosen["kind"], chosen["setting"], chosen
        raise ValueError(f"updates: unknown update {name!r}; known: {', '.join(UPDATE_NAMES)}")

    def v1_model(self, e: E1):
        if id(e) not in self._v1:
            self._v1[id(e)] = e.v1_task_model()
        return self._v1[id(e)]

    # -- the budget rule -----------------------------------------------------------------------------------------
    def arm_rows(self) -> int:
        """The registered budget rule, decided once before any arm runs: U1's dev cost projected from U1's measured
        v2 task adapter (seconds per train row) and v2's dev scoring; over `budget_hours`, every arm gets
        `fallback_arm_rows`."""
        path = self.root / "e3" / "budget.json"
        if path.exists():
            return json.loads(path.read_text())["arm_rows"]
        e, kind, setting, _ = self.update("quantized")
        adapter = e.v2_adapter(kind, setting)
        e.v2_scores(kind, setting, "dev")
        _, _, extra = e.update_base(kind, setting)
        scored = e.root / "scores" / "dev" / f"v2_{kind}_{_key({**e.common, 'lr': e.task_lr, **extra})}"
        train_s, score_s = (json.loads((p / "seconds.json").read_text()) if (p / "seconds.json").exists() else None
                            for p in (adapter, scored))
        c = self.cfg
        budget = {"v2_train_seconds": train_s, "v2_dev_scoring_seconds": score_s, "budget_hours": c.budget_hours}
        if train_s is None or score_s is None:  # reused from a store that did not time them
            budget.update(projected_hours=None, arm_rows=c.arm_rows,
                          note="U1's v2 steps were reused without timings; the registered rows are kept")
        else:
            distilling = sum(a != "control" for a in c.arms) / len(c.arms)
            runs = len(c.learning_rates) * len(c.arms)
            train = train_s / c.n_train * c.arm_rows * max(c.epochs) * runs * (1 + 0.5 * distilling)
            scoring = score_s * len(c.learning_rates) * len(c.epochs) * len(c.arms)
            hours = (train + scoring) / 3600
            budget.update(projected_hours=hours,
                          arm_rows=c.arm_rows if hours <= c.budget_hours else c.fallback_arm_rows)
        atomic_write_text(path, json.dumps(budget, indent=2))
        self.say(f"E3: budget: {budget}")
        return budget["arm_rows"]

    # -- the arms ----------------------------------------------------------------------------------------------
    def grid(self) -> list[tuple[float, int]]:
        """(lr, epochs) in the rule's tie order: the smaller lr, then fewer epochs."""
        return [(lr, ep) for lr in sorted(self.cfg.learning_rates) for ep in sorted(self.cfg.epochs)]

    def _run_settings(self, e: E1, kind: str, setting, arm: str, lr: float, seed: int, run_epochs: int) -> dict:
        _, _, extra = e.update_base(kind, setting)
        return {**e.common, "task_lr": e.task_lr, **extra, "experiment": "E3", "arm": arm, "fields": ARMS[arm],
                "arm_lr": lr, "seed": seed, "run_epochs": run_epochs, "arm_rows": self.arm_rows(),
                "temperature": self.cfg.temperature}

    def arm_run(self, e: E1, kind: str, setting, arm: str, lr: float, seed: int, run_epochs: int) -> Path:
        """One run of `arm` at `lr` to `run_epochs` epochs: its adapter after every grid epoch (`epoch-<e>/`)."""
        settings = self._run_settings(e, kind, setting, arm, lr, seed, run_epochs)
        task = Path(str(e.common["task"]).removeprefix("bigbench:")).stem
        name = f"e3/runs/{task}_{kind}/{arm}_lr{lr:g}_seed{seed}_{_key(settings)}"
        return e.store.get(name, settings, e._timed(f"E3 {arm} ({kind}, lr {lr:g}, seed {seed}, {run_epochs} "
                                                    f"epoch(s))", lambda tmp: self._train(e, kind, setting, arm, lr,
                                                                                          seed, run_epochs, tmp)))

    def _train(self, e: E1, kind: str, setting, arm: str, lr: float, seed: int, run_epochs: int, tmp: Path) -> None:
        from datasets import Dataset
        from peft import PeftModel
        from transformers import PrinterCallback, set_seed

        from adaptguard.muscle.config import MUSCLEConfig
        from adaptguard.muscle.trainer import MUSCLETrainer
        from adaptguard.talr.config import TALRConfig
        from adaptguard.talr.trainer import TALRTrainer
        from adaptguard.update.callbacks import SaveAtEpochs
        from adaptguard.utils.progress import TrainingProgress

        path, quant, _ = e.update_base(kind, setting)
        v2_adapter = e.v2_adapter(kind, setting)
        set_seed(seed)  # the same data order in every arm of a seed
        model = PeftModel.from_pretrained(load_base(path, quant), v2_adapter, is_trainable=True)
        data = Dataset.from_list(training_rows(e.rows["train"][:self.arm_rows()]))
        args = _args(e.cfg, tmp, seed, lr)
        args["num_train_epochs"] = run_epochs
        if arm == "control":
            trainer = TALRTrainer(model=model, args=TALRConfig(**args, weighting="none"), train_dataset=data,
                                  processing_class=e.tokenizer)
        else:
            trainer = MUSCLETrainer(model=model, args=MUSCLEConfig(**args, recipe=arm, temperature=self.cfg.temperature,
                                                                   **ARMS[arm]),
                                    old_model=self.v1_model(e), train_dataset=data, processing_class=e.tokenizer)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(TrainingProgress(f"E3 {arm} ({kind}, lr {lr:g}, seed {seed})"))
        epochs = [ep for ep in self.cfg.epochs if ep <= run_epochs]
        trainer.add_callback(SaveAtEpochs(epochs, tmp, getattr(trainer, "_student_adapter", None)))
        trainer.train()
        shutil.rmtree(tmp / "run", ignore_errors=True)

    def arm_scores(self, e: E1, kind: str, setting, arm: str, lr: float, epochs: int, seed: int, split: str
                   ) -> list[bool]:
        """Per-item correctness of `arm`'s adapter after `epochs` epochs. Seed 0 runs to the grid's last epoch (its
        checkpoints are the grid); other seeds run to `epochs` (constant lr: the same adapter as a checkpoint)."""
        run_epochs = max(self.cfg.epochs) if seed == self.cfg.seeds[0] else epochs
        settings = {**self._run_settings(e, kind, setting, arm, lr, seed, run_epochs), "epoch": epochs}
        name = f"e3_{kind}_{arm}_lr{lr:g}_ep{epochs}_seed{seed}_{_key(settings)}"

        def model():
            from peft import PeftModel

            path, quant, _ = e.update_base(kind, setting)
            run = self.arm_run(e, kind, setting, arm, lr, seed, run_epochs)
            return PeftModel.from_pretrained(load_base(path, quant), run / f"epoch-{epochs}").eval()

        return e.scores(name, settings, split, model)

    # -- stages ------------------------------------------------------------------------------------------------
    def dev_update(self, name: str) -> dict:
        """Every arm's grid on dev (seed 0) and each arm's setting by the rule; stored in `dev_choices.json` (frozen:
        a re-run returns the stored entry)."""
        from adaptguard.compat.stats.metrics import flip_metrics
        from adaptguard.update.candidates import pick_setting

        done = json.loads(self.choices_path.read_text()) if self.choices_path.exists() else {}
        if name in done:
            return done[name]
        self.arm_rows()  # the budget rule, before any arm runs
        e, kind, setting, how = self.update(name)
        seed = self.cfg.seeds[0]
        v1 = e.v1_scores("dev")
        v2 = flip_metrics(v1, e.v2_scores(kind, setting, "dev"), seed=seed)
        rows = []
        for arm in self.cfg.arms:
            for lr, epochs in self.grid():
                m = flip_metrics(v1, self.arm_scores(e, kind, setting, arm, lr, epochs, seed, "dev"), seed=seed)
                rows.append({"recipe": arm, "learning_rate": lr, "epochs": epochs, "acc": m["new_acc"],
                             "nfr": m["nfr"], "pfr": m["pfr"]})
        chosen = {}
        for arm in self.cfg.arms:
            rule = pick_setting(rows, self.cfg.max_accuracy_drop, recipe=arm)
            chosen[arm] = {**rows[rule["chosen"]], "matched": rule["matched"]}
        entry = {"update": UPDATE_NAMES[name], "kind": kind, "setting": setting, "chosen_by": how,
                 "task": e.cfg.task if name != "generative" else how["task"], "v1_dev_acc": v2["old_acc"],
                 "v2_dev_acc": v2["new_acc"], "v2_dev_nfr": v2["nfr"], "arm_rows": self.arm_rows(),
                 "accuracy_floor": rule["accuracy_floor"], "grid": rows, "chosen": chosen}
        done = json.loads(self.choices_path.read_text()) if self.choices_path.exists() else {}
        atomic_write_text(self.choices_path, json.dumps({**done, name: entry}, indent=2, default=str))
        self.say(f"E3: {UPDATE_NAMES[name]} dev choices: " + "; ".join(
            f"{a} lr {c['learning_rate']:g} × {c['epochs']} (acc {c['acc']:.3f}, NFR {c['nfr']:.3f}"
            f"{'' if c['matched'] else ', below the floor'})" for a, c in chosen.items()))
        return entry

    def test_update(self, name: str) -> dict:
        """The update's dev choices (first), then on test: every arm's chosen setting over the seeds against the
        control, and seed 0's whole grid."""
        from adaptguard.compat.stats.metrics import bootstrap_mean_ci, flip_indicators

        entry = self.dev_update(name)
        e, kind, setting, _ = self.update(name)
        seed0 = self.cfg.seeds[0]
        v1 = e.v1_scores("test")
        v2 = e.v2_scores(kind, setting, "test")
        arms = {arm: [self.arm_scores(e, kind, setting, arm, c["learning_rate"], c["epochs"], s, "test")
                      for s in self.cfg.seeds] for arm, c in entry["chosen"].items()}
        grid = []
        for arm in self.cfg.arms:
            for lr, epochs in self.grid():
                c = self.arm_scores(e, kind, setting, arm, lr, epochs, seed0, "test")
                neg = flip_indicators(v1, c)["nfr"]
                grid.append({"recipe": arm, "learning_rate": lr, "epochs": epochs, "acc": float(np.mean(c)),
                             "acc_ci": list(bootstrap_mean_ci(np.asarray(c, float), n_boot=4000, seed=seed0)),
                             "nfr": float(np.mean(neg)),
                             "nfr_ci": list(bootstrap_mean_ci(neg.astype(float), n_boot=4000, seed=seed0))})
        v2_neg = flip_indicators(v1, v2)["nfr"]
        return {**{k: entry[k] for k in ("update", "kind", "setting", "task", "arm_rows", "chosen")},
                "v1_test_acc": float(np.mean(v1)), "v2": {"acc": float(np.mean(v2)), "nfr": float(np.mean(v2_neg))},
                "arms": arm_summary(v1, arms, seed=seed0), "test_grid_seed0": grid, "n_test": len(v1)}

    def run(self, stage: str) -> dict:
        from adaptguard.utils.sweeps import machine_info

        if stage == "dev":
            return {name: self.dev_update(name) for name in self.cfg.updates}
        if stage != "test":
            raise ValueError(f"--stage must be dev or test, got {stage!r}")
        for name in self.cfg.updates:  # every dev choice first
            self.dev_update(name)
        report = {"config": dataclasses.asdict(self.cfg), "machine": machine_info(),
                  "updates": {name: self.test_update(name) for name in self.cfg.updates}}
        write_report(self.root / "e3", report, markdown(report))
        plot(report, self.root / "e3" / "tradeoff.png")
        return report


def markdown(report: dict) -> str:
    """E3's report: per update, each arm's chosen setting, its test accuracy and flips against v1 (mean over seeds),
    and Δ NFR / Δ accuracy against the control with the registered verdicts."""
    cfg = report["config"]
    lines = ["# E3: does v1's signal help beyond retraining? Every arm tuned alike", "",
             f"Seeds {cfg['seeds']}; grid lr {cfg['learning_rates']} × epochs {cfg['epochs']} per arm, each arm's "
             f"setting by the pick rule on seed 0's dev scores (accuracy floor: the best control − "
             f"{cfg['max_accuracy_drop']:g}). Δ vs control: item-paired, averaged over seeds, 95 % bootstrap CI over "
             "items (an item's seeds together); helps = reproduced and the Δ accuracy CI above −0.02.", ""]
    for name, u in report["updates"].items():
        lines += [f"## {u['update']} ({name}: {u['kind']} {u['setting']}, task {u['task']}, {u['arm_rows']} arm rows)",
                  "", f"v1 test accuracy {u['v1_test_acc']:.3f}; v2 {u['v2']['acc']:.3f} (NFR {u['v2']['nfr']:.3f}); "
                  f"{u['n_test']} test items.", "",
                  "| arm | chosen (lr × epochs) | accuracy | NFR | PFR | Δ NFR (95 % CI) | McNemar p per seed | "
                  "Δ accuracy (95 % CI) | verdict | helps |", "|---|---|---|---|---|---|---|---|---|---|"]
        for arm, r in u["arms"].items():
            c = u["chosen"][arm]
            where = f"{c['learning_rate']:g} × {c['epochs']}" + ("" if c["matched"] else " (below the floor)")
            vs = r.get("vs_control")
            cmp = (f"{vs['delta_nfr']:+.3f} ({vs['delta_nfr_ci'][0]:+.3f} to {vs['delta_nfr_ci'][1]:+.3f}) | "
                   f"{', '.join(f'{p:.2g}' for p in vs['mcnemar_p_per_seed'])} | {vs['delta_acc']:+.3f} "
                   f"({vs['delta_acc_ci'][0]:+.3f} to {vs['delta_acc_ci'][1]:+.3f}) | {vs['verdict']} | "
                   f"{'yes' if vs['helps'] else 'no'}") if vs else " | | | | "
            lines.append(f"| {arm} | {where} | {r['acc']:.3f} | {r['nfr']:.3f} | {r['pfr']:.3f} | {cmp} |")
        lines.append("")
    lines.append(machine_line(report["machine"]))
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Per update: test accuracy vs NFR against v1 of every arm's whole grid (seed 0; bars: 95 % bootstrap CIs over
    items) and each arm's chosen setting over the seeds (large marker)."""
    from adaptguard.utils.figures import new_figure, save_figure

    updates = list(report["updates"].values())
    fig = new_figure(figsize=(4.6 * len(updates), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(updates)))
    colours = dict(zip(ARMS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, u in zip(axes, updates):
        for arm in u["arms"]:
            pts = [g for g in u["test_grid_seed0"] if g["recipe"] == arm]
            ax.errorbar([g["acc"] for g in pts], [g["nfr"] for g in pts], fmt="o" if arm != "control" else "s",
                        xerr=np.array([[g["acc"] - g["acc_ci"][0], g["acc_ci"][1] - g["acc"]] for g in pts]).T,
                        yerr=np.array([[g["nfr"] - g["nfr_ci"][0], g["nfr_ci"][1] - g["nfr"]] for g in pts]).T,
                        color=colours.get(arm), alpha=0.45, markersize=5, elinewidth=0.8, label=f"{arm} (grid, seed 0)")
            r = u["arms"][arm]
            ax.scatter([r["acc"]], [r["nfr"]], s=150, marker="*", color=colours.get(arm), edgecolor="black",
                       linewidth=0.6, zorder=5)
        ax.set_title(f"{u['update']}: {u['kind']} ({u['task']})", fontsize=9)
        ax.set_xlabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test NFR against v1 (lower is better)")
    axes[-1].legend(fontsize=7, title="★ chosen setting, mean over seeds", title_fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    @dataclass
    class Cli:
        stage: str = field(default="test", metadata={"help": "dev: the dev choices only; test: the whole run."})
        quick: bool = field(default=False, metadata={"help": "Small splits, 2 seeds, no gates: the mechanics."})
        export: str = field(default="", metadata={
            "help": "After the stage, copy the small records (per-item scores, dev choices, budget, timings) here, "
                    "to commit; copying them back into --out resumes without rescoring."})

    hide_unused_library_noise()
    cli, cfg = HfArgumentParser((Cli, E3Config)).parse_args_into_dataclasses(argv)
    if cli.quick:
        cfg = dataclasses.replace(quick_config(cfg.out if cfg.out != "e3-out" else "e3-quick"), model=cfg.model,
                                  task=cfg.task, updates=cfg.updates, generative_tasks=cfg.generative_tasks)
    result = E3(cfg).run(cli.stage)
    if cli.export:
        export_records(Path(cfg.out), Path(cli.export))
    return result


if __name__ == "__main__":
    main()
