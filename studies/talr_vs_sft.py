"""Experiment E2 (issue 29, studies/preregistration.md): TALR vs SFT (and DFT) where SFT really forgets.

A base model (default SmolLM2-135M-Instruct) is fully fine-tuned on a domain it can learn (BIG-bench hyperbaton,
hundreds of rows) with SFT, TALR (paper 003 eq. 5–6) and DFT at the same learning rates, three seeds (the data
order). Every model is scored by lm-eval (log-likelihood of each choice) on the domain's held-out items and on six
held-out general BIG-bench tasks; general flips are against the base model. The learning rates are fixed on dev —
SFT must learn the domain and forget ≥ 5 % of the general dev items — before any test item is scored.

Every finished step (a fine-tuned model, a model's per-item scores on a split) is written atomically under `out/`
with the settings that made it and reused by a re-run with the same settings: a killed run continues where it
stopped.

    python -m adaptguard.experiments.talr_vs_sft --stage dev    # the registered learning-rate choice, dev only
    python -m adaptguard.experiments.talr_vs_sft --stage test   # every arm x lr x seed on test, then the report
    python -m adaptguard.experiments.talr_vs_sft --quick        # the mechanics in minutes
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from adaptguard.utils.files import atomic_write_text
from adaptguard.utils.quiet import hide_unused_library_noise
from adaptguard.utils.store import Store
from adaptguard.utils.sweeps import machine_line

from .common import export_records, score_tasks, seeded_order, store_model_name, task_rows, training_rows, verdict, write_report

ARMS = {"SFT": "none", "TALR": "talr", "DFT": "dft"}  # arm -> TALRConfig.weighting
GENERAL_TASKS = ("sports_understanding", "strategyqa", "implicatures", "navigate", "metaphor_boolean", "social_iqa")


@dataclass
class E2Config:
    out: str = field(default="e2-out", metadata={"help": "Output directory (reused by a re-run: resumes)."})
    model: str = field(default="built:smollm2", metadata={"help": "Base model: Hub id, path or built:<name> or embedded:<name>."})
    domain: str = field(default="bigbench:hyperbaton", metadata={
        "help": "The domain: bigbench:<task>, or a JSONL file of {input, choices, label} rows."})
    general_tasks: list[str] = field(default_factory=lambda: list(GENERAL_TASKS), metadata={
        "help": "General-ability tasks: BIG-bench task names or JSONL files of {input, choices, label} rows."})
    split_seed: int = field(default=29, metadata={"help": "random.Random(seed).shuffle of each task's items."})
    n_domain_dev: int = 200
    n_domain_test: int = 400
    train_sizes: list[int] = field(default_factory=lambda: [400, 800], metadata={
        "help": "Domain training rows, tried in order until a learning rate qualifies on dev (pre-registered)."})
    n_general_dev: int = field(default=50, metadata={"help": "Dev items per general task."})
    n_general_test: int = field(default=100, metadata={"help": "Test items per general task."})
    learning_rates: list[float] = field(default_factory=lambda: [1e-5, 3e-5, 1e-4], metadata={
        "help": "The grid; the dev rule keeps those where SFT learns the domain and forgets (smallest first)."})
    max_lrs: int = field(default=2, metadata={"help": "At most this many qualifying learning rates go to test."})
    min_nfr: float = field(default=0.05, metadata={"help": "SFT must flip this share of general dev items."})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Training seeds (data order)."})
    epochs: float = 1.0
    batch_size: int = 8
    max_length: int = 128
    eval_batch_size: int = 16
    half_width: float = field(default=0.05, metadata={
        "help": "A CI containing 0 narrower than ± this is 'not reproduced', wider 'inconclusive'."})
    domain_margin: float = field(default=0.05, metadata={
        "help": "H2: TALR's domain score may be at most this much below SFT's (CI lower bound)."})


def quick_config(out: str = "e2-quick") -> E2Config:
    return E2Config(out=out, n_domain_dev=40, n_domain_test=60, train_sizes=[40], n_general_dev=20,
                    n_general_test=30, general_tasks=list(GENERAL_TASKS[:2]), learning_rates=[1e-4], min_nfr=0.0,
                    seeds=[0])


def load_splits(cfg: E2Config) -> dict:
    """{"train": the domain's training pool, "dev"/"test": {"domain": rows, **{general task: rows}}}, each task
    in its seeded order: domain dev, then test, then the training pool; general dev, then test."""
    domain = seeded_order(task_rows(cfg.domain, "domain"), cfg.split_seed)
    need = cfg.n_domain_dev + cfg.n_domain_test + max(cfg.train_sizes)
    if len(domain) < need:
        raise ValueError(f"domain {cfg.domain}: {len(domain)} items, the splits need {need}")
    dev_end = cfg.n_domain_dev
    splits = {"train": domain[dev_end + cfg.n_domain_test:need], "dev": {"domain": domain[:dev_end]},
              "test": {"domain": domain[dev_end:dev_end + cfg.n_domain_test]}}
    return add_general_splits(cfg, splits)


def add_general_splits(cfg: E2Config, splits: dict) -> dict:
    """`splits` with each general task's dev and test rows added (the task's seeded order: dev, then test)."""
    for spec in cfg.general_tasks:
        name = Path(spec).stem if spec.endswith(".jsonl") else spec.removeprefix("bigbench:")
        if name == "domain" or name in splits["dev"]:
            raise ValueError(f"general_tasks: {spec!r} repeats a task name")
        rows = seeded_order(task_rows(spec, "general_tasks"), cfg.split_seed)
        if len(rows) < cfg.n_general_dev + cfg.n_general_test:
            raise ValueError(f"general_tasks: {spec} has {len(rows)} items, the splits need "
                             f"{cfg.n_general_dev + cfg.n_general_test}")
        splits["dev"][name] = rows[:cfg.n_general_dev]
        splits["test"][name] = rows[cfg.n_general_dev:cfg.n_general_dev + cfg.n_general_test]
    return splits


def fine_tune(cfg: E2Config, base_path: str, tokenizer, rows: list[dict], out: Path, arm: str, lr: float,
              seed: int) -> None:
    """Full fine-tuning of the base on prompt → right choice rows with `arm`'s token weighting; saved to `out`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, set_seed

    from adaptguard.talr.config import TALRConfig
    from adaptguard.talr.trainer import TALRTrainer
    from adaptguard.trl_adapter import no_activation_checkpointing
    from adaptguard.utils.progress import TrainingProgress

    set_seed(seed)
    args = TALRConfig(output_dir=str(out / "run"), weighting=ARMS[arm], per_device_train_batch_size=cfg.batch_size,
                      num_train_epochs=cfg.epochs, learning_rate=lr, lr_scheduler_type="constant",
                      max_length=cfg.max_length, seed=seed, report_to="none", save_strategy="no", logging_steps=10,
                      disable_tqdm=True, **no_activation_checkpointing(),
                      use_cpu=not torch.cuda.is_available())  # also turns off pinning, which a CPU run cannot use
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(base_path), args=args,
                          train_dataset=Dataset.from_list(training_rows(rows)), processing_class=tokenizer,
                          callbacks=[TrainingProgress(f"{arm} lr {lr:g} seed {seed}")])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_model(str(out))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


