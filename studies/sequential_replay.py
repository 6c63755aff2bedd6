"""Evaluate until decided (issue 75): are the anytime-valid tests valid under peeking, and how many items do they save?

1. **Size under peeking.** Simulated items at the null boundary (the truth exactly on the threshold), a look after
   every chunk of 25 items up to 1,000, the decision taken at the first look where a test rejects: the share of runs
   that ever breach (or ever clear) must stay ≤ α for each rule — rates (`nfr>θ`, beta-binomial mixture), the paired
   accuracy drop (`acc_drop>Δ`, betting), and `overall:acc_drop>Δ` over three tasks (the product of their
   e-processes).
2. **Cost, replayed on E6's committed records** (studies/results/e6_records: nine quantization schemes of SmolLM2-135M
   against fp32 on BIG-bench, per task): each task's items in a seeded random order, 25 a look, for `nfr>2%`,
   `nfr>5%` and `acc_drop>1%`: the share of the items evaluated until decided, and agreement with the fixed-n gate
   on all items (`compare`'s decision).

3. **Issue 87's arms** (studies/results.md §14, preregistered): A1 only the items that can flip (nfr: the old-right
   items) with the e-processes on them, A2 the group-sequential design over the known pool (evaluate's default), A0g
   the anytime betting test with an aGRAPA bet for acc_drop; and the group design's sizes: exact for the rate tests
   at E6's task shapes, simulated over a grid of nuisance rates for acc_drop.

    python studies/sequential_replay.py --out studies/results/sequential.json   # about 3 min on one core
    python studies/sequential_replay.py --out studies/results/sequential.json --arms-only   # 3. only, the rest kept
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaptguard.compat.decide import decide_threshold
from adaptguard.compat.evidence import GroupSequential
from adaptguard.compat.gate import Threshold
from adaptguard.compat.reading.formats import read_runs
from adaptguard.compat.reading.records import group_plan, task_order
from adaptguard.compat.reading.runs import choose_metric
from adaptguard.compat.stats import group_sequential as gs
from adaptguard.compat.stats.anytime import agrapa_e_process, anytime_e_values, rate_e_value
from adaptguard.compat.stats.metrics import flip_metrics
from adaptguard.compat.stats.paired_drop import paired_drop_p, tango_z

ALPHA, CHUNK = 0.05, 25
RECORDS = Path(__file__).resolve().parents[1] / "studies/results/e6_records"
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


def size_drop_agrapa(margin: float, fixed: float, sims: int, n: int, seed: int) -> dict:
    """`size_drop` for the aGRAPA bet (A0g): ever breach / ever clear at the boundary, a look every chunk."""
    rng = np.random.default_rng(seed)
    looks = np.arange(CHUNK, n + 1, CHUNK) - 1
    hits = {"breach": 0, "clear": 0}
    for _ in range(sims):
        old, new = paired(rng, n, margin, fixed)
        x = old.astype(float) - new.astype(float)
        hits["breach"] += agrapa_e_process(x, margin, True)[looks].max() >= 1 / ALPHA
        hits["clear"] += agrapa_e_process(x, margin, False)[looks].max() >= 1 / ALPHA
    return {"rule": "acc_drop>Δ (aGRAPA)", "threshold": margin, "fixed": fixed, "items": n, "sims": sims,
            "breach": hits["breach"] / sims, "clear": hits["clear"] / sims}


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


# ------------------------------------------------------------------------------ issue 87: the arms and sizes
EXPRS = ("nfr>2%", "nfr>5%", "acc_drop>1%")


def group_entry(old, new, order, looks, big_n, m_r) -> dict:
    """A group-sequential compare entry of the items in `order` (indices), looked at after `looks` of them."""
    return {"sequential": {"design": "group", "items": big_n, "strata": {"R": m_r, "W": big_n - m_r},
                           "old": old[order].astype(int).tolist(), "new": new[order].astype(int).tolist(),
                           "looks": looks}}


def chunk_looks(n: int) -> list[int]:
    return list(range(CHUNK, n, CHUNK)) + [n] if n else []


def arm_a1(old, new, order, t: Threshold, fixed: str) -> tuple[str, int]:
    """A1 for a rate: the e-process of the rate within the old-right stratum (θ·N/M_R per item), the fixed-n
    decision once the stratum is done."""
    big_n, m_r = len(old), int(old.sum())
    flips = (~new[order]).astype(int)
    q0 = t.value * big_n / m_r
    towards = within = 1.0
    for n in chunk_looks(len(order)):
        if n == len(order):
            return fixed, n
        k = int(flips[:n].sum())
        towards, within = max(towards, rate_e_value(k, n, q0, True)), max(within, rate_e_value(k, n, q0, False))
        if towards >= 1 / ALPHA:
            return "breach", n
        if within >= 1 / ALPHA:
            return "clear", n
    return fixed, 0


def arm_a0g(old, new, t: Threshold) -> tuple[str, int]:
    """A0g: A0's order and looks, the acc_drop test with the aGRAPA bet."""
    n = len(old)
    x = old.astype(float) - new.astype(float)
    towards = np.maximum.accumulate(agrapa_e_process(x, t.value, True))
    within = np.maximum.accumulate(agrapa_e_process(x, t.value, False))
    for look in chunk_looks(n):
        if towards[look - 1] >= 1 / ALPHA:
            return "breach", look
        if within[look - 1] >= 1 / ALPHA:
            return "clear", look
    return "undecided", n


