"""Experiment E1 (issue 28, studies/preregistration.md): MUSCLE on real updates that break answers, against a control.

v1 = a base model + a task LoRA; each update v2 = a changed base (weight-only 4-bit quantization with bitsandbytes, or
continued full fine-tuning on other tasks) + its own task LoRA. Per update and seed, four adapters start from v2's
task adapter and train the same way: MUSCLE with eq. 1's mask (`compat`), with LL_L (`ll_l`), distilling v1 everywhere
(`old_only`), and the control, cross-entropy on the labels without v1 (`control`). Every model is scored by lm-eval
(log-likelihood of each choice) on the dev or test split; the flips are against v1's task model.

Every finished step (an adapter, a base, a model's per-item scores) is written atomically under `out/` with the
settings that made it, and reused by a re-run with the same settings: a killed run continues where it stopped.

    python -m adaptguard.experiments.real_update --stage dev   # v1/v2 on dev, the pre-registered fallbacks
    python -m adaptguard.experiments.real_update --stage test  # every arm x seed on test, then the report
    python -m adaptguard.experiments.real_update --quick       # the mechanics in minutes (40/40/60 items, 1 seed)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaptguard.utils.files import atomic_write_text
from adaptguard.utils.quiet import hide_unused_library_noise, note_4bit_kernel
from adaptguard.utils.store import Store
from adaptguard.utils.sweeps import machine_line

from .common import nfr, score, seeded_order, store_model_name, task_rows, training_rows, verdict, write_report

ARMS = {"compat": "student_wrong", "ll_l": "old_likelier_token", "old_only": "old_only", "control": None}
MIX_TASKS = ("strategyqa", "logical_fallacy_detection", "implicatures", "movie_recommendation", "navigate",
             "sports_understanding")


@dataclass
class E1Config:
    out: str = field(default="e1-out", metadata={"help": "Output directory (reused by a re-run: resumes)."})
    model: str = field(default="built:smollm2", metadata={"help": "v1 base: Hub id, path or built:<name> or embedded:<name>."})
    task: str = field(default="bigbench:hyperbaton", metadata={
        "help": "bigbench:<task>, or a JSONL file of {input, choices, label} rows."})
    split_seed: int = field(default=1234, metadata={"help": "random.Random(seed).shuffle of the item indices."})
    n_train: int = 400
    n_dev: int = 300
    n_test: int = 400
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds of the arms."})
    updates: list[str] = field(default_factory=lambda: ["quantized", "continued"])
    quant_types: list[str] = field(default_factory=lambda: ["nf4", "fp4"], metadata={
        "help": "bitsandbytes 4-bit types tried in order until dev NFR >= min_nfr (pre-registered fallback)."})
    continued_settings: list[list[float]] = field(default_factory=lambda: [[200, 1e-5], [400, 1e-5], [400, 3e-5]],
                                                  metadata={"help": "(steps, lr) of U2 tried in order."})
    mix_tasks: list[str] = field(default_factory=lambda: list(MIX_TASKS), metadata={
        "help": "BIG-bench tasks of U2's instruction mix, or one JSONL file of {input, choices, label} rows."})
    mix_rows_per_task: int = 400
    min_nfr: float = field(default=0.05, metadata={"help": "An update must flip this share of dev items."})
    lora_r: int = 16
    lora_alpha: int = 32
    task_lrs: list[float] = field(default_factory=lambda: [1e-4, 3e-4], metadata={
        "help": "Task adapters' learning rates; the best v1 dev accuracy picks one (pre-registered)."})
    arm_lrs: list[float] = field(default_factory=lambda: [1e-4, 3e-4], metadata={
        "help": "Arms' learning rates; per update, the best control-arm dev accuracy (seed 0) picks one."})
    batch_size: int = 8
    max_length: int = 128
    temperature: float = 2.0
    eval_batch_size: int = 16
    use_cpu: bool = True


def quick_config(out: str = "e1-quick") -> E1Config:
    return E1Config(out=out, n_train=40, n_dev=40, n_test=60, seeds=[0], continued_settings=[[20, 1e-5]],
                    mix_rows_per_task=40, quant_types=["nf4"], min_nfr=0.0, task_lrs=[1e-4], arm_lrs=[1e-4])


def _key(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_rows(cfg: E1Config) -> dict[str, list[dict]]:
    """{train, dev, test}: {input, choices, label} rows in the seeded order, the splits of the registration."""
    rows = task_rows(cfg.task, "task")
    need = cfg.n_train + cfg.n_dev + cfg.n_test
    if len(rows) < need:
        raise ValueError(f"task {cfg.task}: {len(rows)} items, the splits need {need}")
    picked = seeded_order(rows, cfg.split_seed)[:need]
    return {"train": picked[:cfg.n_train], "dev": picked[cfg.n_train:cfg.n_train + cfg.n_dev],
            "test": picked[cfg.n_train + cfg.n_dev:]}


def _peft_config(cfg: E1Config, model):
    from peft import LoraConfig

    from adaptguard.utils.lora import default_lora_targets

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=default_lora_targets(model),
                      task_type="CAUSAL_LM")


def _args(cfg: E1Config, out: Path, seed: int, lr: float, **kw) -> dict:
    from adaptguard.trl_adapter import no_activation_checkpointing

    return dict(output_dir=str(out / "run"), per_device_train_batch_size=cfg.batch_size, num_train_epochs=1,
                learning_rate=lr, lr_scheduler_type="constant", max_length=cfg.max_length, seed=seed, bf16=False,
                use_cpu=cfg.use_cpu, report_to="none", save_strategy="no", logging_steps=10, disable_tqdm=True,
                **no_activation_checkpointing(), **kw)


def load_base(path: str, quant_type: str | None = None):
    """A base model: fp32, or weight-only 4-bit with bitsandbytes (fp32 compute, blocksize 64, no double
    quantization), loaded as a QLoRA user loads it."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if quant_type is None:
        return AutoModelForCausalLM.from_pretrained(path)
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError(f"the quantized update (quant_type={quant_type!r}) needs bitsandbytes: "
                          "pip install 'adaptguard[quant]'")
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_compute_dtype=torch.float32,
                                bnb_4bit_use_double_quant=False)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map="cpu")
    note_4bit_kernel()
    return model


