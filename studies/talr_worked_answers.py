"""Experiment E4 (issue 37, studies/preregistration.md § E4): TALR vs SFT (and DFT) on long worked answers, the regime
paper 003 describes — MedCalc-style items whose targets are a calculator's step-by-step rationale and the answer.

E2's design (`talr_vs_sft.E2`: full fine-tuning at the same learning rate, three seeds, general flips against the
base on E2's held-out BIG-bench items, the same statistics and verdicts) with three changes the registration makes:
the domain is `adaptguard.data.medcalc` (scored by MedCalc-Bench's final-answer rule on the greedy generation); each
run trains `epochs` epochs and keeps the checkpoint with the best domain dev accuracy; the dev rule walks calculator
sets, then learning rates, and stops at the first where SFT learns the domain and forgets. `regime()` measures what
makes this the paper's regime: the base model's probability of each target token, and TALR's weights within rows,
for E4's rows and for E2's one-token rows.

    python -m adaptguard.experiments.talr_worked_answers --stage dev    # the registered choice (dev only)
    python -m adaptguard.experiments.talr_worked_answers --stage test   # every arm x seed on test, the report
    python -m adaptguard.experiments.talr_worked_answers --quick        # the mechanics, small
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import TrainerCallback

from adaptguard.utils.files import atomic_write_text

from .common import score_tasks, seeded_order, store_model_name, task_rows, training_rows, write_report
from .talr_vs_sft import ARMS, E2, E2Config, add_general_splits, markdown_tables, plot, summarise
from .talr_vs_sft import main as e2_main

CALCULATOR_SETS = ("centor,bmi,mean_arterial_pressure", "centor,curb_65,cha2ds2_vasc")


@dataclass
class E4Config(E2Config):
    out: str = field(default="e4-out", metadata={"help": "Output directory (reused by a re-run: resumes)."})
    domain: str = field(default="medcalc", metadata={"help": "The domain's name in reports (the items: below)."})
    calculator_sets: list[str] = field(default_factory=lambda: list(CALCULATOR_SETS), metadata={
        "help": "Candidate calculator sets (comma-separated names), tried in order by the dev rule."})
    train_per_calculator: list[int] = field(default_factory=lambda: [80, 40], metadata={
        "help": "Training items per calculator, one per calculator set (registered: S2's rows are twice as long)."})
    dev_per_calculator: int = 34
    test_per_calculator: int = 100
    domain_seed: int = 37
    epochs: float = field(default=2.0, metadata={"help": "Epochs per run; a checkpoint after each, the best on "
                                                         "domain dev kept."})
    max_length: int = 768
    max_lrs: int = 1
    max_new_tokens_factor: float = field(default=1.25, metadata={
        "help": "Generation budget: this times the longest training completion (tokens)."})
    generation_batch_size: int = 16
    e2_domain: str = field(default="bigbench:hyperbaton", metadata={"help": "E2's domain, for regime()."})
    e2_train_rows: int = field(default=400, metadata={"help": "E2's training rows compared in regime()."})


def quick_config(out: str = "e4-quick") -> E4Config:
    return E4Config(out=out, calculator_sets=["bmi,mean_arterial_pressure"], train_per_calculator=[12],
                    dev_per_calculator=6, test_per_calculator=10, n_general_dev=20, n_general_test=30,
                    general_tasks=list(E2Config().general_tasks[:2]), learning_rates=[1e-4], min_nfr=0.0, seeds=[0],
                    e2_train_rows=40)


def best_epoch(dev: dict[int, list[bool]]) -> int:
    """The epoch whose per-item domain dev scores have the highest accuracy; a tie goes to the earlier epoch."""
    return max(dev, key=lambda e: (np.mean(dev[e]), -e))


def calculators(spec: str) -> list[str]:
    return [c.strip() for c in spec.split(",") if c.strip()]


class SaveEachEpoch(TrainerCallback):
    """Saves the whole model (and tokenizer) as `out/epoch-<e>` after every epoch."""

    def __init__(self, out: Path, tokenizer):
        self.out, self.tokenizer = out, tokenizer

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero:
            model.save_pretrained(self.out / f"epoch-{round(state.epoch)}")
            self.tokenizer.save_pretrained(self.out / f"epoch-{round(state.epoch)}")


class E4(E2):
    """The experiment's steps, each stored and reused (see the module docstring)."""

    def __init__(self, cfg: E4Config, say=print):
        if len(cfg.train_per_calculator) != len(cfg.calculator_sets):
            raise ValueError(f"train_per_calculator ({cfg.train_per_calculator}) needs one size per calculator set "
                             f"({cfg.calculator_sets})")
        if not float(cfg.epochs).is_integer() or cfg.epochs < 1:
            raise ValueError(f"epochs must be a whole number ≥ 1 (a checkpoint after each), got {cfg.epochs}")
        super().__init__(cfg, say)
        self.common = {"model": store_model_name(cfg.model), "general_tasks": cfg.general_tasks, "split_seed": cfg.split_seed,
                       "general_sizes": [cfg.n_general_dev, cfg.n_general_test], "domain_seed": cfg.domain_seed,
                       "domain_sizes": [cfg.dev_per_calculator, cfg.test_per_calculator]}

    def load_splits(self) -> dict:
        return add_general_splits(self.cfg, {"dev": {}, "test": {}})

    def domain(self, index: int) -> dict[str, list[dict]]:
        """{train, dev, test} MedCalc-style rows of calculator set `index` (registered sizes)."""
        from adaptguard.data.medcalc import medcalc_splits

        c = self.cfg
        return medcalc_splits(calculators(c.calculator_sets[index]), c.train_per_calculator[index],
                              c.dev_per_calculator, c.test_per_calculator, c.domain_seed)

    def max_new_tokens(self, index: int) -> int:
        longest = max(len(self.tokenizer(r["completion"], add_special_tokens=False)["input_ids"])
                      for r in self.domain(index)["train"])
        return int(np.ceil(self.cfg.max_new_tokens_factor * longest))

    # -- scores --------------------------------------------------------------------------------------------------
    def domain_scores(self, name: str, settings: dict, index: int, split: str, model_fn) -> dict:
        """{"correct", "pred", "finished"} of a model's greedy answers on a domain split, by MedCalc-Bench's rule.
        A generation ends at EOS or where it starts a new item (`Patient note:`); `finished` is False where it ran
        out of tokens instead. Rows are generated grouped by calculator (similar lengths share a batch)."""
        from adaptguard.data.medcalc import NOTE_PREFIX, is_correct
        from adaptguard.utils.generation import generate_answers

        rows = self.domain(index)[split]
        order = sorted(range(len(rows)), key=lambda i: rows[i]["calculator"])

        def make(tmp: Path):
            model = model_fn()  # may train the run first; the time below is generation alone
            start = time.perf_counter()
            preds, finished = generate_answers(model, self.tokenizer, [rows[i] for i in order],
                                               self.max_new_tokens(index), self.cfg.generation_batch_size,
                                               stop_strings=[NOTE_PREFIX], with_finished=True)
            back = np.argsort(order)  # to row order
            preds, finished = [preds[i] for i in back], [finished[i] for i in back]
            correct = [is_correct(p, r["answer"], r["kind"]) for p, r in zip(preds, rows)]
            (tmp / "scores.json").write_text(json.dumps({"correct": correct, "pred": preds, "finished": finished}))
            self.say(f"E4: {name} on domain {split}: {np.mean(correct):.3f}, {np.mean(finished):.0%} finished "
                     f"({time.perf_counter() - start:.0f} s)")

        folder = self.store.get(f"scores/{split}/domain/{name}", self.domain_key(settings, index, split), make)
        return json.loads((folder / "scores.json").read_text())

    def domain_key(self, settings: dict, index: int, split: str) -> dict:
        """The stored settings of a domain score step (a changed generation setting is rescored, never reused)."""
        from adaptguard.data.medcalc import NOTE_PREFIX

        c = self.cfg
        return {**settings, "split": split, "set": index, "calculators": c.calculator_sets[index],
                "n_train": c.train_per_calculator[index], "max_new_tokens": self.max_new_tokens(index),
                "generation_batch_size": c.generation_batch_size, "stop": NOTE_PREFIX}

    def general_scores(self, name: str, settings: dict, split: str, model_fn) -> dict[str, list[bool]]:
        def make(tmp: Path):
            scores = score_tasks(model_fn(), self.tokenizer, self.splits[split], tmp / "tasks",
                                 self.cfg.eval_batch_size)
            (tmp / "scores.json").write_text(json.dumps(scores))

        folder = self.store.get(f"scores/{split}/general/{name}", {**settings, "split": split}, make)
        return json.loads((folder / "scores.json").read_text())

    def base_scores(self, split: str, index: int = 0) -> dict[str, list[bool]]:
        from transformers import AutoModelForCausalLM

        model = lambda: AutoModelForCausalLM.from_pretrained(self.base_path).eval()
        return {"domain": self.domain_scores(f"base_set{index}", self.common, index, split, model)["correct"],
                **self.general_scores("base", self.common, split, model)}

    # -- runs ----------------------------------------------------------------------------------------------------
    def run_settings(self, arm: str, lr: float, seed: int, index: int) -> dict:
        c = self.cfg
        return {**self.common, "set": c.calculator_sets[index], "n_train": c.train_per_calculator[index], "arm": arm,
                "weighting": ARMS[arm], "lr": lr, "seed": seed, "epochs": c.epochs, "batch_size": c.batch_size,
                "max_length": c.max_length}

    def run(self, arm: str, lr: float, seed: int, index: int) -> Path:
        """A full fine-tuning run: `epochs` epochs, each checkpoint scored on domain dev, the best kept as `model/`
        (tie: the earlier), with `epochs.json` = every checkpoint's per-item domain dev scores and the choice."""
        settings = self.run_settings(arm, lr, seed, index)
        name = f"{arm}_lr{lr:g}_seed{seed}_set{index}"

        def train(tmp: Path):
            import torch
            from datasets import Dataset
            from transformers import AutoModelForCausalLM, PrinterCallback, set_seed

            from adaptguard.talr.config import TALRConfig
            from adaptguard.talr.trainer import TALRTrainer
            from adaptguard.trl_adapter import no_activation_checkpointing
            from adaptguard.utils.progress import TrainingProgress

            start = time.perf_counter()
            c = self.cfg
            set_seed(seed)
            args = TALRConfig(output_dir=str(tmp / "run"), weighting=ARMS[arm], per_device_train_batch_size=c.batch_size,
                              num_train_epochs=c.epochs, learning_rate=lr, lr_scheduler_type="constant",
                              max_length=c.max_length, seed=seed, report_to="none", save_strategy="no",
                              logging_steps=10, disable_tqdm=True, **no_activation_checkpointing(),
                              use_cpu=not torch.cuda.is_available())  # also turns off pinning (no use on a CPU)
            rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in self.domain(index)["train"]]
            trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(self.base_path), args=args,
                                  train_dataset=Dataset.from_list(rows), processing_class=self.tokenizer,
                                  callbacks=[TrainingProgress(f"E4 {name}"), SaveEachEpoch(tmp, self.tokenizer)])
            trainer.remove_callback(PrinterCallback)
            trainer.train()
            train_seconds = time.perf_counter() - start
            shutil.rmtree(tmp / "run", ignore_errors=True)
            dev = {}
            for epoch in range(1, int(c.epochs) + 1):
                path = tmp / f"epoch-{epoch}"
                dev[epoch] = self.domain_scores(f"{name}_epoch{epoch}", {**settings, "epoch": epoch}, index, "dev",
                                                lambda p=path: AutoModelForCausalLM.from_pretrained(p).eval())
            chosen = best_epoch({e: d["correct"] for e, d in dev.items()})
            (tmp / f"epoch-{chosen}").rename(tmp / "model")
            for epoch in dev:
                shutil.rmtree(tmp / f"epoch-{epoch}", ignore_errors=True)
            (tmp / "epochs.json").write_text(json.dumps({"chosen": chosen, "train_seconds": train_seconds,
                                                          "dev_accuracy": {e: float(np.mean(d["correct"]))
                                                                           for e, d in dev.items()},
                                                          "log_history": trainer.state.log_history}))
            self.say(f"E4: trained {name}: {train_seconds:.0f} s; kept epoch {chosen}")

        return self.store.get(f"models/{name}", settings, train)

    def kept_epoch(self, arm: str, lr: float, seed: int, index: int) -> int:
        """The run's kept epoch: from its stored per-epoch domain dev scores when all are there (records that a copy
        back into `out` restores: a study resumed on another machine does not retrain for them), else from the run."""
        settings = self.run_settings(arm, lr, seed, index)
        name = f"{arm}_lr{lr:g}_seed{seed}_set{index}"
        folders = {e: self.store.find(f"scores/dev/domain/{name}_epoch{e}",
                                      self.domain_key({**settings, "epoch": e}, index, "dev"))
                   for e in range(1, int(self.cfg.epochs) + 1)}
        if None in folders.values():
            return json.loads((self.run(arm, lr, seed, index) / "epochs.json").read_text())["chosen"]
        return best_epoch({e: json.loads((f / "scores.json").read_text())["correct"] for e, f in folders.items()})

    def run_scores(self, arm: str, lr: float, seed: int, index: int, split: str) -> dict[str, list[bool]]:
        """{"domain": ..., **general} of the run's kept checkpoint on `split`."""
        from transformers import AutoModelForCausalLM

        settings = self.run_settings(arm, lr, seed, index)
        name = f"{arm}_lr{lr:g}_seed{seed}_set{index}"
        model = lambda: AutoModelForCausalLM.from_pretrained(self.run(arm, lr, seed, index) / "model").eval()
        if split == "dev":  # scored while choosing the checkpoint
            chosen = self.kept_epoch(arm, lr, seed, index)
            domain = self.domain_scores(f"{name}_epoch{chosen}", {**settings, "epoch": chosen}, index, "dev", model)
        else:
            domain = self.domain_scores(name, settings, index, split, model)
        return {"domain": domain["correct"], "domain_finished": domain["finished"],
                **self.general_scores(name, settings, split, model)}

    # -- stages --------------------------------------------------------------------------------------------------
    def dev_stage(self) -> dict:
        """The registered choice (dev only): the first calculator set, then learning rate (smallest first), where SFT
        (seed 0) learns the domain (paired CI of the dev gain over the base above 0) and forgets (general dev NFR ≥
        min_nfr). Writes `dev_choices.json`."""

        seed = self.cfg.seeds[0]
        choices = {"seed": seed, "sets": {}, "set": None, "learning_rates": []}
        for index, spec in enumerate(self.cfg.calculator_sets):
            base = self.base_scores("dev", index)
            seen = {}
            for lr in self.cfg.learning_rates:
                sft = self.run_scores("SFT", lr, seed, index, "dev")
                seen[f"{lr:g}"] = self.qualification(base, sft)
                self.export()
                self.say(f"E4: dev SFT {spec} lr {lr:g}: {seen[f'{lr:g}']}")
                if seen[f"{lr:g}"]["qualifies"]:
                    break  # registered: the first qualifying (set, lr); the budget affords one
            choices["sets"][spec] = {"base_domain_acc": float(np.mean(base["domain"])), "lrs": seen}
            chosen = [lr for lr in self.cfg.learning_rates if seen.get(f"{lr:g}", {}).get("qualifies")]
            if chosen:
                choices.update(set=index, calculators=spec, learning_rates=chosen[:self.cfg.max_lrs],
                               n_train=self.cfg.train_per_calculator[index])
                break
        atomic_write_text(self.root / "dev_choices.json", json.dumps(choices, indent=2))
        return choices

    def run_test(self) -> dict:
        from adaptguard.utils.progress import progress_bar
        from adaptguard.utils.sweeps import machine_info

        choices = self.dev_stage()
        report = {"config": dataclasses.asdict(self.cfg), "machine": machine_info(), "dev_choices": choices}
        report["regime"] = self.regime(choices["set"] if choices["set"] is not None else 0)
        if choices["set"] is None:
            report["verdict"] = ("no setting where SFT both learns the domain and forgets on dev: nothing to compare "
                                 "(the registered fallback)")
        else:
            index = choices["set"]
            base = self.base_scores("test", index)
            runs = {}
            with progress_bar(len(ARMS) * len(choices["learning_rates"]) * len(self.cfg.seeds), "E4 test runs",
                              unit="run") as bar:
                for lr in choices["learning_rates"]:
                    for arm in ARMS:
                        runs[arm, lr] = []
                        for seed in self.cfg.seeds:
                            runs[arm, lr].append(self.run_scores(arm, lr, seed, index, "test"))
                            self.export()
                            bar.update()
            report.update(summarise(base, runs, self.general, self.cfg))
            # generations that ended (EOS or a new item) rather than ran out of tokens: a model that never stops is
            # scored on whatever its last `Answer:` was
            report["domain_finished"] = {f"{arm} {lr:g}": float(np.mean([s["domain_finished"] for s in seeds]))
                                         for (arm, lr), seeds in runs.items()}
            plot(report, self.root / "tradeoff.png", title=f"E4: TALR vs SFT vs DFT on worked answers "
                                                           f"({choices['calculators']}), {self.cfg.model}")
        regime_plot(report["regime"], self.root / "regime.png")
        write_report(self.root, report, markdown(report))
        return report

    # -- the regime ----------------------------------------------------------------------------------------------
    def regime(self, index: int) -> dict:
        """Under the base model: every target token's probability, and TALR's weights within rows (τ the median of
        8-row batches in row order), for E4's training rows (set `index`) and E2's (one-token answers)."""
        e2 = E2Config()  # E2's registered splits: dev, test, then the training pool
        start = e2.n_domain_dev + e2.n_domain_test
        pool = seeded_order(task_rows(self.cfg.e2_domain, "e2_domain"), e2.split_seed)[start:start + self.cfg.e2_train_rows]
        if len(pool) < self.cfg.e2_train_rows:
            raise ValueError(f"e2_domain {self.cfg.e2_domain}: fewer than {start + self.cfg.e2_train_rows} items")
        sets = {"E4": [{"prompt": r["prompt"], "completion": r["completion"]} for r in self.domain(index)["train"]],
                "E2": training_rows(pool)}

        def make(tmp: Path):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.base_path).eval()
            out = {name: token_regime(model, self.tokenizer, rows) for name, rows in sets.items()}
            (tmp / "regime.json").write_text(json.dumps(out))

        folder = self.store.get(f"regime/set{index}", {**self.common, "set": self.cfg.calculator_sets[index],
                                                       "n_train": self.cfg.train_per_calculator[index],
                                                       "e2_domain": self.cfg.e2_domain,
                                                       "e2_rows": self.cfg.e2_train_rows}, make)
        return json.loads((folder / "regime.json").read_text())


