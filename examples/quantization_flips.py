"""Does quantizing a model flip its answers even where accuracy holds? (issue 14, experiment 5)

A model update users make every day: the same checkpoint served in lower precision. This script evaluates a model
in fp32, after torch's int8 dynamic quantization of its decoder's linear layers (CPU), and in bf16, on BIG-bench
multiple-choice tasks through lm-eval (zero-shot, log-likelihood of each choice), and compares each variant
against fp32 with adaptguard's flip metrics (paper 002 §3: NFR, PFR, BTC, McNemar p, a 95% bootstrap CI of NFR).

    python examples/quantization_flips.py                      # built:smollm2, 6 tasks x 100 items, int8
    python examples/quantization_flips.py --quick              # 3 tasks x 40 items, int8 (11 min on 2 busy cores)
    python examples/quantization_flips.py --variants int8,bf16 # bf16 too (about 4x slower than fp32 on most CPUs)
    python examples/quantization_flips.py --model Qwen/Qwen2.5-0.5B-Instruct --variants bf16 --limit 1000   # on a GPU

Writes OUT/report.json, OUT/report.md and OUT/flips.png (one quadrant panel per task and variant), each variant's
lm-eval samples as a `--log_samples` run under OUT/runs/<variant>/ (the fp32 reference in OUT/runs/reference/, so
`adaptguard compare OUT/runs/reference OUT/runs/int8` works on them), and OUT/report_<variant>.html: the page of
what that variant broke, item by item.
Data: BIG-bench (Apache-2.0), read from the PyPI sdist bigbench==1.0.0 (downloaded once, sha256-checked).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from adaptguard.compat.callback import evaluate_with_lm_eval, task_runs_from_output
from adaptguard.compat.compare import compare_runs, compare_task
from adaptguard.compat.flips import flipped_documents
from adaptguard.compat.report import plot_quadrants, write_outputs
from adaptguard.data.bigbench import DEFAULT_TASKS, load_tasks, write_lm_eval_tasks
from adaptguard.models.embedded import resolve_model
from adaptguard.utils.sweeps import command_line, machine_info, machine_line, write_report


@dataclass
class Args:
    model: str = field(default="built:smollm2", metadata={"help": "Hub id, local path, built:<name> or embedded:<name>."})
    tasks: str = field(default=",".join(DEFAULT_TASKS), metadata={"help": "BIG-bench multiple-choice tasks."})
    # the defaults fit the 60-min budget on 2 CPU cores, where fp32 and int8 take 1-3 s per item and bf16 ~10 s
    limit: int = field(default=100, metadata={"help": "Items per task (the first ones, file order)."})
    variants: str = field(default="int8", metadata={"help": "Compared with fp32, comma-separated: int8 (torch "
                                                          "dynamic int8 quantization of nn.Linear, CPU only), bf16, "
                                                          "fp32 (a rerun: checks that nothing flips)."})
    batch_size: int = field(default=16, metadata={"help": "lm-eval batch size."})
    out: str = field(default="quantization-flips-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": "3 tasks x 40 items, int8 only (bf16 matmuls are slow on "
                                                         "most CPUs): a smoke run."})


VARIANTS = ("int8", "bf16", "fp32")  # fp32: a second fp32 run, which must flip nothing (lm-eval scores are deterministic)


def load_variant(path: str, variant: str):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if variant == "bf16" else torch.float32)
    if variant == "int8":
        # the decoder's linear layers: weights int8 per tensor, activations quantized on the fly. The LM head stays
        # fp32, as usual (it is tied to the embeddings here, and lm-eval re-ties the weights)
        torch.ao.quantization.quantize_dynamic(model.base_model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    elif variant not in VARIANTS:
        raise ValueError(f"--variants: unknown variant {variant!r}; use {', '.join(VARIANTS)}")
    return model.eval()


def main(args: Args) -> dict:
    variants = ["int8"] if args.quick else args.variants.split(",")
    for variant in variants:  # fail before any output or the long reference run
        if variant not in VARIANTS:
            raise ValueError(f"--variants: unknown variant {variant!r}; use {', '.join(VARIANTS)}")
    names = args.tasks.split(",")[:3] if args.quick else args.tasks.split(",")
    limit = 40 if args.quick else args.limit
    out = Path(args.out)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = write_lm_eval_tasks(load_tasks(names), out / "tasks", limit=limit)
    runs, seconds = [], {}
    for i, variant in enumerate(["fp32", *variants]):  # runs[0] is the reference; a listed fp32 is a second run
        start = time.perf_counter()
        output = evaluate_with_lm_eval(load_variant(path, variant), tokenizer, tasks, batch_size=args.batch_size,
                                       include_path=[out / "tasks"])
        runs.append(task_runs_from_output(output))
        save_run(output, out / "runs" / (variant if i else "reference"))
        seconds[variant if i else "fp32 (reference)"] = time.perf_counter() - start
        print(f"{variant}: " + ", ".join(f"{t} {output['results'][t]['acc,none']:.3f}" for t in tasks), flush=True)
    report = {"model": args.model, "limit": limit, "tasks": {}, "seconds": seconds, "machine": machine_info(),
              "command": command_line("examples/quantization_flips.py", args)}
    quadrants = {"old": "fp32", "new": "variant", "tasks": {}}
    for variant, variant_runs in zip(variants, runs[1:]):
        for task in tasks:
            (entry,) = compare_task(runs[0][task], variant_runs[task]).values()
            quadrants["tasks"][f"{task}: fp32 → {variant}"] = entry
            report["tasks"][f"{task} {variant}"] = {k: v for k, v in entry.items() if not k.startswith("_")}
    out.mkdir(parents=True, exist_ok=True)
    plot_quadrants(quadrants, out / "flips.png")
    write_report(out, report, markdown(report))
    for variant in variants:  # the page of each variant, from the saved runs as `adaptguard compare --html` makes it
        compared = compare_runs(out / "runs" / "reference", out / "runs" / variant)
        flips = [{"task": t, **f} for t, e in compared["tasks"].items() for f in flipped_documents(e)]
        write_outputs(compared, html_path=out / f"report_{variant}.html", flips=flips)
    return report


def save_run(output: dict, folder: Path) -> None:
    """lm-eval's in-memory samples and task configs as the files `lm_eval --log_samples --output_path` writes."""
    import json

    from lm_eval.utils import handle_non_serializable, sanitize_list

    from adaptguard.utils.files import atomic_write_text

    def as_logged(r: dict) -> dict:  # what lm-eval's EvaluationTracker.save_results_samples writes of a sample
        return {**r, "arguments": {f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(args)}
                                   for i, args in enumerate(r["arguments"])},
                "resps": sanitize_list(r["resps"]), "filtered_resps": sanitize_list(r["filtered_resps"]),
                "target": str(r["target"])}

    stamp = "2026-01-01T00-00-00.000000"
    for task, records in output["samples"].items():
        atomic_write_text(folder / f"samples_{task}_{stamp}.jsonl", "".join(
            json.dumps(as_logged(r), default=handle_non_serializable, ensure_ascii=False) + "\n" for r in records))
    atomic_write_text(folder / f"results_{stamp}.json", json.dumps(
        {"configs": output.get("configs", {}), "n-shot": output.get("n-shot", {})}, default=handle_non_serializable))