def arms(seeds: int) -> list[dict]:
    rows = []
    for scheme, tasks in e6_pairs().items():
        for task, (old, new, docs) in tasks.items():
            big_n, m_r = len(docs), int(old.sum())
            position = {d: i for i, d in enumerate(docs)}
            right = {d: bool(o) for d, o in zip(docs, old)}
            for expr in EXPRS:
                t = Threshold.parse(expr)
                fixed = decide_threshold(task, flip_metrics(old, new, interval="exact"), t, ALPHA)["decision"]
                for seed in range(seeds):
                    plan = group_plan(right, [t.metric], seed, task)
                    order = np.array([position[d] for d in plan["order"]], dtype=int)
                    looks = chunk_looks(len(order))
                    decision, j, _ = GroupSequential(group_entry(old, new, order, looks, big_n, m_r)).stop(t, ALPHA)
                    used = looks[j] if j is not None else len(order)
                    got = {"A2": (decision, used)}
                    if t.metric == "nfr":
                        got["A1"] = arm_a1(old, new, order, t, fixed)
                    else:
                        a0 = [position[d] for d in task_order(docs, seed, task)]
                        got["A0g"] = arm_a0g(old[a0], new[a0], t)
                    for arm, (dec, n_used) in got.items():
                        rows.append({"arm": arm, "scheme": scheme, "task": task, "expr": expr, "seed": seed,
                                     "items": big_n, "used": n_used, "share": n_used / big_n, "sequential": dec,
                                     "fixed_n": fixed})
    return rows


def rate_sizes() -> list[dict]:
    """The group design's exact sizes for the rate tests (breach and clear, each at H0's boundary) at E6's task
    shapes (N, M_R from fp32's records) and a grid of shapes, a look every 25 items of the stratum."""
    shapes = sorted({(len(d), int(o.sum())) for o, _, d in next(iter(e6_pairs().values())).values()})
    shapes += [(n, round(f * n)) for n in (100, 1000) for f in (0.1, 0.5, 0.9)]
    out = []
    for big_n, m in shapes:
        looks = chunk_looks(m)
        for theta in (0.02, 0.05):
            row = {"rule": "nfr>θ (group, exact)", "threshold": theta, "items": big_n, "pool": m}
            for side, (offset, th) in (("breach", (0, theta)), ("clear", (big_n - m, 1 - theta))):
                q0 = (th * big_n - offset) / m
                cut = gs.final_cut(offset, big_n, th, ALPHA, m)
                bounds = gs.rate_boundaries(looks, m, q0, cut, ALPHA)
                row[side] = gs.rate_size(looks, m, q0, cut, bounds) if 0 <= q0 <= 1 else 0.0
                row[f"{side}_fixed_n"] = gs.rate_size([m], m, q0, cut, [cut]) if 0 <= q0 <= 1 else 0.0
            out.append(row)
    return out


def _frontier(big_n: int, margin: float, alt: str, c: int, memo: dict) -> int:
    """`compare`'s exact acc_drop test on N items with c wrong → right: the smallest b (right → wrong) it rejects at
    ("greater"), or the largest + 1 ("less"): a bisection over b, the test being monotone in b."""
    key = (big_n, margin, alt, c)
    if key not in memo:
        rejects = lambda b: paired_drop_p(b, c, big_n, margin, alt) < ALPHA  # noqa: E731
        lo, hi = 0, big_n - c + 1  # greater: first b that rejects (hi: none); less: first b that does not reject
        while lo < hi:
            mid = (lo + hi) // 2
            ok = rejects(mid) if alt == "greater" else not rejects(mid)
            lo, hi = (lo, mid) if ok else (mid + 1, hi)
        memo[key] = lo
    return memo[key]


