"""The domain-versus-general trade-off figure: each method's runs against the Pareto front of all methods' runs
(the demo's `tradeoff.png`; the studies draw theirs with it too)."""

from __future__ import annotations

from pathlib import Path

from ..utils.figures import new_figure, save_figure


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (higher is better), sorted by the first."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def tradeoff_plot(base: dict, runs: list[dict], path: Path,
                  title: str = "Domain vs general trade-off per method (embedded tiny model)",
                  xlabel: str = "domain score (held-out questions, exact match)",
                  ylabel: str = "general score (mean over pretraining skills)",
                  bar_note: str = "bars: min–max over seeds") -> None:
    """One panel per method: its runs coloured by learning rate (bars: a run's `domain_bar` / `general_bar` (lo, hi)
    where given, else min–max over seeds), the base model, and the Pareto front of all methods' runs, so each
    method reads against the best trade-off any method reached."""
    import math

    import matplotlib.colors

    methods = list(dict.fromkeys(r["method"] for r in runs))
    lrs = sorted({r["learning_rate"] for r in runs})
    colour = dict(zip(lrs, matplotlib.colormaps["viridis"](matplotlib.colors.Normalize(-0.5, len(lrs) - 0.5)(
        range(len(lrs))))))
    front = pareto_front([(r["domain"], r["general"]) for r in runs])
    ncols = min(4, len(methods) + 1)  # one cell for the legend
    nrows = math.ceil((len(methods) + 1) / ncols)
    fig = new_figure(figsize=(3.1 * ncols, 3.0 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, method in zip(axes, methods):
        # the boundary of what some run reached: a staircase from the y axis to the x axis
        xs, ys = zip(*front)
        ax.step([-0.05, *xs, xs[-1]], [ys[0], *ys, -0.05], where="pre", linestyle="--", color="grey",
                linewidth=1, zorder=1)
        ax.scatter([base["domain"]], [base["general"]], marker="*", s=160, color="black", zorder=3)
        for r in (r for r in runs if r["method"] == method):
            c = colour[r["learning_rate"]]
            bars = {axis: r.get(f"{axis}_bar") or ((r[f"{axis}_spread"]["min"], r[f"{axis}_spread"]["max"])
                                                   if len(r["seeds"]) > 1 else None) for axis in ("domain", "general")}
            if bars["domain"]:
                ax.errorbar(r["domain"], r["general"], color=c, alpha=0.5, elinewidth=1,
                            xerr=[[r["domain"] - bars["domain"][0]], [bars["domain"][1] - r["domain"]]],
                            yerr=[[r["general"] - bars["general"][0]], [bars["general"][1] - r["general"]]])
            ax.scatter([r["domain"]], [r["general"]], s=45, color=c, edgecolor="black", linewidth=0.5, zorder=4)
        ax.set_title(method, fontsize=10)
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    legend_ax = axes[len(methods)]
    legend_ax.axis("off")
    handles = [legend_ax.scatter([], [], marker="*", s=160, color="black", label="base model (before fine-tuning)"),
               legend_ax.plot([], [], "--", color="grey", label="Pareto front, all methods")[0]]
    handles += [legend_ax.scatter([], [], s=45, color=colour[lr], edgecolor="black", linewidth=0.5,
                                  label=f"learning rate {lr:g}") for lr in lrs]
    legend_ax.legend(handles=handles, loc="center", fontsize=8, frameon=False,
                     title="up and right is better" + (f"\n{bar_note}" if "domain_bar" in runs[0]
                                                       or len(runs[0]["seeds"]) > 1 else ""),
                     title_fontsize=8)
    for ax in axes[len(methods) + 1:]:
        ax.axis("off")
    fig.supxlabel(xlabel, fontsize=10)
    fig.supylabel(ylabel, fontsize=10)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")
