"""The real run of `adaptguard evaluate` again (issue 97): SmolLM2-135M after torch's dynamic int8 quantization
against its fp32 self, through lm-eval, on tasks whose data any machine has — the simple tasks of the repository's
own `compose_logic` generator (Xu et al.'s capitalization, swap, past tense, ...; 10 demonstrations, greedy
generation, exact match), 200 items each — then `compare` of the full int8 run against the fp32 run.

Pre-registered (before any run; committed with this script):
- Tasks: the eight simple tasks A–H of compose_logic (`compose_logic_ab_simple1`, ...), `n_test` 200, seed 0.
  Kept: those where the fp32 model's exact match on all 200 items is ≥ 40 % (chance is about 0 for an open answer:
  "well above chance"), chosen from the fp32 run alone, before any int8 answer is seen.
- Arms: fp32 full run (the baseline, as lm-eval's CLI writes it); int8 `evaluate` (group design, `--chunk 25`,
  α 5 %) with `nfr>2%`, `nfr>5%`, `acc_drop>1%`; int8 full run; `compare` of the full runs with the same thresholds.
- Reported: items used and wall time of `evaluate` against the int8 full run (same model object, batch size 16,
  alone on the machine's cores), and each decision of `evaluate` against `compare` on the full runs. The claim
  checked: `evaluate` never takes the opposite decision of the full runs' `compare`, and decides where it decides
  (its last look is the fixed-n test on all items).

    python studies/evaluate_int8_compose.py --out studies/results/evaluate_int8_compose    # ~25 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = ("compose_logic_ab_simple1", "compose_logic_ab_simple2", "compose_logic_ac_simple2",
          "compose_logic_bd_simple2", "compose_logic_be_simple2", "compose_logic_af_simple2",
          "compose_logic_gh_simple1", "compose_logic_gh_simple2")  # A, B, C, D, E, F, G, H
METRIC = "exact_match"


def full_run(lm, names: list[str], manager, folder: Path, label: str) -> tuple[dict, float]:
    """An lm-eval run of `names` with every sample logged, written by lm-eval's own `EvaluationTracker` as its CLI
    writes it; returns (results, seconds of the evaluation alone)."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    start = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=names, task_manager=manager, log_samples=True, bootstrap_iters=0,
                              verbosity="ERROR")
    seconds = time.perf_counter() - start
    tracker = EvaluationTracker(output_path=str(folder))
    tracker.general_config_tracker.model_name_sanitized = label
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in names:
        tracker.save_results_samples(task_name=task, samples=samples[task])
    return results, seconds