def markdown(report: dict) -> str:
    lines = [f"# Flips from quantization: {report['model']}", "",
             f"fp32 vs each variant on BIG-bench multiple-choice tasks (zero-shot, first {report['limit']} items "
             "each; lm-eval log-likelihood of each choice). NFR/PFR: share of items fp32 got right and the variant "
             "wrong / the reverse; BTC: share of fp32's right answers kept; p: McNemar's exact test.", "",
             "| task | variant | n | fp32 acc | variant acc | NFR (95% CI) | PFR | BTC | McNemar p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, e in report["tasks"].items():
        task, variant = key.rsplit(" ", 1)
        lo, hi = e["nfr_ci"]
        btc = "–" if e["btc"] is None else f"{e['btc']:.3f}"  # undefined where fp32 got nothing right
        lines.append(f"| {task} | {variant} | {e['n']} | {e['old_acc']:.3f} | {e['new_acc']:.3f} | "
                     f"{e['nfr']:.3f} ({lo:.3f}–{hi:.3f}) | {e['pfr']:.3f} | {btc} | {e['mcnemar_p']:.3g} |")
    lines += ["", "![flips](flips.png)", "",
              f"Reproduce: `{report['command']}`. Time per variant: "
              + ", ".join(f"{v} {s:.0f} s" for v, s in report["seconds"].items()) + ". " + machine_line(report["machine"]),
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
