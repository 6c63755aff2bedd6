"""`adaptguard demo`: the domain-vs-general trade-off of Lin et al. (Fig. 1–2) on the embedded default.

Fine-tunes the embedded "tiny" model on a domain (its own knowledge in a question/answer format it
never saw) with plain SFT, TALR and the baselines over a grid of learning rates, and measures the
domain score (held-out questions) and the general score (the pretraining skills: facts, antonyms,
counting). Writes `report.json`, `report.md`, `tradeoff.png` and the TALR token analysis.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.files import atomic_write_text
from ..utils.lora import default_lora_targets
from ..utils.progress import progress_bar, say
from .report import markdown_report
from .tradeoff import tradeoff_plot

logger = logging.getLogger(__name__)


@dataclass
class Method:
    name: str
    config: dict = field(default_factory=dict)
    lora: bool = False
    evaluate_subdir: str | None = None  # evaluate a checkpoint the method writes (Wise-FT)


METHODS = {
    "SFT": Method("SFT", {"weighting": "none"}),
    "TALR": Method("TALR", {"weighting": "talr"}),
    "L2": Method("L2", {"weighting": "none", "l2_lambda": 0.01}),
    "KL": Method("KL", {"weighting": "none", "kl_beta": 0.001}),
    "FLOW": Method("FLOW", {"weighting": "none", "flow": True}),
    "Wise-FT": Method("Wise-FT", {"weighting": "none", "wise_ft_alpha": 0.5}, evaluate_subdir="wise-ft"),
    "LoRA": Method("LoRA", {"weighting": "none"}, lora=True),
}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def general_scores(model, tokenizer, probes) -> dict:
    """Exact match per skill, their mean (`general`), and the per-probe flags (`_flags`, for flips)."""
    from ..models.embedded import exact_match_flags

    flags = exact_match_flags(model, tokenizer, probes)
    skills = sorted({p["skill"] for p in probes})
    scores = {s: _mean(f for f, p in zip(flags, probes) if p["skill"] == s) for s in skills}
    scores["general"] = sum(scores[s] for s in skills) / len(skills)
    scores["_flags"] = flags
    return scores


def train_method(method: Method, lr: float, seed: int, path: str | Path, train_rows: list[dict], work: Path,
                 epochs: float, token_analysis: bool, **overrides):
    """Fine-tune the model at `path` on prompt/completion `train_rows` with `method` (TALRTrainer, CPU, fp32 unless
    `overrides` — more TALRConfig fields — say otherwise). Returns (trained model, tokenizer, train seconds,
    last logged train loss)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from ..talr.config import TALRConfig
    from ..talr.trainer import TALRTrainer
    from ..trl_adapter import no_activation_checkpointing

    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    args = TALRConfig(**{
        "output_dir": str(work), "bf16": False, **no_activation_checkpointing(), "use_cpu": True, "report_to": "none",
        "save_strategy": "no", "per_device_train_batch_size": 16, "num_train_epochs": epochs, "learning_rate": lr,
        "lr_scheduler_type": "constant", "logging_steps": 4, "disable_tqdm": True, "seed": seed,
        "token_analysis": token_analysis, "token_analysis_examples": list(range(8)), **method.config, **overrides})
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=default_lora_targets(model), task_type="CAUSAL_LM") \
        if method.lora else None
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(train_rows),
                          processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)  # the demo prints its own one line per run
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trained = trainer.model
    if method.evaluate_subdir:
        subdir = work / method.evaluate_subdir
        trained = AutoModelForCausalLM.from_pretrained(subdir)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return trained, tok, seconds, logs[-1]["loss"] if logs else None


