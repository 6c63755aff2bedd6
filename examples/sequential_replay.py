"""Evaluate until decided (issue 75): are the anytime-valid tests valid under peeking, and how many items do they save?

1. **Size under peeking.** Simulated items at the null boundary (the truth exactly on the threshold), a look after
   every chunk of 25 items up to 1,000, the decision taken at the first look where a test rejects: the share of runs
   that ever breach (or ever clear) must stay ≤ α for each rule — rates (`nfr>θ`, beta-binomial mixture), the paired
   accuracy drop (`acc_drop>Δ`, betting), and `overall:acc_drop>Δ` over three tasks (the product of their
   e-processes).
2. **Cost, replayed on E6's committed records** (docs/results/e6_records: nine quantization schemes of SmolLM2-135M
   against fp32 on BIG-bench, per task): each task's items in a seeded random order, 25 a look, for `nfr>2%`,
   `nfr>5%` and `acc_drop>1%`: the share of the items evaluated until decided, and agreement with the fixed-n gate
   on all items (`compare`'s decision).

    python examples/sequential_replay.py --out docs/results/sequential.json   # about 3 min on one core
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaptguard.compat.compare import choose_metric
from adaptguard.compat.decide import anytime_e_values, decide_threshold
from adaptguard.compat.formats import read_runs
from adaptguard.compat.gate import Threshold
from adaptguard.compat.metrics import flip_metrics
from adaptguard.compat.sequential import task_order

ALPHA, CHUNK = 0.05, 25
RECORDS = Path(__file__).resolve().parents[1] / "docs/results/e6_records"
SCHEMES = ("fp16", "bf16", "int8_wo", "quanto_int8", "int8_bnb", "quanto_int4", "nf4", "fp4", "int8_dynamic")


def entry(old, new, looks) -> dict:
    """A sequential compare entry: the flip metrics of the items so far and the answers in their order."""
    return {**flip_metrics(old, new, n_boot=1), "sequential": {"old": list(map(int, old)), "new": list(map(int, new)),
                                                             "looks": looks}}


def first_decision(old, new, t: Threshold, looks) -> tuple[str, int]:
    """The decision at the first look where a test rejects (breach first), and the items evaluated by then."""
    e = entry(old, new, looks)
    flip = "<" if t.op == ">" else ">"
    towards = np.maximum.accumulate(anytime_e_values(e, t.metric, t.value, t.op))
    within = np.maximum.accumulate(anytime_e_values(e, t.metric, t.value, flip))
    for j, n in enumerate(looks):
        if towards[j] >= 1 / ALPHA:
            return "breach", n
        if within[j] >= 1 / ALPHA:
            return "clear", n
    return "undecided", looks[-1]


# ---------------------------------------------------------------------------------------- size under peeking
def size_rates(theta: float, sims: int, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    looks = list(range(CHUNK, n + 1, CHUNK))
    t = Threshold.parse(f"nfr>{100 * theta:g}%")
    kinds = [first_decision(np.ones(n, bool), rng.random(n) >= theta, t, looks)[0] for _ in range(sims)]
    return {"rule": "nfr>θ (mixture)", "threshold": theta, "items": n, "sims": sims,
            "breach": kinds.count("breach") / sims, "clear": kinds.count("clear") / sims}


def paired(rng, n: int, drop: float, fixed: float) -> tuple[np.ndarray, np.ndarray]:
    """Old/new answers with P(right → wrong) = fixed + drop and P(wrong → right) = fixed."""
    u = rng.random(n)
    old = np.ones(n, bool)
    new = u >= fixed + drop
    wrong_right = (u >= fixed + drop) & (u < 2 * fixed + drop)  # some items the old model got wrong, fixed
    old[wrong_right], new[wrong_right] = False, True
    return old, new


def size_drop(margin: float, fixed: float, sims: int, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    looks = list(range(CHUNK, n + 1, CHUNK))
    t = Threshold.parse(f"acc_drop>{100 * margin:g}%")
    kinds = [first_decision(*paired(rng, n, margin, fixed), t, looks)[0] for _ in range(sims)]
    return {"rule": "acc_drop>Δ (betting)", "threshold": margin, "fixed": fixed, "items": n, "sims": sims,
            "breach": kinds.count("breach") / sims, "clear": kinds.count("clear") / sims}


def size_overall(margin: float, tasks: int, sims: int, n: int, seed: int) -> dict:
    """`overall:acc_drop>Δ` with every task on the boundary: the product of the tasks' e-processes ever ≥ 1/α."""
    rng = np.random.default_rng(seed)
    looks = list(range(CHUNK, n + 1, CHUNK))
    hits = 0
    for _ in range(sims):
        walks = [anytime_e_values(entry(*paired(rng, n, margin, 0.05), looks), "acc_drop", margin, ">")
                 for _ in range(tasks)]
        hits += np.prod(walks, axis=0).max() >= 1 / ALPHA
    return {"rule": "overall:acc_drop>Δ (product)", "threshold": margin, "tasks": tasks, "items": n, "sims": sims,
            "breach": hits / sims}