def token_regime(model, tokenizer, rows: list[dict], batch_size: int = 8) -> dict:
    """Teacher-forced, per completion token (+ EOS, as TRL trains): the base model's probability p, and TALR's weight
    w = max(exp(−ℓ/τ), 0.01) with τ the batch's median sequence NLL (`talr.losses.talr_token_weights`). Returns the
    probabilities' histogram (20 bins on [0, 1]) and shares, and per row the share of its weight on its lowest-weight
    10 % of tokens (at least one) and the min / median / max weight."""
    import torch

    from adaptguard.talr.losses import talr_token_weights

    probs, rows_out = [], []
    for i in range(0, len(rows), batch_size):
        seqs = []
        for r in rows[i:i + batch_size]:
            prompt = tokenizer(r["prompt"])["input_ids"]
            completion = tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            seqs.append((prompt, completion))
        width = max(len(p) + len(c) for p, c in seqs)
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id or 0)
        mask, attention = torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids)
        for j, (p, c) in enumerate(seqs):
            ids[j, :len(p) + len(c)] = torch.tensor(p + c)
            attention[j, :len(p) + len(c)] = 1
            mask[j, len(p):len(p) + len(c)] = True
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        scored = mask[:, 1:]
        weights, _ = talr_token_weights(nll, scored)
        for j in range(len(seqs)):
            p_row = torch.exp(-nll[j][scored[j]])
            w_row = weights[j][scored[j]].sort().values
            k = max(1, int(np.ceil(0.1 * len(w_row))))
            probs += p_row.tolist()
            rows_out.append({"tokens": len(w_row), "low_decile_weight_share": float(w_row[:k].sum() / w_row.sum()),
                             "w_min": float(w_row[0]), "w_median": float(w_row.median()), "w_max": float(w_row[-1])})
    p = np.asarray(probs)
    return {"n_tokens": int(p.size), "p_median": float(np.median(p)), "share_p_above_0.9": float((p > 0.9).mean()),
            "share_p_below_0.1": float((p < 0.1).mean()),
            "p_histogram": np.histogram(p, bins=20, range=(0, 1))[0].tolist(),
            "rows": rows_out, "median_tokens_per_row": float(np.median([r["tokens"] for r in rows_out])),
            "median_low_decile_weight_share": float(np.median([r["low_decile_weight_share"] for r in rows_out]))}