def train_adapter(cfg: E1Config, base, tokenizer, rows, out: Path, seed: int, lr: float, *, adapter: Path | None = None,
                  mask: str | None = None, old_model=None) -> None:
    """A LoRA adapter saved to `out`: fresh on `base`, or continuing `adapter`; cross-entropy (mask None) or MUSCLE
    with `mask` and the old task model `old_model`."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import PrinterCallback, set_seed

    from adaptguard.muscle.config import MUSCLEConfig
    from adaptguard.muscle.trainer import MUSCLETrainer
    from adaptguard.talr.config import TALRConfig
    from adaptguard.talr.trainer import TALRTrainer

    set_seed(seed)  # the same fresh init and data order in every arm of a seed
    peft_config = None
    if adapter is not None:
        base = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    else:
        peft_config = _peft_config(cfg, base)
    data = Dataset.from_list(training_rows(rows))
    if mask is None:
        trainer = TALRTrainer(model=base, args=TALRConfig(**_args(cfg, out, seed, lr, weighting="none")),
                              train_dataset=data, processing_class=tokenizer, peft_config=peft_config)
    else:
        trainer = MUSCLETrainer(model=base, args=MUSCLEConfig(**_args(cfg, out, seed, lr, mask=mask,
                                                                      temperature=cfg.temperature)),
                                old_model=old_model, train_dataset=data, processing_class=tokenizer,
                                peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    student = getattr(trainer, "_student_adapter", None) or "default"
    trainer.model.save_pretrained(out, selected_adapters=[student])


def continued_base(cfg: E1Config, v1_path: str, tokenizer, mix: list[dict], out: Path, steps: int, lr: float) -> None:
    """U2: the v1 base fully fine-tuned for `steps` steps on the instruction mix, saved to `out`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, set_seed

    from adaptguard.talr.config import TALRConfig
    from adaptguard.talr.trainer import TALRTrainer
    from adaptguard.utils.progress import TrainingProgress

    set_seed(0)
    args = _args(cfg, out, 0, lr, weighting="none")
    args.update(num_train_epochs=1, max_steps=int(steps))
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(v1_path), args=TALRConfig(**args),
                          train_dataset=Dataset.from_list(training_rows(mix)), processing_class=tokenizer,
                          callbacks=[TrainingProgress(f"U2 continued base ({int(steps)} steps, lr {lr:g})")])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)