def flips_vs_base(base: dict[str, list[bool]], model: dict[str, list[bool]], tasks: list[str]) -> np.ndarray:
    """(negative, positive) flip indicators of the general items, the tasks' items concatenated: (2, N)."""
    old = np.concatenate([np.asarray(base[t], dtype=bool) for t in tasks])
    new = np.concatenate([np.asarray(model[t], dtype=bool) for t in tasks])
    return np.stack([old & ~new, ~old & new])


class E2:
    """The experiment's steps, each cached in the store (see the module docstring)."""

    def __init__(self, cfg: E2Config, say=print):
        from transformers import AutoTokenizer

        from adaptguard.models.embedded import resolve_model

        if not cfg.learning_rates or not all(lr > 0 for lr in cfg.learning_rates):
            raise ValueError(f"learning_rates must be positive numbers, got {cfg.learning_rates}")
        if not cfg.seeds or not cfg.train_sizes:
            raise ValueError(f"seeds ({cfg.seeds}) and train_sizes ({cfg.train_sizes}) must not be empty")
        self.cfg, self.say = cfg, say
        self.root = Path(cfg.out)
        self.store = Store(self.root)
        self.export_to: Path | None = None  # where `export()` copies the small records (the CLI's --export)
        self.base_path = resolve_model(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.base_path)
        self.splits = self.load_splits()
        self.general = [t for t in self.splits["dev"] if t != "domain"]
        self.common = {"model": store_model_name(cfg.model), "domain": cfg.domain, "general_tasks": cfg.general_tasks,
                       "split_seed": cfg.split_seed, "sizes": [cfg.n_domain_dev, cfg.n_domain_test,
                                                               cfg.n_general_dev, cfg.n_general_test]}

    def load_splits(self) -> dict:
        return load_splits(self.cfg)

    def _scores(self, name: str, settings: dict, split: str, model_fn) -> dict[str, list[bool]]:
        def make(tmp: Path):
            start = time.perf_counter()
            scores = score_tasks(model_fn(), self.tokenizer, self.splits[split], tmp / "tasks",
                                 self.cfg.eval_batch_size)
            (tmp / "scores.json").write_text(json.dumps(scores))
            self.say(f"E2: scored {name} on {split}: {time.perf_counter() - start:.0f} s")

        folder = self.store.get(f"scores/{split}/{name}", {**settings, "split": split}, make)
        return json.loads((folder / "scores.json").read_text())

    def base_scores(self, split: str) -> dict[str, list[bool]]:
        from transformers import AutoModelForCausalLM

        return self._scores("base", self.common, split,
                            lambda: AutoModelForCausalLM.from_pretrained(self.base_path).eval())

    def run_scores(self, arm: str, lr: float, seed: int, n_train: int, split: str) -> dict[str, list[bool]]:
        """Per-item scores on `split` of the base fine-tuned with `arm` at `lr`, `seed` on `n_train` domain rows."""
        from transformers import AutoModelForCausalLM

        settings = {**self.common, "arm": arm, "weighting": ARMS[arm], "lr": lr, "seed": seed, "n_train": n_train,
                    "epochs": self.cfg.epochs, "batch_size": self.cfg.batch_size, "max_length": self.cfg.max_length}
        name = f"{arm}_lr{lr:g}_seed{seed}_n{n_train}"

        def train(tmp: Path):
            start = time.perf_counter()
            fine_tune(self.cfg, self.base_path, self.tokenizer, self.splits["train"][:n_train], tmp, arm, lr, seed)
            (tmp / "train_seconds.json").write_text(json.dumps(time.perf_counter() - start))
            self.say(f"E2: trained {name}: {time.perf_counter() - start:.0f} s")

        model_dir = self.store.get(f"models/{name}", settings, train)
        return self._scores(name, settings, split, lambda: AutoModelForCausalLM.from_pretrained(model_dir).eval())

    # -- stages ------------------------------------------------------------------------------------------------
    def export(self) -> None:
        """Copy the small records (per-item scores, choices, timings) to `export_to`, if set: called after each
        finished step of a long stage too, so that a session stopped mid-stage leaves them to commit."""
        if self.export_to is not None:
            export_records(self.root, self.export_to)

    def qualification(self, base: dict, sft: dict) -> dict:
        """The registered dev test of one SFT model: it learns the domain (dev gain over the base, item-paired 95 %
        CI above 0) and forgets (general dev NFR against the base ≥ min_nfr)."""
        from adaptguard.compat.stats.metrics import paired_seeds_difference

        gain = paired_seeds_difference([sft["domain"]], [base["domain"]], n_boot=4000)
        negative, positive = flips_vs_base(base, sft, self.general)
        return {"domain_acc": float(np.mean(sft["domain"])), "domain_gain": gain["diff"], "domain_gain_ci": gain["ci"],
                "general_nfr": float(negative.mean()), "general_pfr": float(positive.mean()),
                "qualifies": bool(gain["ci"][0] > 0 and negative.mean() >= self.cfg.min_nfr)}

    def dev_stage(self) -> dict:
        """The registered choice, dev only: for the first training size where any learning rate qualifies, the
        qualifying rates (SFT, seed 0: domain dev accuracy above the base's, paired 95 % CI above 0, and general
        dev NFR vs the base ≥ min_nfr), smallest first, at most max_lrs. Writes `dev_choices.json`."""

        base = self.base_scores("dev")
        seed = self.cfg.seeds[0]
        choices = {"seed": seed, "sizes": {}}
        for n_train in self.cfg.train_sizes:
            seen = {}
            for lr in self.cfg.learning_rates:
                sft = self.run_scores("SFT", lr, seed, n_train, "dev")
                seen[f"{lr:g}"] = self.qualification(base, sft)
                self.say(f"E2: dev SFT lr {lr:g} n {n_train}: {seen[f'{lr:g}']}")
            choices["sizes"][str(n_train)] = seen
            chosen = [lr for lr in self.cfg.learning_rates if seen[f"{lr:g}"]["qualifies"]][:self.cfg.max_lrs]
            if chosen:
                choices.update(n_train=n_train, learning_rates=chosen)
                break
        else:
            choices.update(n_train=None, learning_rates=[])
        choices["base_dev"] = {"domain_acc": float(np.mean(base["domain"])),
                               "general_acc": float(np.mean(np.concatenate([base[t] for t in self.general])))}
        atomic_write_text(self.root / "dev_choices.json", json.dumps(choices, indent=2))
        return choices

    def run_test(self) -> dict:
        """Every arm x chosen lr x seed on test (after the dev choices), the report and the trade-off plot."""
        from adaptguard.utils.progress import progress_bar
        from adaptguard.utils.sweeps import machine_info

        choices = self.dev_stage()
        report = {"config": dataclasses.asdict(self.cfg), "machine": machine_info(), "dev_choices": choices}
        if not choices["learning_rates"]:
            report["verdict"] = ("no setting where SFT both learns the domain and forgets on dev: nothing to compare "
                                 "(the registered fallback)")
        else:
            base = self.base_scores("test")
            runs = {}
            with progress_bar(len(ARMS) * len(choices["learning_rates"]) * len(self.cfg.seeds), "E2 test runs",
                              unit="run") as bar:
                for lr in choices["learning_rates"]:
                    for arm in ARMS:
                        runs[arm, lr] = []
                        for seed in self.cfg.seeds:
                            runs[arm, lr].append(self.run_scores(arm, lr, seed, choices["n_train"], "test"))
                            bar.update()
            report.update(summarise(base, runs, self.general, self.cfg))
            report["train_seconds"] = {
                f"{arm}_lr{lr:g}": [json.loads((self.root / "models" / f"{arm}_lr{lr:g}_seed{s}_n{choices['n_train']}"
                                                / "train_seconds.json").read_text()) for s in self.cfg.seeds]
                for arm, lr in runs}
            plot(report, self.root / "tradeoff.png")
        write_report(self.root, report, markdown(report))
        return report