def _tradeoff(methods: list[str], lrs: list[float], epochs: float, seeds: list[int], train_rows: list[dict],
              test_rows: list[dict], probes: list[dict], base_flags: list, out: Path) -> tuple[list[dict], dict | None]:
    """The trade-off sweep (Lin et al. Fig. 1-2): every method x learning rate, over `seeds`, scored against the base
    model's probe flags. Returns (runs, the TALR token analysis) and copies the analysis to OUT/token_analysis/."""
    from ..compat.stats.metrics import flip_metrics
    from ..models.embedded import embedded_model_path, exact_match_score
    from ..utils.sweeps import spread

    path = embedded_model_path("tiny")
    talr_analysis_lr = lrs[len(lrs) // 2]
    runs, token_analysis = [], None
    with tempfile.TemporaryDirectory(prefix="adaptguard-demo-") as work_root, \
            progress_bar(len(methods) * len(lrs) * len(seeds), "trade-off: fine-tuning runs", unit="run") as bar:
        for name in methods:
            for lr in lrs:
                per_seed = []
                for seed in seeds:
                    work = Path(work_root) / f"{name}-{lr:g}-{seed}"
                    analyse = name == "TALR" and lr == talr_analysis_lr and seed == seeds[0]
                    trained, tok, seconds, loss = train_method(METHODS[name], lr, seed, path, train_rows, work,
                                                             epochs, analyse)
                    bar.update()
                    skills = general_scores(trained, tok, probes)
                    flips = flip_metrics(base_flags, skills.pop("_flags"))
                    per_seed.append({"seed": seed, "domain": exact_match_score(trained, tok, test_rows),
                                     "general": skills["general"], "skills": skills, "final_train_loss": loss,
                                     "train_seconds": seconds,
                                     "general_flips": {k: flips[k] for k in ("nfr", "pfr", "btc", "mcnemar_p")}})
                    if analyse:
                        target = out / "token_analysis"
                        shutil.rmtree(target, ignore_errors=True)
                        shutil.copytree(work / "token_analysis", target)
                        token_analysis = {"learning_rate": lr,
                                          **json.loads((target / "token_analysis.json").read_text())}
                run = {"method": name, "learning_rate": lr, "config": METHODS[name].config, "lora": METHODS[name].lora,
                       "domain": _mean(r["domain"] for r in per_seed),
                       "general": _mean(r["general"] for r in per_seed),
                       "domain_spread": spread([r["domain"] for r in per_seed]),
                       "general_spread": spread([r["general"] for r in per_seed]),
                       "skills": {k: _mean(r["skills"][k] for r in per_seed) for k in per_seed[0]["skills"]},
                       "general_nfr": _mean(r["general_flips"]["nfr"] for r in per_seed),
                       "general_pfr": _mean(r["general_flips"]["pfr"] for r in per_seed),
                       "final_train_loss": _mean(r["final_train_loss"] for r in per_seed),
                       "train_seconds": _mean(r["train_seconds"] for r in per_seed), "seeds": per_seed}
                say(f"  {name:8s} lr={lr:<7g} domain={run['domain']:.3f} general={run['general']:.3f}")
                runs.append(run)
    return runs, token_analysis


def _update(out: Path, seed_range: list[int] | None) -> dict:
    """Echterhoff et al.'s update experiment on tiny -> tiny-v2 (MUSCLE), written to OUT/update/."""
    from ..update import run_update, run_update_seeds, tiny_preset

    say("  model update tiny -> tiny-v2 (MUSCLE) ...")
    if seed_range and len(seed_range) > 1:
        update = run_update_seeds(lambda s: tiny_preset(split_seed=s, seed=s), seed_range, out / "update")
        say(f"  update: NFR_c < NFR on {update['nfr_compat_below_nfr']} of {len(seed_range)} seeds")
    else:
        update = run_update(tiny_preset(str(out / "update")))
        say(f"  update: NFR v1->v2 {update['nfr']:.3f}, v1->v2+compat {update['nfr_compat']:.3f}")
    return update


def _composition(out: Path, seed_range: list[int] | None) -> dict:
    """Xu's thesis Ch. 4's compositional in-context learning, written to OUT/composition/."""
    from .composition import run_composition_demo, run_composition_seeds

    say("  compositional in-context learning ...")
    if seed_range and len(seed_range) > 1:
        return run_composition_seeds(out / "composition", seeds=seed_range)
    composition = run_composition_demo(out / "composition")
    composition.pop("predictions", None)  # kept in composition/composition.json
    return composition


def _drift(out: Path, repetitions: int | None = None, **overrides) -> dict:
    """Ni et al. App. B's quick similarity-drift sweep, written to OUT/drift/ (`overrides`: more settings of
    `run_drift_experiment`), with the peak of the bound at the CLI defaults of `adaptguard drift bound`."""
    from ..drift.sweep import run_drift_experiment
    from ..drift.theory import theorem_a2_argmax

    say("  similarity drift sweep (quick) ...")
    drift = run_drift_experiment(out / "drift", quick=True, **overrides,
                                 **({"repetitions": repetitions} if repetitions else {}))
    # App. B's sizes; lambda, mu free
    drift["bound_argmax"] = theorem_a2_argmax(n=116384, d=64, alpha_i=0.1408, alpha_j=0.8592, delta=0.2,
                                              k_mis=1.0, lambda_l=0.5, mu_l=0.09)
    say(f"  drift: highest loss at r = {drift['peak_r']:.3f}")
    return drift


def _timed_section(section, *args) -> tuple[object, float]:
    """(`section(*args)`, its seconds), on one thread: the embedded models are too small to gain from two, so each
    section takes one core."""
    from ..utils.progress import relay_done
    from ..utils.threads import torch_threads

    start = time.perf_counter()
    try:
        with torch_threads(1):
            return section(*args), time.perf_counter() - start
    finally:
        relay_done()


def run_sections(sections: dict[str, tuple], workers: int) -> tuple[dict[str, object], dict[str, float]]:
    """Run `sections` ({name: (function, *args)}, longest first) in `workers` worker processes, one section on one
    core each; their bars and lines are drawn here. Returns ({name: result}, {name: seconds}). A section's results
    are those of a run in this process on one thread (spawned workers: a forked one would inherit this process's
    torch thread pools)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ..utils.progress import draw_relayed
    from .worker import start

    ctx = multiprocessing.get_context("spawn")
    channel = ctx.Queue()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=start, initargs=(channel,)) as pool:
        futures = {name: pool.submit(_timed_section, *section) for name, section in sections.items()}
        draw_relayed(channel, len(futures), lambda: not all(f.done() for f in futures.values()))
        done = {name: future.result() for name, future in futures.items()}
    return {name: result for name, (result, _) in done.items()}, {name: s for name, (_, s) in done.items()}


def run_demo(out_dir: str | Path = "demo-out", quick: bool = False, seeds: int | None = None) -> dict:
    """Run the trade-off sweep and write the report into `out_dir`; returns the report dict.

    `seeds`: run every section over seeds 0 … seeds−1 and report mean and min–max (default: the trade-off
    over 2 seeds, 1 with `quick`, and one run of each other section)."""
    import datasets
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.embedded import (
        EMBEDDED_MODELS,
        domain_split,
        embedded_model_path,
        exact_match_score,
        general_probes,
    )
    from ..utils.sweeps import machine_info, seed_list

    seed_range = None if seeds is None else seed_list(seeds)

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = embedded_model_path("tiny")
    spec = EMBEDDED_MODELS["tiny"]
    train_rows, test_rows = domain_split(spec)
    probes = general_probes(spec)
    if quick:
        methods, lrs, epochs, seeds = ["SFT", "TALR"], [1e-4, 1e-3], 2, seed_range or [0]
    else:
        methods, lrs, epochs, seeds = list(METHODS), [1e-4, 3e-4, 1e-3, 3e-3], 4, seed_range or [0, 1]

    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    base_skills = general_scores(model, tok, probes)
    base_flags = base_skills.pop("_flags")
    base = {"domain": exact_match_score(model, tok, test_rows), "general": base_skills["general"],
            "skills": base_skills}
    stage_seconds = {"load_and_score_base": time.perf_counter() - start}
    tradeoff_args = (methods, lrs, epochs, seeds, train_rows, test_rows, probes, base_flags, out)
    if quick:  # the trade-off alone, here
        workers = 1
        runs, token_analysis = _tradeoff(*tradeoff_args)
        update = drift = composition = None
        stage_seconds["tradeoff"] = time.perf_counter() - start - stage_seconds["load_and_score_base"]
    else:
        # the sections side by side, one core each, longest first (composition, trade-off, drift, update: about
        # 105, 90, 75 and 20 s on one core), so that two cores finish them in about the time of the two longest
        sections = {"composition": (_composition, out, seed_range), "tradeoff": (_tradeoff, *tradeoff_args),
                    "drift": (_drift, out, len(seed_range) if seed_range else None), "update": (_update, out, seed_range)}
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = max(1, min(len(sections), cores))
        results, seconds = run_sections(sections, workers)
        (runs, token_analysis), update = results["tradeoff"], results["update"]
        drift, composition = results["drift"], results["composition"]
        stage_seconds.update(seconds)
    command = ("adaptguard demo" + (" --quick" if quick else "") + (f" --seeds {len(seed_range)}" if seed_range else "")
               + f" --out {out_dir}")
    report = {
        "settings": {"model": "embedded:tiny", "methods": methods, "learning_rates": lrs, "epochs": epochs,
                     "seeds": seeds,
                     "train_rows": len(train_rows), "test_rows": len(test_rows), "general_probes": len(probes),
                     "skills": sorted({p["skill"] for p in probes}), "quick": quick, "command": command},
        "base": base, "runs": runs, "token_analysis": token_analysis, "update": update, "drift": drift,
        "composition": composition, "machine": machine_info(),
        "seconds": time.perf_counter() - start, "stage_seconds": stage_seconds, "parallel_sections": workers,
    }
    tradeoff_plot(base, runs, out / "tradeoff.png")
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    atomic_write_text(out / "report.md", markdown_report(report))
    return report
