"""A real run of `adaptguard evaluate` (issue 75): SmolLM2-135M after torch's dynamic int8 quantization, evaluated
through lm-eval against its fp32 baseline (E6's committed fp32 records) on E6's six BIG-bench multiple-choice tasks
only until each threshold is decided — then the same model over every item, for the wall time and the share of items
saved. The until-decided run goes first; both are timed in this one process, the model loaded once.

    python studies/evaluate_until_decided.py --out studies/results/evaluate_smollm2_int8   # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

from adaptguard.compat.gate import Threshold
from adaptguard.compat.harness.until_decided import evaluate_until_decided
from adaptguard.data.bigbench import load_tasks, write_lm_eval_tasks
from adaptguard.models.embedded import resolve_model
from adaptguard.utils.quiet import hide_unused_library_noise
from adaptguard.utils.sweeps import machine_info

RECORDS = Path(__file__).resolve().parents[1] / "studies/results/e6_records/fp32"
TASKS = ("general_knowledge", "sports_understanding", "date_understanding", "navigate", "misconceptions",
         "hindu_knowledge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="evaluate-smollm2-int8", help="output folder")
    parser.add_argument("--fail-on", default="nfr>2%,nfr>5%,acc_drop>1%", help="thresholds, comma-separated")
    parser.add_argument("--chunk", type=int, default=25, help="items per task between two looks")
    parser.add_argument("--tasks", default=",".join(TASKS), help="BIG-bench tasks, comma-separated (E6's six)")
    parser.add_argument("--design", default="group", choices=("group", "anytime"), help="evaluate's design (default "
                        "group: only the items that can flip, group-sequential over the known items)")
    parser.add_argument("--bigbench", help="BIG-bench's data: bigbench-1.0.0.tar.gz, an unpacked copy or a checkout "
                        "(else $ADAPTGUARD_BIGBENCH, an installed bigbench, the cache, the package index)")
    args = parser.parse_args()
    hide_unused_library_noise()
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(args.out)
    work = out / "work"  # the task files and the run folder: regenerated, not committed
    shutil.rmtree(work, ignore_errors=True)
    names = write_lm_eval_tasks(load_tasks(args.tasks.split(","), args.bigbench), work / "tasks", limit=400)  # E6's first 400
    path = resolve_model("built:smollm2")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.ao.quantization.quantize_dynamic(model.base_model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(path), batch_size=16)
    manager = TaskManager(include_path=str(work / "tasks"))
    thresholds = [Threshold.parse(x) for x in args.fail_on.split(",")]
    load = [os.getloadavg()]
    start = time.perf_counter()
    gate = evaluate_until_decided(RECORDS, work / "until_decided", lm, thresholds, tasks=names, chunk=args.chunk,
                                  task_manager=manager, design=args.design)
    until = time.perf_counter() - start
    load.append(os.getloadavg())
    start = time.perf_counter()
    simple_evaluate(model=lm, tasks=names, task_manager=manager, verbosity="ERROR")
    full = time.perf_counter() - start
    load.append(os.getloadavg())
    record = json.loads((work / "until_decided" / "sequential.json").read_text())
    # items: the task's items; evaluable: those the design would evaluate (the rest cannot change a threshold)
    items = {t: {"used": r["done"], "items": r.get("items", len(r["order"])), "evaluable": len(r["order"]),
                 "status": r["status"], "decisions": r["decisions"]} for t, r in record["tasks"].items()}
    used, total = sum(v["used"] for v in items.values()), sum(v["items"] for v in items.values())
    report = {"model": "built:smollm2, torch dynamic int8 (decoder Linear layers)", "baseline": str(RECORDS),
              "thresholds": [t.expr for t in thresholds], "chunk": args.chunk, "design": args.design,
              "status": gate["status"],
              "decisions": [{k: d[k] for k in ("task", "expr", "decision", "value", "p_value", "p_within")}
                            for d in gate["decisions"]],
              "tasks": items, "items_used": used, "items_total": total, "seconds_until_decided": until,
              "seconds_full": full, "loadavg": load, "machine": machine_info(),
              "note": "the baseline is E6's fp32 run recorded on another machine (studies/results/e6_records/fp32/meta"
                      ".json); the load averages say what else ran on the cores",
              "command": f"python studies/evaluate_until_decided.py --out {args.out} --fail-on '{args.fail_on}' "
                         f"--chunk {args.chunk} --tasks {args.tasks} --design {args.design}"}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"until decided: {used}/{total} items ({100 * used / total:.0f} %), {until:.0f} s; full: {full:.0f} s "
          f"({100 * until / full:.0f} % of its wall time); gate {gate['status']}")


if __name__ == "__main__":
    main()