def per_item(folder: Path) -> dict[str, dict[int, float]]:
    """{task: {doc_id: exact match}} of a run folder's samples."""
    out = {}
    for path in sorted(Path(folder).rglob("samples_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        task = path.name[len("samples_"):].rsplit("_", 1)[0]
        out[task] = {int(r["doc_id"]): float(r[METRIC]) for r in rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="evaluate-int8-compose", help="output folder")
    parser.add_argument("--n-test", type=int, default=200, help="items per task")
    parser.add_argument("--keep-above", type=float, default=0.40, help="fp32 exact match a task must reach")
    parser.add_argument("--fail-on", default="nfr>2%,nfr>5%,acc_drop>1%", help="thresholds, comma-separated")
    parser.add_argument("--chunk", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    from adaptguard.utils.quiet import hide_unused_library_noise

    hide_unused_library_noise()
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.compat.compare import compare_runs
    from adaptguard.compat.gate import Threshold, check_gate
    from adaptguard.compat.harness.until_decided import evaluate_until_decided
    from adaptguard.models.embedded import resolve_model
    from adaptguard.utils.sweeps import machine_info

    out = Path(args.out)
    work = out / "work"  # the run folders: regenerated, not committed
    shutil.rmtree(work, ignore_errors=True)
    manager = TaskManager(include_path=str(ROOT / "lm_eval_tasks" / "compose_logic"), include_defaults=False,
                          metadata={"n_test": args.n_test, "seed": 0})
    path = resolve_model("built:smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    thresholds = [Threshold.parse(x) for x in args.fail_on.split(",")]
    load = {"start": os.getloadavg()}

    fp32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    results, fp32_seconds = full_run(HFLM(pretrained=fp32, tokenizer=tokenizer, batch_size=args.batch_size),
                                     list(SIMPLE), manager, work / "fp32", "fp32")
    accuracy = {t: results["results"][t][f"{METRIC},none"] for t in SIMPLE}
    kept = [t for t in SIMPLE if accuracy[t] >= args.keep_above]
    print("fp32 exact match: " + ", ".join(f"{t} {100 * a:.1f}%" for t, a in accuracy.items()) + f"; kept {kept}")
    load["fp32"] = os.getloadavg()

    int8 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.ao.quantization.quantize_dynamic(int8.base_model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    lm = HFLM(pretrained=int8, tokenizer=tokenizer, batch_size=args.batch_size)
    (baseline,) = {p.parent for p in (work / "fp32").rglob("results_*.json")}
    start = time.perf_counter()
    gate = evaluate_until_decided(baseline, work / "until_decided", lm, thresholds, tasks=kept, chunk=args.chunk,
                                  task_manager=manager)
    until = time.perf_counter() - start
    load["until_decided"] = os.getloadavg()
    _, full = full_run(lm, kept, manager, work / "int8", "int8")
    load["int8_full"] = os.getloadavg()
    (int8_run,) = {p.parent for p in (work / "int8").rglob("results_*.json")}
    full_gate = check_gate(compare_runs(baseline, int8_run, alpha=0.05, tasks=",".join(kept)), thresholds, 0.05)

    record = json.loads((work / "until_decided" / "sequential.json").read_text())
    full_decision = {(d.task, d.expr): d.decision.value for d in full_gate.decisions}
    rows = []
    for d in gate.decisions:
        r = record["tasks"][d.task]
        rows.append({"task": d.task, "expr": d.expr, "evaluate": d.decision.value,
                     "compare_full": full_decision.get((d.task, d.expr)), "items_used": r["done"],
                     "items": r["items"], "looks": r["looks"]})
    left_out = {f"{x.task} {x.expr}": x.short for x in gate.left_out}
    used = sum(r["done"] for r in record["tasks"].values())
    total = sum(r["items"] for r in record["tasks"].values())
    report = {
        "model": "built:smollm2 (SmolLM2-135M-Instruct), fp32 baseline against torch dynamic int8 (decoder Linear "
                 "layers), CPU", "tasks_considered": list(SIMPLE), "fp32_exact_match": accuracy, "kept": kept,
        "n_test": args.n_test, "thresholds": [t.expr for t in thresholds], "chunk": args.chunk,
        "batch_size": args.batch_size, "decisions": rows, "left_out": left_out,
        "left_out_full": {f"{x.task} {x.expr}": x.short for x in full_gate.left_out},
        "opposite": sum(1 for r in rows if {r["evaluate"], r["compare_full"]} == {"breach", "clear"}),
        "items_used": used, "items_total": total, "seconds_until_decided": until, "seconds_int8_full": full,
        "seconds_fp32_full": fp32_seconds, "loadavg": load, "machine": machine_info(),
        "per_item": {"fp32": per_item(work / "fp32"), "int8": per_item(work / "int8"),
                     "until_decided": per_item(work / "until_decided")},
        "command": f"python studies/evaluate_int8_compose.py --out {args.out} --n-test {args.n_test} "
                   f"--keep-above {args.keep_above} --fail-on '{args.fail_on}' --chunk {args.chunk} "
                   f"--batch-size {args.batch_size}"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    shutil.copy(work / "until_decided" / "sequential.json", out / "sequential.json")
    for r in rows:
        print(f"{r['task']} {r['expr']}: evaluate {r['evaluate']} after {r['items_used']}/{r['items']} items; "
              f"compare on the full runs {r['compare_full']}")
    print(f"until decided: {used}/{total} items ({100 * used / total:.0f} %), {until:.0f} s; int8 full run {full:.0f} s "
          f"({100 * until / full:.0f} % of its wall time)")


if __name__ == "__main__":
    main()