# ------------------------------------------------------------------------------------------ E6 replayed
def e6_pairs() -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per scheme and task, fp32's and the scheme's correctness on the same items (doc order)."""
    ref = read_runs(RECORDS / "fp32")[0]
    out = {}
    for scheme in SCHEMES:
        if not (RECORDS / scheme).is_dir() or not list((RECORDS / scheme).glob("samples_*.jsonl")):
            continue
        run = read_runs(RECORDS / scheme)[0]
        out[scheme] = {}
        for task in sorted(set(ref) & set(run)):
            keys = sorted(k for k in ref[task].samples if k in run[task].samples)
            metric = choose_metric(ref[task], keys[0][0], None)  # acc, or exact_match for a generated answer
            out[scheme][task] = (np.array([ref[task].samples[k].metrics[metric] for k in keys], bool),
                                 np.array([run[task].samples[k].metrics[metric] for k in keys], bool),
                                 [k[1] for k in keys])
    return out


def replay(seeds: int) -> list[dict]:
    rows = []
    for scheme, tasks in e6_pairs().items():
        for task, (old, new, docs) in tasks.items():
            n = len(docs)
            looks = list(range(CHUNK, n, CHUNK)) + [n]
            for expr in ("nfr>2%", "nfr>5%", "acc_drop>1%"):
                t = Threshold.parse(expr)
                fixed = decide_threshold(task, flip_metrics(old, new, interval="exact"), t, ALPHA)["decision"]
                position = {d: i for i, d in enumerate(docs)}
                for seed in range(seeds):
                    order = [position[d] for d in task_order(docs, seed, task)]
                    decision, used = first_decision(old[order], new[order], t, looks)
                    rows.append({"scheme": scheme, "task": task, "expr": expr, "seed": seed, "items": n,
                                 "used": used, "share": used / n, "sequential": decision, "fixed_n": fixed})
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for expr in ("nfr>2%", "nfr>5%", "acc_drop>1%"):
        mine = [r for r in rows if r["expr"] == expr]
        decided_full = [r for r in mine if r["fixed_n"] != "undecided"]
        out[expr] = {
            "runs": len(mine),
            "fixed_n_decided": len(decided_full),
            "median_share_where_fixed_n_decided": float(np.median([r["share"] for r in decided_full]))
            if decided_full else None,
            "mean_share_all": float(np.mean([r["share"] for r in mine])),
            "same_decision": sum(r["sequential"] == r["fixed_n"] for r in mine),
            "sequential_undecided_where_fixed_n_decided": sum(r["sequential"] == "undecided" for r in decided_full),
            "sequential_decided_where_fixed_n_undecided": sum(r["sequential"] != "undecided" and r["fixed_n"] ==
                                                               "undecided" for r in mine),
            "opposite_decision": sum({r["sequential"], r["fixed_n"]} == {"breach", "clear"} for r in mine),
        }
    return out


def markdown(out: dict) -> str:
    """The tables of docs/compat.md, from the JSON this script writes."""
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    lines = [f"Size under peeking (a look every {out['chunk']} items, the first rejection kept; α = "
             f"{100 * out['alpha']:g} %):", "", "| rule | threshold | items | runs | ever breach % | ever clear % |",
             "|---|---|---|---|---|---|"]
    for r in out["size_under_peeking"]:
        rule = r["rule"] + (f", {100 * r['fixed']:g} % fixed" if "fixed" in r else "") + \
            (f", {r['tasks']} tasks" if "tasks" in r else "")
        lines.append(f"| {rule} | {100 * r['threshold']:g} % | {r['items']} | {r['sims']} | {pct(r['breach'])} | "
                     f"{pct(r['clear']) if 'clear' in r else '—'} |")
    seeds = len({row["seed"] for row in out["rows"]})
    lines += ["", f"E6 replayed (9 schemes × 7 tasks × {seeds} item orders per threshold; a look every "
              f"{out['chunk']} items):", "",
              "| threshold | fixed-n gate decided | median share of items used there | same decision | "
              "sequential undecided where fixed-n decided | opposite decision |", "|---|---|---|---|---|---|"]
    for expr, r in out["replay"].items():
        median = "—" if r["median_share_where_fixed_n_decided"] is None else \
            f"{pct(r['median_share_where_fixed_n_decided'])} %"
        lines.append(f"| `{expr}` | {r['fixed_n_decided']} of {r['runs']} | {median} | {r['same_decision']} | "
                     f"{r['sequential_undecided_where_fixed_n_decided']} | {r['opposite_decision']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="sequential.json", help="output JSON file")
    parser.add_argument("--sims", type=int, default=1000, help="simulated runs per size row")
    parser.add_argument("--seeds", type=int, default=10, help="item orders per (scheme, task, threshold)")
    args = parser.parse_args()
    start = time.perf_counter()
    size = [size_rates(theta, args.sims, 1000, 1 + i) for i, theta in enumerate((0.02, 0.05))]
    size += [size_drop(margin, fixed, args.sims // 2, 600, 10 + i) for i, (margin, fixed) in
             enumerate(((0.0, 0.05), (0.01, 0.0), (0.01, 0.05), (0.05, 0.02)))]
    size.append(size_overall(0.01, 3, args.sims // 4, 400, 30))
    rows = replay(args.seeds)
    out = {"alpha": ALPHA, "chunk": CHUNK, "size_under_peeking": size, "replay": summary(rows), "rows": rows,
           "seconds": time.perf_counter() - start,
           "command": f"python examples/sequential_replay.py --out {args.out} --sims {args.sims} --seeds {args.seeds}"}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(markdown(out))


if __name__ == "__main__":
    main()