class E1:
    """The experiment's steps, each cached in the store (see the module docstring)."""

    def __init__(self, cfg: E1Config, say=print):
        from transformers import AutoTokenizer

        from adaptguard.models.embedded import resolve_model

        self.cfg, self.say = cfg, say
        self.root = Path(cfg.out)
        self.store = Store(self.root)
        self.v1_path = resolve_model(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.v1_path)
        self.rows = load_rows(cfg)
        self._task_lr, self.choices = None, {}
        self.common = {"model": store_model_name(cfg.model), "task": cfg.task, "split_seed": cfg.split_seed,
                       "sizes": [cfg.n_train, cfg.n_dev, cfg.n_test], "lora": [cfg.lora_r, cfg.lora_alpha],
                       "batch_size": cfg.batch_size, "max_length": cfg.max_length}

    def _timed(self, what: str, make):
        def run(tmp: Path):
            start = time.perf_counter()
            self.say(f"E1: {what} ...")
            make(tmp)
            seconds = time.perf_counter() - start
            (tmp / "seconds.json").write_text(json.dumps(seconds))  # the cost, for budgets planned from it
            self.say(f"E1: {what}: {seconds:.0f} s")
        return run

    # -- models ------------------------------------------------------------------------------------------------
    def v1_adapter(self, lr: float | None = None) -> Path:
        lr = self.task_lr if lr is None else lr
        settings = {**self.common, "step": "v1_adapter", "lr": lr}
        return self.store.get(f"v1_adapter_{lr:g}", settings, self._timed(f"v1 task adapter (lr {lr:g})", lambda tmp:
                              train_adapter(self.cfg, load_base(self.v1_path), self.tokenizer, self.rows["train"], tmp,
                                            0, lr)))

    def v1_task_model(self, lr: float | None = None):
        from peft import PeftModel

        return PeftModel.from_pretrained(load_base(self.v1_path), self.v1_adapter(lr)).merge_and_unload().eval()

    @property
    def task_lr(self) -> float:
        """Dev choice (a): the task adapters' learning rate with the best v1 dev accuracy (the first on a tie)."""
        if self._task_lr is None:
            accuracy = {lr: float(np.mean(self.scores(f"v1_{lr:g}", {**self.common, "lr": lr}, "dev",
                                                      lambda lr=lr: self.v1_task_model(lr))))
                        for lr in self.cfg.task_lrs}
            self._task_lr = max(self.cfg.task_lrs, key=lambda lr: accuracy[lr])
            self.choices["task_lr"] = {"dev_accuracy": {f"{k:g}": v for k, v in accuracy.items()},
                                       "chosen": self._task_lr}
            self.say(f"E1: task adapters' lr {self._task_lr:g} (v1 dev accuracy {accuracy})")
        return self._task_lr

    def arm_lr(self, update: str, setting) -> float:
        """Dev choice (c), per update: the arms' learning rate with the best dev accuracy of the control arm
        (seed 0), the first on a tie."""
        accuracy = {lr: float(np.mean(self.arm_scores(update, setting, "control", 0, "dev", lr)))
                    for lr in self.cfg.arm_lrs}
        chosen = max(self.cfg.arm_lrs, key=lambda lr: accuracy[lr])
        self.choices[f"arm_lr_{update}"] = {"dev_accuracy": {f"{k:g}": v for k, v in accuracy.items()},
                                            "chosen": chosen}
        return chosen

    def update_base(self, update: str, setting) -> tuple[str, str | None, dict]:
        """(base path, bitsandbytes type or None, settings) of update `update` at fallback `setting`."""
        if update == "quantized":
            return self.v1_path, setting, {"quant_type": setting}
        if update == "continued":
            steps, lr = setting
            settings = {**self.common, "step": "continued_base", "steps": steps, "lr": lr, "mix": self.cfg.mix_tasks,
                        "mix_rows": self.cfg.mix_rows_per_task}
            name = f"continued_base_{int(steps)}_{lr:g}"
            path = self.store.get(name, settings, self._timed(f"U2 base ({int(steps)} steps, lr {lr:g})",
                                                              lambda tmp: continued_base(self.cfg, self.v1_path,
                                                                                         self.tokenizer, self._mix(),
                                                                                         tmp, steps, lr)))
            return str(path), None, {"continued": [steps, lr]}
        raise ValueError(f"updates: unknown update {update!r}; known: quantized, continued")

    def _mix(self) -> list[dict]:
        from adaptguard.data.bigbench import load_tasks

        files = [n for n in self.cfg.mix_tasks if n.endswith(".jsonl")]
        sources = {n: [json.loads(x) for x in Path(n).read_text().splitlines() if x.strip()] for n in files}
        sources |= load_tasks([n for n in self.cfg.mix_tasks if n not in files]) if len(files) < len(self.cfg.mix_tasks) \
            else {}
        mix = []
        for rows in sources.values():
            order = list(range(len(rows)))
            random.Random(self.cfg.split_seed).shuffle(order)
            mix += [rows[i] for i in order[:self.cfg.mix_rows_per_task]]
        random.Random(0).shuffle(mix)
        return mix

    def v2_adapter(self, update: str, setting) -> Path:
        path, quant, extra = self.update_base(update, setting)
        settings = {**self.common, "step": "v2_adapter", "lr": self.task_lr, **extra}
        return self.store.get(f"v2_adapter_{update}_{_key(settings)}", settings, self._timed(
            f"v2 task adapter ({update}, {extra})", lambda tmp: train_adapter(
                self.cfg, load_base(path, quant), self.tokenizer, self.rows["train"], tmp, 0, self.task_lr)))

    def v2_task_model(self, update: str, setting):
        from peft import PeftModel

        path, quant, _ = self.update_base(update, setting)
        return PeftModel.from_pretrained(load_base(path, quant), self.v2_adapter(update, setting)).eval()

    # -- scores ------------------------------------------------------------------------------------------------
    def scores(self, name: str, settings: dict, split: str, model_fn) -> list[bool]:
        def make(tmp: Path):
            correct = score(model_fn(), self.tokenizer, self.rows[split], tmp / "task", self.cfg.eval_batch_size)
            (tmp / "scores.json").write_text(json.dumps(correct))

        folder = self.store.get(f"scores/{split}/{name}", self.score_settings(settings, split),
                                self._timed(f"scoring {name} on {split}", make))
        return json.loads((folder / "scores.json").read_text())

    def score_settings(self, settings: dict, split: str) -> dict:
        """What a scoring of a model with `settings` on `split` is stored under (its key, and the lookup of it)."""
        return {**settings, "split": split}

    def v1_scores(self, split: str) -> list[bool]:
        lr = self.task_lr
        return self.scores(f"v1_{lr:g}", {**self.common, "lr": lr}, split, self.v1_task_model)

    def v2_scores(self, update: str, setting, split: str) -> list[bool]:
        _, _, extra = self.update_base(update, setting)
        settings = {**self.common, "lr": self.task_lr, **extra}
        return self.scores(f"v2_{update}_{_key(settings)}", settings, split,
                           lambda: self.v2_task_model(update, setting))

    # -- stages ------------------------------------------------------------------------------------------------
    def dev_stage(self) -> dict:
        """The registered dev choices, in order: (a) the task lr, (b) each update's setting, (c) each regressing
        update's arm lr. Writes `dev_choices.json`; nothing here reads the test split."""
        _ = self.task_lr
        for update in self.cfg.updates:
            setting, dev = self.fixed_update(update)
            self.choices[f"update_{update}"] = {"dev_nfr": dev, "setting": setting}
            if setting is not None:
                self.arm_lr(update, setting)
        atomic_write_text(self.root / "dev_choices.json", json.dumps(self.choices, indent=2, default=str))
        return self.choices

    def fixed_update(self, update: str):
        """The pre-registered fallback: the first setting of the update whose dev NFR against v1 reaches min_nfr,
        or None (no regression to protect). Returns (setting, {setting: dev NFR})."""
        settings = self.cfg.quant_types if update == "quantized" else self.cfg.continued_settings
        v1 = self.v1_scores("dev")
        seen = {}
        for setting in settings:
            rate = nfr(v1, self.v2_scores(update, setting, "dev"))
            seen[str(setting)] = rate
            self.say(f"E1: {update} {setting}: dev NFR {rate:.3f}")
            if rate >= self.cfg.min_nfr:
                return setting, seen
        return None, seen

    def arm_scores(self, update: str, setting, arm: str, seed: int, split: str, lr: float) -> list[bool]:
        path, quant, extra = self.update_base(update, setting)
        settings = {**self.common, "lr": self.task_lr, **extra, "arm": arm, "seed": seed, "arm_lr": lr,
                    "temperature": self.cfg.temperature}
        name = f"arm_{update}_{arm}_seed{seed}_lr{lr:g}_{_key(settings)}"

        def make_adapter(tmp: Path):
            mask = ARMS[arm]
            train_adapter(self.cfg, load_base(path, quant), self.tokenizer, self.rows["train"], tmp, seed, lr,
                          adapter=self.v2_adapter(update, setting), mask=mask,
                          old_model=self.v1_task_model() if mask else None)

        adapter = self.store.get(f"adapters/{name}", settings, self._timed(f"{arm} adapter ({update}, seed {seed})",
                                                                        make_adapter))

        def model():
            from peft import PeftModel

            return PeftModel.from_pretrained(load_base(path, quant), adapter).eval()

        return self.scores(name, settings, split, model)

    def run_test(self) -> dict:
        """Every registered arm x seed on test for each update that regresses on dev; the report."""
        from adaptguard.utils.sweeps import machine_info

        report = {"config": dataclasses.asdict(self.cfg), "machine": machine_info(), "updates": {}}
        self.dev_stage()  # every dev choice first, in the registered order
        v1 = self.v1_scores("test")
        for update in self.cfg.updates:
            setting, dev = self.fixed_update(update)
            entry = {"dev_nfr": dev, "setting": setting}
            report["updates"][update] = entry
            if setting is None:
                entry["verdict"] = "no regression to protect (dev NFR below min_nfr at every registered setting)"
                continue
            lr = self.arm_lr(update, setting)
            v2 = self.v2_scores(update, setting, "test")
            arms = {arm: [self.arm_scores(update, setting, arm, s, "test", lr) for s in self.cfg.seeds] for arm in ARMS}
            entry.update(summarise(v1, v2, arms, seed=0))
        report["dev_choices"] = self.choices
        write_report(self.root, report, markdown(report))
        return report