def margin_sizes(sims: int, seed: int) -> list[dict]:
    """The group design's acc_drop test at the margin's boundary, in `compare`'s own model (each item's old and new
    answers drawn i.i.d.: the old model right with its task's rate r, right → wrong with p_b, wrong → right with p_c,
    p_b − p_c = Δ = 1 %), over a grid of the nuisance p_c: the share of simulated runs that ever breach (or ever
    clear), at an early look (evaluate's proportional order of the strata each run's baseline gives) or at the last
    (`compare`'s exact test), a look every 25 items."""
    rng = np.random.default_rng(seed)
    memo: dict = {}
    out = []
    eps = gs.EARLY_SHARE * ALPHA
    margin = 0.01
    for big_n, r in ((69, 0.42), (219, 0.49), (400, 0.04), (400, 0.5)):
        looks = chunk_looks(big_n)
        bounds = np.array(gs.z_boundaries(tuple(n / big_n for n in looks[:-1]), eps))
        for p_c in (0.0, 0.02, 0.05, 0.1, 0.2):
            p_b = p_c + margin
            if p_b > r or p_c > 1 - r:
                continue
            u = rng.random((sims, big_n))
            old = u < r
            flip = np.where(old, u < p_b, u >= 1 - p_c)  # right → wrong among the right, wrong → right among the wrong
            counts = {}
            early = {"breach": np.zeros(sims, bool), "clear": np.zeros(sims, bool)}
            final = {"breach": np.zeros(sims, bool), "clear": np.zeros(sims, bool)}
            for i in range(sims):
                right, wrong = np.nonzero(old[i])[0], np.nonzero(~old[i])[0]
                order = np.array(gs.proportional_order(list(rng.permutation(right)), list(rng.permutation(wrong))))
                o, f = old[i][order], flip[i][order]
                b, c = np.cumsum(o & f), np.cumsum(~o & f)
                at = np.array(looks[:-1]) - 1
                z = np.nan_to_num(tango_z(b[at], c[at], np.array(looks[:-1]), margin), nan=0.0)
                early["breach"][i], early["clear"][i] = (z >= bounds).any(), (-z >= bounds).any()
                big_b, big_c = int(b[-1]), int(c[-1])
                final["breach"][i] = big_b >= _frontier(big_n, margin, "greater", big_c, memo)
                final["clear"][i] = big_b < _frontier(big_n, margin, "less", big_c, memo)
                counts[i] = (big_b, big_c)
            row = {"rule": "acc_drop>Δ (group, simulated)", "threshold": margin, "items": big_n, "pool": f"r {r:g}",
                   "fixed": p_c, "sims": sims}
            for side in ("breach", "clear"):
                row[side] = float((early[side] | final[side]).mean())
                row[f"{side}_fixed_n"] = float(final[side].mean())
            out.append(row)
    return out


