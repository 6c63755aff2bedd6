"""The run-level statistics of `adaptguard compare` on simulated replicate runs, where the truth is known: the
false-alarm rate of the regression test with no true regression, the coverage of the 95 % interval of the excess
NFR, and the power against planted regressions — for the default (moments over runs and items) and the two-level
bootstrap (runs, then items), by the number of runs per side.

    python studies/noise_floor_simulation.py --out studies/results/noise_floor_simulation   # ~1 min on 2 cores

Writes `<out>.json` (every rate with its settings) and `<out>.png` (the figure in docs/compat.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.compat.stats.replicates import replicate_flips
from studies.simulate import simulate_runs, true_excess_nfr


def rates(runs: int, method: str, sims: int, seed: int, n_items: int, sd_run: float, drop: float = 0.0,
          share: float = 0.0) -> dict:
    """Over `sims` simulated comparisons of `runs` + `runs` runs: the share with p < 0.05 and the 95 % interval's
    coverage of the true excess NFR."""
    rng = np.random.default_rng(seed)
    truth = true_excess_nfr(runs, runs, sd_run=sd_run, drop=drop, share=share)
    rejected = covered = 0
    for k in range(sims):
        old, new, _ = simulate_runs(rng, n_items, runs, runs, sd_run=sd_run, drop=drop, share=share)
        r = replicate_flips(old, new, method=method, n_boot=400, seed=k)
        if method == "bootstrap":  # the bootstrap's SE with the same t interval and test
            from adaptguard.compat.stats.replicates import t_interval, t_sf
            r["ci"] = t_interval(r["estimate"], r["se"], r["df"])
            r["p_value"] = t_sf(r["estimate"] / r["se"], r["df"])
        rejected += r["p_value"] < 0.05
        covered += r["ci"][0] <= truth <= r["ci"][1]
    return {"runs": runs, "method": method, "sims": sims, "truth": truth, "drop": drop, "share": share,
            "rejected": rejected / sims, "coverage": covered / sims}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="noise_floor_simulation")
    parser.add_argument("--sims", type=int, default=200)
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--sd-run", type=float, default=0.3, help="sd of a run's overall logit offset")
    args = parser.parse_args()
    runs = [2, 3, 5, 8]
    null = [rates(r, m, args.sims, 100 + r, args.items, args.sd_run) for m in ("moments", "bootstrap") for r in runs]
    drops = [0.0, 1.0, 2.0, 3.0, 4.0]
    power = [rates(3, "moments", args.sims, 200 + i, args.items, args.sd_run, drop=d, share=0.2)
             for i, d in enumerate(drops)]
    result = {"settings": vars(args), "null": null, "power": power}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))

    from adaptguard.utils.figures import new_figure, save_figure

    fig = new_figure(figsize=(12, 3.6))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for method, style in (("moments", "o-"), ("bootstrap", "s--")):
        pts = [x for x in null if x["method"] == method]
        ax1.plot(runs, [x["rejected"] for x in pts], style, label=method)
        ax2.plot(runs, [x["coverage"] for x in pts], style, label=method)
    ax1.axhline(0.05, color="grey", lw=1)
    ax1.set(title="no regression: false alarms at α = 0.05", xlabel="runs per side", ylabel="share of comparisons")
    ax2.axhline(0.95, color="grey", lw=1)
    ax2.set(title="coverage of the 95 % interval of excess NFR", xlabel="runs per side", ylim=(0.8, 1.01))
    ax3.plot([100 * x["truth"] for x in power], [x["rejected"] for x in power], "o-")
    ax3.set(title="planted regression (3 + 3 runs): power", xlabel="true excess NFR (points)",
            ylabel="share detected (p < 0.05)")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.suptitle(f"{args.sims} simulated comparisons per point, {args.items} items, run offset sd {args.sd_run} "
                 "(logit), churn Logistic(0, 1)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out.with_suffix(".png"), dpi=100)
    for x in null + power:
        print(json.dumps(x))


if __name__ == "__main__":
    main()