def summarise(v1: list[bool], v2: list[bool], arms: dict[str, list[list[bool]]], seed: int = 0) -> dict:
    """Per arm: accuracy, NFR, PFR (mean over seeds); against the control, the item-paired ΔNFR averaged over seeds
    with a bootstrap CI over items (an item's seeds resampled together), per-seed McNemar p, and the registered
    verdict."""
    from adaptguard.compat.stats.metrics import flip_metrics, paired_seeds_difference

    old = np.asarray(v1, dtype=bool)
    out = {"v2": {k: v for k, v in flip_metrics(old, v2, seed=seed).items()}}
    negative = {arm: np.array([old & ~np.asarray(s, dtype=bool) for s in runs]) for arm, runs in arms.items()}
    for arm, runs in arms.items():
        per_seed = [flip_metrics(old, s, seed=seed) for s in runs]
        out[arm] = {k: float(np.mean([m[k] for m in per_seed])) for k in ("new_acc", "nfr", "pfr", "btc")}
        if arm == "control":
            continue
        d = paired_seeds_difference(negative[arm], negative["control"], n_boot=4000, seed=seed)
        lo, hi = d["ci"]
        out[arm]["vs_control"] = {"delta_nfr": d["diff"], "ci": [lo, hi],
                                  "mcnemar_p_per_seed": [x["mcnemar_p"] for x in d["per_seed"]],
                                  "verdict": verdict(lo, hi)}
    return out


