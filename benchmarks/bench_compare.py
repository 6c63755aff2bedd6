"""`adaptguard compare` on 100k joined samples: wall time, and its ratio to merely parsing the two
sample files naively (orjson, every record kept in a list, GC on: what a quick script does); then, with
`--large`, 1,000,000 joined samples: `compare_seconds_per_100k` and the peak memory of a process that only
compares (memory must grow linearly with the samples: compare the two sizes' `peak_rss_mib`).

    python benchmarks/bench_compare.py               # 100k multiple-choice samples per run, 3 repeats
    python benchmarks/bench_compare.py --n 200000 --repeats 5
    python benchmarks/bench_compare.py --large       # also 1,000,000 (two ~0.7 GB files in a temporary folder)
    python benchmarks/bench_compare.py --n 20000 --replicates 1 2 4 8   # runs per side: cost linear in runs
    python benchmarks/bench_compare.py --inspect --n 5000                 # two Inspect AI logs

The synthetic files have lm-eval 0.4 `--log_samples` records (doc, arguments, 4-way log-likelihood
responses, hashes, `acc`). Goal (issue 3): a few seconds for 100k.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson


def write_run(root: Path, n: int, seed: int, flip: float) -> Path:
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng(0).integers(0, 4, n)
    run = root / f"run{seed}" / "model"
    run.mkdir(parents=True)
    ts = "2026-11-22T00-00-00.000000"
    with open(run / f"samples_bench_mc_{ts}.jsonl", "w") as f:
        for i in range(n):
            lls = rng.normal(-20, 3, 4)
            if rng.random() > flip:
                lls[truth[i]] = lls.max() + 1.0
            doc = {"goal": f"question {i}", "choices": [f"answer {k} for {i}" for k in range(4)], "label": int(truth[i])}
            h = hashlib.sha256(json.dumps(doc).encode()).hexdigest()
            rec = {"doc_id": i, "doc": doc, "target": int(truth[i]),
                   "arguments": {f"gen_args_{k}": {"arg_0": f"Question: question {i}\nAnswer:",
                                                   "arg_1": f" answer {k} for {i}"} for k in range(4)},
                   "resps": [[[str(ll), "False"]] for ll in lls], "filtered_resps": [[str(ll), "False"] for ll in lls],
                   "filter": "none", "metrics": ["acc"], "doc_hash": h, "prompt_hash": h, "target_hash": str(truth[i]),
                   "acc": float(np.argmax(lls) == truth[i])}
            f.write(json.dumps(rec) + "\n")
    (run / f"results_{ts}.json").write_text(json.dumps({"configs": {"bench_mc": {"output_type": "multiple_choice"}},
                                                        "n-shot": {"bench_mc": 0}}))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--large", action="store_true", help="also 1,000,000 joined samples")
    parser.add_argument("--replicates", type=int, nargs="+", help="time compare with this many runs per side "
                        "(replicates: noise floor, run-level intervals) instead, at --n samples per run")
    parser.add_argument("--inspect", action="store_true", help="time compare on two Inspect AI logs of --n samples "
                        "instead, against reading them with inspect_ai's own read_eval_log")
    args = parser.parse_args()
    if args.inspect:
        return inspect_logs(args.n, args.repeats)
    if args.replicates:
        return replicates(args.n, args.replicates, args.repeats)
    from adaptguard.compat.compare import compare_runs

    with tempfile.TemporaryDirectory() as tmp:
        compare_runs(write_run(Path(tmp) / "warm", 100, 1, 0.3), write_run(Path(tmp) / "warm", 100, 2, 0.25))  # imports
        old, new = write_run(Path(tmp), args.n, 1, 0.3), write_run(Path(tmp), args.n, 2, 0.25)
        files = [next(old.glob("samples_*")), next(new.glob("samples_*"))]
        t_compare, t_parse = [], []
        for i in range(args.repeats):  # alternate A/B
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                start = time.perf_counter()
                if which == 0:
                    report = compare_runs(old, new)
                    t_compare.append(time.perf_counter() - start)
                else:
                    for f in files:
                        with open(f, "rb") as fh:
                            [orjson.loads(line) for line in fh]
                    t_parse.append(time.perf_counter() - start)
        peak = peak_rss_mib(old, new)
        entry = report["tasks"]["bench_mc"]
        print(f"joined_samples: {entry['n']}")
        print(f"compare_seconds_median: {statistics.median(t_compare):.3f}")
        print(f"compare_seconds_per_100k: {statistics.median(t_compare) / entry['n'] * 1e5:.3f}")
        print(f"naive_parse_seconds_median: {statistics.median(t_parse):.3f}")
        print(f"compare_over_parse_ratio: {statistics.median(t_compare) / statistics.median(t_parse):.3f}")
        print(f"peak_rss_mib: {peak:.0f}")
        print(f"nfr: {entry['nfr']:.4f}  pfr: {entry['pfr']:.4f}  inconsistency_flips: "
              f"{entry['inconsistency_flips']:.4f}")
        if args.large:
            old, new = write_run(Path(tmp), 1_000_000, 3, 0.3), write_run(Path(tmp), 1_000_000, 4, 0.25)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                compare_runs(old, new)
                times.append(time.perf_counter() - start)
            print("joined_samples: 1000000")
            print(f"compare_seconds_median: {statistics.median(times):.3f}")
            print(f"compare_seconds_per_100k: {statistics.median(times) / 10:.3f}")
            print(f"peak_rss_mib: {peak_rss_mib(old, new):.0f}")


def replicates(n: int, counts: list[int], repeats: int) -> None:
    """Seconds of `compare_runs` with R runs per side, and per run: flat when the cost is linear in the runs."""
    from adaptguard.compat.compare import compare_runs

    with tempfile.TemporaryDirectory() as tmp:
        top = max(counts)
        olds = [write_run(Path(tmp) / "old", n, 10 + r, 0.3) for r in range(top)]
        news = [write_run(Path(tmp) / "new", n, 100 + r, 0.25) for r in range(top)]
        compare_runs(olds[:1], news[:1])  # imports, file cache
        for r in counts:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                report = compare_runs(olds[:r], [news[:r]])
                times.append(time.perf_counter() - start)
            e = report["tasks"]["bench_mc"]
            floor = e["replicates"]["noise_floor"]
            print(f"runs_per_side: {r}  compare_seconds_median: {statistics.median(times):.3f}  "
                  f"seconds_per_run: {statistics.median(times) / (2 * r):.3f}  nfr: {e['nfr']:.4f}  noise_floor: "
                  f"{'–' if floor is None else f'{floor:.4f}'}")


def inspect_logs(n: int, repeats: int) -> None:
    """`compare` on two Inspect AI logs of n samples each (the embedded tiny model's log of one sample, its sample
    copied n times with its own id and a C/I score, written with inspect_ai's `write_eval_log`), against reading the
    two logs with inspect_ai's `read_eval_log` alone (the floor any reader of the logs pays)."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.log import read_eval_log, write_eval_log
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    from adaptguard.compat.compare import compare_runs
    from adaptguard.models.embedded import embedded_model_path

    with tempfile.TemporaryDirectory() as tmp:
        (template,) = inspect_eval(Task(dataset=[Sample(id="q0", input="the opposite of hot is", target="cold")],
                                        solver=generate(), scorer=match(), name="bench_inspect"),
                                   model=f"hf/{embedded_model_path('tiny')}", log_dir=f"{tmp}/t", display="none",
                                   max_tokens=4, model_args={"device": "cpu"})
        paths = []
        for side, seed in (("old", 1), ("new", 2)):
            rng = np.random.default_rng(seed)
            log, first = template.model_copy(deep=True), template.samples[0]
            samples = []
            for i in range(n):
                s = first.model_copy(deep=True)
                s.id = f"q{i}"
                s.scores["match"].value = "C" if rng.random() < 0.6 else "I"
                samples.append(s)
            log.samples = samples
            paths.append(Path(tmp) / f"{side}.eval")
            write_eval_log(log, str(paths[-1]))
        compare_runs(paths[0], paths[1])  # imports, file cache
        t_compare, t_read = [], []
        for i in range(repeats):  # alternate A/B
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                start = time.perf_counter()
                if which == 0:
                    report = compare_runs(paths[0], paths[1])
                    t_compare.append(time.perf_counter() - start)
                else:
                    for p in paths:
                        read_eval_log(str(p))
                    t_read.append(time.perf_counter() - start)
        entry = report["tasks"]["bench_inspect"]
        print(f"inspect_samples: {entry['n']}")
        print(f"compare_seconds_median: {statistics.median(t_compare):.3f}")
        print(f"read_eval_log_seconds_median: {statistics.median(t_read):.3f}")
        print(f"compare_over_read_ratio: {statistics.median(t_compare) / statistics.median(t_read):.3f}")


def peak_rss_mib(old: Path, new: Path) -> float:
    """Peak resident memory of a fresh process that imports adaptguard and compares the two runs."""
    code = ("import resource, sys; from adaptguard.compat.compare import compare_runs; "
            "compare_runs(sys.argv[1], sys.argv[2]); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, str(old), str(new)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024  # Linux: KiB


if __name__ == "__main__":
    main()