def regime_plot(regime: dict, path: Path) -> None:
    """Paper 003 Fig. 3b for E4 and E2: the share of training target tokens by the base model's probability."""
    from adaptguard.utils.figures import new_figure, save_figure

    fig = new_figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    edges = np.linspace(0, 1, 21)
    for name, r in regime.items():
        counts = np.asarray(r["p_histogram"], float)
        ax.stairs(counts / counts.sum(), edges, label=f"{name} ({r['n_tokens']} tokens, median "
                                                      f"{r['median_tokens_per_row']:g} per row)")
    ax.set_xlabel("base model's probability of the target token")
    ax.set_ylabel("share of target tokens")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def markdown(report: dict) -> str:
    cfg, dev = report["config"], report["dev_choices"]
    lines = [f"# E4: TALR vs SFT vs DFT on worked answers (MedCalc-style), {cfg['model']}", "",
             (f"Dev choice: calculators {dev['calculators']}, {dev['n_train']} training items per calculator, "
              f"learning rates {dev['learning_rates']}" if dev["set"] is not None else
              "Dev choice: none (no setting qualified)") + f"; seeds {cfg['seeds']}; {cfg['epochs']:g} epochs, the best "
             f"domain-dev checkpoint kept. Test: {cfg['test_per_calculator']} items per calculator (synthetic notes, "
             f"the medcalc-bench rationales); {cfg['n_general_test']} items of each of {', '.join(cfg['general_tasks'])}"
             " (general, flips against the base model).", "", "## Dev stage (SFT, seed 0, the registered rule)", "",
             "| calculators | lr | domain dev acc (base) | gain (95 % CI) | general dev NFR | PFR | qualifies |",
             "|---|---|---|---|---|---|---|"]
    for spec, seen in dev["sets"].items():
        for lr, q in seen["lrs"].items():
            lo, hi = q["domain_gain_ci"]
            lines.append(f"| {spec} | {lr} | {q['domain_acc']:.3f} ({seen['base_domain_acc']:.3f}) | "
                         f"{100 * q['domain_gain']:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f}) | {q['general_nfr']:.1%} | "
                         f"{q['general_pfr']:.1%} | {'yes' if q['qualifies'] else 'no'} |")
    lines += ["", "## The regime (base model, training targets)", "",
              "| rows | target tokens | median per row | median p | p > 0.9 | p < 0.1 | TALR weight on a row's lowest 10 % "
              "of tokens (median) |", "|---|---|---|---|---|---|---|"]
    for name, r in report["regime"].items():
        lines.append(f"| {name} | {r['n_tokens']} | {r['median_tokens_per_row']:g} | {r['p_median']:.3f} | "
                     f"{r['share_p_above_0.9']:.3f} | {r['share_p_below_0.1']:.3f} | "
                     f"{r['median_low_decile_weight_share']:.3f} |")
    lines += ["", "![regime](regime.png)", ""]
    if "verdict" in report:
        return "\n".join([*lines, report["verdict"], ""]) + "\n"
    finished = ", ".join(f"{k} {v:.1%}" for k, v in report.get("domain_finished", {}).items())
    return "\n".join(lines + markdown_tables(report) + ["", f"Domain test generations that ended before the token "
                                                             f"budget (EOS or a new item): {finished}."]) + "\n"


def main(argv: list[str] | None = None) -> dict:
    return e2_main(argv, config_class=E4Config, quick=quick_config, study=E4)


if __name__ == "__main__":
    main()