def summarise(base: dict[str, list[bool]], runs: dict[tuple[str, float], list[dict[str, list[bool]]]],
              general: list[str], cfg: E2Config) -> dict:
    """Per arm and lr: domain / general accuracy (mean over seeds, bootstrap CI over items with their seeds), general
    NFR / PFR vs the base; per lr, TALR − SFT and DFT − SFT item-paired differences with CIs and per-seed McNemar,
    and the registered verdicts (H1: general NFR; H2: the trade-off)."""
    from adaptguard.compat.stats.metrics import bootstrap_mean_ci, paired_seeds_difference

    def correct(seeds, task=None):  # (S, N) correctness on the domain or on the general items concatenated
        tasks = [task] if task else general
        return np.array([np.concatenate([np.asarray(s[t], dtype=bool) for t in tasks]) for s in seeds])

    base_general = correct([base]).mean()
    out = {"base": {"domain_acc": float(np.mean(base["domain"])), "general_acc": float(base_general),
                    "general_tasks": {t: float(np.mean(base[t])) for t in general}},
           "arms": [], "comparisons": []}
    for (arm, lr), seeds in runs.items():
        dom, gen = correct(seeds, "domain"), correct(seeds)
        flips = np.array([flips_vs_base(base, s, general) for s in seeds])  # (S, 2, N)
        out["arms"].append({
            "arm": arm, "lr": lr, "domain_acc": float(dom.mean()), "domain_ci": bootstrap_mean_ci(dom.mean(0)),
            "general_acc": float(gen.mean()), "general_ci": bootstrap_mean_ci(gen.mean(0)),
            "general_nfr": float(flips[:, 0].mean()), "general_nfr_ci": bootstrap_mean_ci(flips[:, 0].mean(0)),
            "general_pfr": float(flips[:, 1].mean()),
            "per_seed": [{"domain_acc": float(d.mean()), "general_acc": float(g.mean()), "general_nfr": float(f[0].mean())}
                         for d, g, f in zip(dom, gen, flips)],
            "general_tasks": {t: float(correct(seeds, t).mean()) for t in general}})
    for lr in sorted({lr for _, lr in runs}):
        sft = runs["SFT", lr]
        for arm in (a for a in ARMS if a != "SFT" and (a, lr) in runs):
            seeds = runs[arm, lr]
            nfr_a = np.array([flips_vs_base(base, s, general)[0] for s in seeds])
            nfr_s = np.array([flips_vs_base(base, s, general)[0] for s in sft])
            d_nfr = paired_seeds_difference(nfr_a, nfr_s, n_boot=4000)
            d_dom = paired_seeds_difference(correct(seeds, "domain"), correct(sft, "domain"), n_boot=4000)
            d_gen = paired_seeds_difference(correct(seeds), correct(sft), n_boot=4000)
            h1 = verdict(*d_nfr["ci"], half_width=cfg.half_width)
            out["comparisons"].append({
                "arm": arm, "vs": "SFT", "lr": lr, "general_nfr": d_nfr, "domain_acc": d_dom, "general_acc": d_gen,
                "h1_less_forgetting": h1, "h2_better_tradeoff": tradeoff_verdict(h1, d_dom["ci"], cfg.domain_margin)})
    return out


