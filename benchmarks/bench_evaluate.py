"""`adaptguard evaluate` to its last look against one plain lm-eval run on exactly the same documents (issue 97):
the same model (loaded once, outside both timings), batch size and tasks; alternated A/B, medians; the ratio and the
overhead per look in seconds.

    python benchmarks/bench_evaluate.py                                  # the embedded tiny model, 6 tasks
    python benchmarks/bench_evaluate.py --model built:smollm2 --repeats 3 --json out.json

The tasks are multiple-choice tasks written here (4 choices, 120 items each by default). The baseline is a plain
lm-eval run of the same model with every answer set right, so each task's `nfr` is the share the model gets wrong;
the threshold of each task is that share (rounded to a whole percent), where a sequential test rarely stops early, so
that most tasks run to their last look. A (evaluate): the task manager built, then `evaluate_until_decided` — each
task built once, one lm-eval call per look, the decisions after each look (compare on the samples so far), the
samples appended and the record written. B (lm-eval): the task manager built, then one `simple_evaluate` of every
task on the documents evaluate evaluated, and its samples written. Goal: A/B ≤ 1.15.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "car", "book", "fish", "bird"]


def write_tasks(root: Path, n_tasks: int, items: int) -> list[str]:
    names = []
    for k in range(n_tasks):
        name = f"bench_mc_{k}"
        rng = random.Random(k)
        rows = [{"q": f"Question {i} of set {k}: which word comes first in the list {', '.join(rng.sample(WORDS, 5))}?",
                 "choices": rng.sample(WORDS, 4), "label": i % 4} for i in range(items)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / f'{name}.jsonl'}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{q}}}}\\nAnswer:"
doc_to_target: label
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""")
        names.append(name)
    return names


def write_run(folder: Path, results: dict, acc=None) -> None:
    """An lm-eval `--log_samples` folder of `results`, each request's arguments as lm-eval's CLI writes them (`acc`
    set on every sample where given)."""
    from lm_eval.utils import handle_non_serializable

    folder.mkdir(parents=True)
    stamp = "2026-12-07T00-00-00.000000"
    for task, samples in results["samples"].items():
        text = "".join(json.dumps({**s, **({} if acc is None else {"acc": acc}), "arguments": {
            f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(args)} for i, args in enumerate(s["arguments"])}},
            default=handle_non_serializable) + "\n" for s in samples)
        (folder / f"samples_{task}_{stamp}.jsonl").write_text(text)
    (folder / f"results_{stamp}.json").write_text(json.dumps(
        {"configs": results["configs"], "n-shot": results.get("n-shot", {})}, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded:tiny", help="model path or name (built:smollm2, embedded:tiny)")
    parser.add_argument("--tasks", type=int, default=6, help="number of tasks")
    parser.add_argument("--items", type=int, default=120, help="items per task")
    parser.add_argument("--chunk", type=int, default=20, help="evaluate's --chunk")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs, alternated")
    parser.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()

    from adaptguard.utils.quiet import hide_unused_library_noise

    hide_unused_library_noise()
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.utils import setup_logging

    from adaptguard.compat.gate import Threshold
    from adaptguard.compat.harness.callback import task_manager
    from adaptguard.compat.harness.until_decided import evaluate_until_decided
    from adaptguard.models.embedded import resolve_model
    from adaptguard.utils.sweeps import machine_info

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-evaluate-"))
    (tmp / "tasks").mkdir()
    names = write_tasks(tmp / "tasks", args.tasks, args.items)
    lm = HFLM(pretrained=str(resolve_model(args.model)), batch_size=args.batch_size, device=device, dtype=args.dtype)
    setup_logging("ERROR")
    full = simple_evaluate(model=lm, tasks=names, task_manager=task_manager(tmp / "tasks", names), log_samples=True,
                           bootstrap_iters=0)
    write_run(tmp / "baseline", full, acc=1.0)
    wrong = {t: 1 - full["results"][t]["acc,none"] for t in names}
    thresholds = [Threshold.parse(f"{t}:nfr>{round(100 * wrong[t])}%") for t in names]

    def run_a(i: int) -> tuple[float, dict]:
        start = time.perf_counter()
        out = tmp / f"a{i}"
        evaluate_until_decided(tmp / "baseline", out, lm, thresholds, alpha=0.05, chunk=args.chunk,
                               task_manager=task_manager(tmp / "tasks", names), say=lambda *_: None)
        seconds = time.perf_counter() - start
        return seconds, json.loads((out / "sequential.json").read_text())["tasks"]

    def run_b(i: int, docs: dict[str, list[int]]) -> float:
        start = time.perf_counter()
        results = simple_evaluate(model=lm, tasks=list(docs), task_manager=task_manager(tmp / "tasks", list(docs)),
                                  samples=docs, log_samples=True, verbosity="ERROR")
        write_run(tmp / f"b{i}", results)
        return time.perf_counter() - start

    a_times, b_times, record = [], [], None
    for i in range(args.repeats):
        seconds, record = run_a(i)
        a_times.append(seconds)
        docs = {t: sorted(r["order"][: r["done"]]) for t, r in record.items() if r["done"]}
        b_times.append(run_b(i, docs))
        print(f"pair {i + 1}: evaluate {a_times[-1]:.2f} s, lm-eval {b_times[-1]:.2f} s", flush=True)
    looks = max(len(r["looks"]) for r in record.values())
    a, b = statistics.median(a_times), statistics.median(b_times)
    result = {
        "model": args.model, "device": device, "dtype": args.dtype, **machine_info(), "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None, "tasks": args.tasks,
        "items_per_task": args.items, "chunk": args.chunk,
        "batch_size": args.batch_size, "repeats": args.repeats,
        "items_evaluated": sum(r["done"] for r in record.values()),
        "items_in_tasks": args.tasks * args.items, "looks": looks,
        "looks_per_task": {t: r["looks"] for t, r in record.items()},
        "evaluate_s": a_times, "lm_eval_s": b_times, "evaluate_median_s": a, "lm_eval_median_s": b,
        "ratio": a / b, "overhead_per_look_s": (a - b) / looks,
    }
    print(f"evaluate {a:.2f} s vs lm-eval {b:.2f} s on the same {result['items_evaluated']} items "
          f"(medians of {args.repeats}): ratio {a / b:.3f}, {looks} looks, {(a - b) / looks:.3f} s per look")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