def markdown(report: dict) -> str:
    """E1's report as Markdown: per update, every arm's accuracy and flips against v1, and each MUSCLE arm against
    the control with the registered verdict."""
    cfg = report["config"]
    lines = [f"# E1: MUSCLE on real updates of {cfg['model']} ({cfg['task']})", "",
             f"Splits {cfg['n_train']} / {cfg['n_dev']} / {cfg['n_test']} (train / dev / test), seeds "
             f"{cfg['seeds']}; flips against v1's task model on the {cfg['n_test']} test items. Δ NFR: item-paired, "
             "averaged over seeds, 95 % bootstrap CI over items (an item's seeds together).", ""]
    for update, entry in report["updates"].items():
        lines += [f"## {update}: setting {entry['setting']}, dev NFR {entry['dev_nfr']}", ""]
        if entry.get("verdict"):
            lines += [entry["verdict"], ""]
            continue
        lines += [f"v1 test accuracy {entry['v2']['old_acc']:.3f}.", "",
                  "| arm | accuracy | NFR | PFR | BTC | Δ NFR vs control (95 % CI) | McNemar p per seed | verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for arm in ("v2", *ARMS):
            r = entry[arm]
            vs = r.get("vs_control")
            cmp = f"{vs['delta_nfr']:+.3f} ({vs['ci'][0]:+.3f} to {vs['ci'][1]:+.3f}) | " \
                  f"{', '.join(f'{p:.2g}' for p in vs['mcnemar_p_per_seed'])} | {vs['verdict']}" if vs else " | | "
            btc = "" if r.get("btc") is None else f"{r['btc']:.3f}"
            lines.append(f"| {arm} | {r['new_acc']:.3f} | {r['nfr']:.3f} | {r['pfr']:.3f} | {btc} | {cmp} |")
        lines.append("")
    lines.append(machine_line(report["machine"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    @dataclass
    class Cli:
        stage: str = field(default="test", metadata={"help": "dev: fix the updates on dev; test: the whole run."})
        quick: bool = field(default=False, metadata={"help": "40/40/60 items, 1 seed, U2 20 steps: the mechanics."})

    hide_unused_library_noise()
    cli, cfg = HfArgumentParser((Cli, E1Config)).parse_args_into_dataclasses(argv)
    if cli.quick:
        cfg = dataclasses.replace(quick_config(cfg.out if cfg.out != "e1-out" else "e1-quick"), model=cfg.model,
                                  task=cfg.task)
    e1 = E1(cfg)
    if cli.stage == "dev":
        return e1.dev_stage()
    if cli.stage != "test":
        raise ValueError(f"--stage must be dev or test, got {cli.stage!r}")
    return e1.run_test()


if __name__ == "__main__":
    main()