def tradeoff_verdict(h1: str, domain_ci: tuple[float, float], margin: float) -> str:
    """H2 (registered): a better trade-off = fewer general flips (H1 reproduced) without losing more than `margin`
    of domain accuracy (the CI of the domain difference stays above −margin)."""
    if h1 == "reproduced" and domain_ci[0] >= -margin:
        return "reproduced"
    if h1 in ("not reproduced", "contradicted") or domain_ci[1] < -margin:
        return "not reproduced"
    return "inconclusive"


def plot(report: dict, path: Path, title: str | None = None) -> None:
    """Domain vs general accuracy of every arm x lr (95 % bootstrap CIs as bars) and the base model."""
    from adaptguard.demo.tradeoff import tradeoff_plot

    runs = [{"method": r["arm"], "learning_rate": r["lr"], "domain": r["domain_acc"], "general": r["general_acc"],
             "domain_bar": r["domain_ci"], "general_bar": r["general_ci"]} for r in report["arms"]]
    base = {"domain": report["base"]["domain_acc"], "general": report["base"]["general_acc"]}
    tradeoff_plot(base, runs, path, title=title or f"E2: TALR vs SFT vs DFT, full fine-tuning of {report['config']['model']}",
                  xlabel="domain accuracy (held-out test items)", ylabel="general accuracy (held-out BIG-bench items)",
                  bar_note="bars: 95 % bootstrap CI (items, seeds together)")