def margin_potential() -> dict:
    """Exploratory, in place of arm A3: how the right → wrong flips sit by the baseline's margin (its top two
    log-likelihoods; generated-answer tasks have none) among the old-right items, and the best a two-stratum split
    at the median margin could do — the variance of the flip count under Neyman allocation with the true rates (an
    oracle) against proportional allocation, per (scheme, task) with a flip."""
    margins = {}
    for f in sorted((RECORDS / "fp32").glob("samples_*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if rows and all(isinstance(r["filtered_resps"][0], list) for r in rows):
            task = f.name[len("samples_"):].rsplit("_2026", 1)[0]
            margins[task] = {r["doc_id"]: float(np.diff(sorted(float(v[0]) for v in r["filtered_resps"])[-2:])[0])
                             for r in rows}
    low_share, ratio = [], []
    for tasks in e6_pairs().values():
        for task, (old, new, docs) in tasks.items():
            flips = old & ~new
            if task not in margins or not flips.any():
                continue
            m = np.array([margins[task][d] for d in docs])
            low = old & (m <= np.median(m[old]))
            high = old & ~low
            low_share.append(float(flips[low].sum() / flips.sum()))
            w = low.sum() / old.sum()
            q_l, q_h = flips[low].mean(), flips[high].mean()
            prop = w * q_l * (1 - q_l) + (1 - w) * q_h * (1 - q_h)
            neyman = (w * np.sqrt(q_l * (1 - q_l)) + (1 - w) * np.sqrt(q_h * (1 - q_h))) ** 2
            ratio.append(float(neyman / prop) if prop > 0 else 1.0)
    return {"tasks": sorted(margins), "runs": len(low_share), "median_share_of_flips_in_low_margin_half":
            float(np.median(low_share)), "median_variance_ratio_neyman_oracle": float(np.median(ratio)),
            "mean_variance_ratio_neyman_oracle": float(np.mean(ratio))}


def arm_summary(rows: list[dict]) -> dict:
    out = {}
    for arm in sorted({r["arm"] for r in rows}):
        out[arm] = summary([r for r in rows if r["arm"] == arm])
        for expr, r in out[arm].items():
            mine = [x for x in rows if x["arm"] == arm and x["expr"] == expr and x["fixed_n"] != "undecided"]
            r["mean_share_where_fixed_n_decided"] = float(np.mean([x["share"] for x in mine])) if mine else None
        out[arm] = {k: v for k, v in out[arm].items() if v["runs"]}
    return out


def nuisance(r: dict) -> str:
    return "—" if "fixed" not in r else f"p_c {100 * r['fixed']:g} %"


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
    if "arms" in out:
        lines += ["", "Issue 87's arms (studies/results.md §14), where the fixed-n gate on all items decides; shares of all "
                  "the task's items:", "",
                  "| arm | threshold | fixed-n decided | median share | mean share | undecided there | "
                  "decided where fixed-n undecided | opposite decision |", "|---|---|---|---|---|---|---|---|"]
        for arm, per in out["arms"].items():
            for expr, r in per.items():
                lines.append(f"| {arm} | `{expr}` | {r['fixed_n_decided']} of {r['runs']} | "
                             f"{pct(r['median_share_where_fixed_n_decided'])} % | "
                             f"{pct(r['mean_share_where_fixed_n_decided'])} % | "
                             f"{r['sequential_undecided_where_fixed_n_decided']} | "
                             f"{r['sequential_decided_where_fixed_n_undecided']} | {r['opposite_decision']} |")
        lines += ["", "The group design's sizes (α = 5 %; rates exact, a look every 25 items of the stratum; acc_drop "
                  f"simulated, {out['group_size_margin'][0]['sims']} runs a point, a look every 25 items):", "",
                  "| rule | threshold | N | pool | nuisance | ever breach % (fixed-n alone) | ever clear % (fixed-n alone) |",
                  "|---|---|---|---|---|---|---|"]
        for r in out["group_size_rates"] + out["group_size_margin"]:
            lines.append(f"| {r['rule']} | {100 * r['threshold']:g} % | {r['items']} | {r['pool']} | "
                         f"{nuisance(r)} | "
                         f"{pct(r['breach'])} ({pct(r['breach_fixed_n'])}) | {pct(r['clear'])} ({pct(r['clear_fixed_n'])}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="sequential.json", help="output JSON file")
    parser.add_argument("--sims", type=int, default=1000, help="simulated runs per size row")
    parser.add_argument("--seeds", type=int, default=10, help="item orders per (scheme, task, threshold)")
    parser.add_argument("--margin-potential", action="store_true", help="only the exploratory margin measurement, added")
    parser.add_argument("--agrapa-sizes", action="store_true", help="only the aGRAPA bet's sizes under peeking, added")
    parser.add_argument("--arms-only", action="store_true", help="only issue 87's arms and sizes, the rest of --out kept")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.agrapa_sizes:
        out = json.loads(Path(args.out).read_text())
        out["size_under_peeking"] = [r for r in out["size_under_peeking"] if "aGRAPA" not in r["rule"]] + [
            size_drop_agrapa(margin, fixed, args.sims, 600, 50 + i) for i, (margin, fixed) in
            enumerate(((0.0, 0.05), (0.01, 0.0), (0.01, 0.05), (0.05, 0.02)))]
        out["agrapa_command"] = f"python studies/sequential_replay.py --out {args.out} --agrapa-sizes --sims {args.sims}"
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(markdown(out))
        return
    if args.margin_potential:
        out = json.loads(Path(args.out).read_text())
        out["margin_potential"] = margin_potential()
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps(out["margin_potential"], indent=1))
        return
    if args.arms_only:
        out = json.loads(Path(args.out).read_text())
        rows = arms(args.seeds)
        out.update(arms=arm_summary(rows), arm_rows=rows, group_size_rates=rate_sizes(),
                   group_size_margin=margin_sizes(2 * args.sims, 40), arms_seconds=time.perf_counter() - start,
                   arms_command=f"python studies/sequential_replay.py --out {args.out} --arms-only --sims {args.sims} "
                   f"--seeds {args.seeds}")
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(markdown(out))
        return
    size = [size_rates(theta, args.sims, 1000, 1 + i) for i, theta in enumerate((0.02, 0.05))]
    size += [size_drop(margin, fixed, args.sims // 2, 600, 10 + i) for i, (margin, fixed) in
             enumerate(((0.0, 0.05), (0.01, 0.0), (0.01, 0.05), (0.05, 0.02)))]
    size.append(size_overall(0.01, 3, args.sims // 4, 400, 30))
    rows = replay(args.seeds)
    out = {"alpha": ALPHA, "chunk": CHUNK, "size_under_peeking": size, "replay": summary(rows), "rows": rows,
           "seconds": time.perf_counter() - start,
           "command": f"python studies/sequential_replay.py --out {args.out} --sims {args.sims} --seeds {args.seeds}"}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(markdown(out))


if __name__ == "__main__":
    main()
