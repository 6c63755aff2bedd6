"""The gate's two new statistics on simulated runs where the truth is known (the tables in docs/compat.md):

1. **One verdict across tasks** (Kübler et al. 2026): K tasks, one run per side; the share of comparisons where the
   pooled, max-drop or Fisher test rejects at α/3 each (the verdict), against per-task Benjamini–Hochberg at α — with
   no true change (false alarms) and with a regression spread thinly over every task (power).
2. **Items beyond rerun noise**: R + R runs of 400 items; the new model loses 8 logits on 5 % of the items; the
   precision and recall of the items flagged (Boschloo's test per item, BH at q = 0.05) against the planted items the
   old model got right in most runs.

    python studies/gate_simulation.py --out studies/results/gate_simulation.json   # ~1 min on 2 cores

Items follow `studies/simulate.py` (difficulty N(0.5, 2) on the logit scale, run × item churn Logistic(0, 1)).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.compat.decide import across_tasks, pooled_entry
from adaptguard.compat.evidence import p_beyond
from adaptguard.compat.stats.metrics import flip_metrics
from adaptguard.compat.stats.replicates import benjamini_hochberg, items_beyond_noise
from studies.simulate import simulate_runs


def across(sims: int, tasks: int, n: int, share: float, seed: int, alpha: float = 0.05) -> dict:
    rng = np.random.default_rng(seed)
    hits = {"verdict": 0, "pooled": 0, "max_drop": 0, "fisher": 0, "bh": 0}
    drops = []
    for _ in range(sims):
        olds, news, entries = [], [], []
        for _ in range(tasks):
            old, new, _ = simulate_runs(rng, n, 1, 1, sd_run=0.0, drop=3.0, share=share)
            olds.append(old), news.append(new)
            entries.append(flip_metrics(old[0], new[0], n_boot=1))
        p = across_tasks(entries, pooled_entry(olds, news))
        drops.append(float(np.mean([e["old_acc"] - e["new_acc"] for e in entries])))
        for key in ("pooled", "max_drop", "fisher"):
            hits[key] += p[key] < alpha / 3
        hits["verdict"] += min(p.values()) < alpha / 3
        hits["bh"] += any(benjamini_hochberg([p_beyond(e, "acc_drop", 0.0, ">") for e in entries], alpha)[0])
    return {"tasks": tasks, "items": n, "share": share, "sims": sims, "mean_drop_points": 100 * float(np.mean(drops)),
            **{k: v / sims for k, v in hits.items()}}


def items(sims: int, runs: int, seed: int, q: float = 0.05) -> dict:
    rng = np.random.default_rng(seed)
    true_pos = found = flagged = planted = 0
    for _ in range(sims):
        old, new, shift = simulate_runs(rng, 400, runs, runs, drop=8.0, share=0.05, sd_run=0.2)
        f = np.asarray(items_beyond_noise(old, new, q=q)["flagged"])
        breakable = (shift < 0) & (old.mean(0) >= 0.75)
        true_pos += int((f & (shift < 0)).sum())  # flagged and planted: precision
        found += int((f & breakable).sum())  # planted where there was an answer to break, and flagged: recall
        flagged += int(f.sum())
        planted += int(breakable.sum())
    return {"runs_per_side": runs, "sims": sims, "q": q, "flagged_per_comparison": flagged / sims,
            "precision": true_pos / flagged if flagged else None, "recall": found / planted if planted else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gate_simulation.json", help="output JSON file")
    parser.add_argument("--sims", type=int, default=300, help="comparisons per setting")
    args = parser.parse_args()
    start = time.perf_counter()
    out = {"across_tasks": [across(args.sims, 10, 300, share, seed=20 + i) for i, share in
                            enumerate((0.0, 0.02, 0.04, 0.06, 0.08))],
           "items_beyond_noise": [items(max(20, args.sims // 15), runs, seed=40 + runs) for runs in (3, 5, 8, 12)]}
    out["seconds"] = time.perf_counter() - start
    out["command"] = f"python studies/gate_simulation.py --out {args.out} --sims {args.sims}"
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for row in out["across_tasks"]:
        print(row)
    for row in out["items_beyond_noise"]:
        print(row)


if __name__ == "__main__":
    main()