def markdown(report: dict) -> str:
    """E2's report as Markdown: the dev choice, every arm x lr with CIs, and the paired comparisons with verdicts."""
    cfg, dev = report["config"], report["dev_choices"]
    lines = [f"# E2: TALR vs SFT vs DFT on {cfg['model']} (domain {cfg['domain']})", "",
             f"Dev choice: {dev.get('n_train')} training rows, learning rates {dev.get('learning_rates')}; seeds "
             f"{cfg['seeds']}. Test: {cfg['n_domain_test']} domain items; {cfg['n_general_test']} items of each of "
             f"{', '.join(cfg['general_tasks'])} (general, flips against the base model).", ""]
    if "verdict" in report:
        return "\n".join([*lines, report["verdict"], "", machine_line(report["machine"])]) + "\n"
    return "\n".join(lines + markdown_tables(report)) + "\n"


def markdown_tables(report: dict) -> list[str]:
    """The report's tables (every arm x lr with CIs; the paired comparisons with verdicts), the figure, the machine."""
    base = report["base"]
    lines = [f"Base model: domain {base['domain_acc']:.3f}, general {base['general_acc']:.3f}.", "",
              "| lr | arm | domain acc (95 % CI) | general acc (95 % CI) | general NFR (95 % CI) | general PFR |",
              "|---|---|---|---|---|---|"]
    ci = "{:.3f} ({:.3f}–{:.3f})".format
    for r in report["arms"]:
        lines.append(f"| {r['lr']:g} | {r['arm']} | {ci(r['domain_acc'], *r['domain_ci'])} | "
                     f"{ci(r['general_acc'], *r['general_ci'])} | {ci(r['general_nfr'], *r['general_nfr_ci'])} | "
                     f"{r['general_pfr']:.3f} |")
    lines += ["", "Paired differences against SFT at the same learning rate (mean over seeds; 95 % bootstrap CI over "
              "items, an item's seeds together; exact McNemar p per seed on the general NFR's discordant items):", "",
              "| lr | arm − SFT | Δ general NFR (CI) | McNemar p | Δ domain acc (CI) | Δ general acc (CI) | H1 | H2 |",
              "|---|---|---|---|---|---|---|---|"]
    diff = "{:+.3f} ({:+.3f} to {:+.3f})".format
    for c in report["comparisons"]:
        p = ", ".join(f"{s['mcnemar_p']:.2g}" for s in c["general_nfr"]["per_seed"])
        lines.append(f"| {c['lr']:g} | {c['arm']} | {diff(c['general_nfr']['diff'], *c['general_nfr']['ci'])} | {p} | "
                     f"{diff(c['domain_acc']['diff'], *c['domain_acc']['ci'])} | "
                     f"{diff(c['general_acc']['diff'], *c['general_acc']['ci'])} | {c['h1_less_forgetting']} | "
                     f"{c['h2_better_tradeoff']} |")
    return lines + ["", "![trade-off](tradeoff.png)", "", machine_line(report["machine"])]


def main(argv: list[str] | None = None, config_class=E2Config, quick=quick_config, study=None) -> dict:
    """The study's command line (E2's; E4 passes its own config, quick config and study class)."""
    from transformers import HfArgumentParser

    @dataclass
    class Cli:
        stage: str = field(default="test", metadata={"help": "dev: the registered choice; test: the whole run."})
        quick: bool = field(default=False, metadata={"help": "Tiny splits, one lr, one seed: the mechanics."})
        export: str = field(default="", metadata={
            "help": "After the stage, copy the small records (per-item scores, choices, timings) here, to commit; "
                    "copying them back into --out resumes without rescoring."})

    hide_unused_library_noise()
    cli, cfg = HfArgumentParser((Cli, config_class)).parse_args_into_dataclasses(argv)
    default_out = config_class().out
    if cli.quick:
        cfg = dataclasses.replace(quick(cfg.out if cfg.out != default_out else default_out.replace("-out", "-quick")),
                                  model=cfg.model)
    if cli.stage not in ("dev", "test"):
        raise ValueError(f"--stage must be dev or test, got {cli.stage!r}")
    runner = (study or E2)(cfg)
    runner.export_to = Path(cli.export) if cli.export else None
    result = runner.dev_stage() if cli.stage == "dev" else runner.run_test()
    runner.export()
    return result


if __name__ == "__main__":
    main()
