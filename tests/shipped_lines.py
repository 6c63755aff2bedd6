"""The gate's lines on the shipped pair (`example:fp32` → `example:int8`, bb_general_knowledge), written from the two
lm-eval sample files' counts with scipy — never from the program's output — for the Action's and the plugin's tests:
nfr k/n, the exact one-sided binomial test's p, the 90 % Clopper–Pearson interval, and a check of the items plan."""

import json
import math
import re
from pathlib import Path

from scipy.stats import binomtest

from adaptguard.compat.reading.runs import example_run_path


def flips(task: str) -> tuple[int, int]:
    """(right → wrong flips, items) of a shipped task, counted from the two lm-eval sample files' `acc`."""

    acc = [{r["doc_id"]: r["acc"] for r in map(json.loads, next(
        Path(example_run_path(f"example:{side}")).glob(f"samples_{task}_*.jsonl")).read_text().splitlines())}
        for side in ("fp32", "int8")]
    return sum(acc[0][d] == 1 and acc[1][d] == 0 for d in acc[0]), len(acc[0])


K, N_ITEMS = flips("bb_general_knowledge")
LOW, HIGH = binomtest(K, N_ITEMS).proportion_ci(0.9, method="exact")
CI = f"90 % interval {100 * LOW:.2f}% to {100 * HIGH:.2f}%"
P_BREACH = binomtest(K, N_ITEMS, 0.10, alternative="greater").pvalue
P_WITHIN = binomtest(K, N_ITEMS, 0.30, alternative="less").pvalue
BREACH = (f"bb_general_knowledge: nfr = {100 * K / N_ITEMS:.2f}% > 10.00% (p = {P_BREACH:.3g}, exact one-sided "
          f"binomial on the item counts; {CI})  [nfr>10%]")
UNDECIDED = re.compile(
    re.escape(f"bb_general_knowledge: nfr = {100 * K / N_ITEMS:.2f}% ≤ 30.00% but not shown below it (p = "
              f"{P_WITHIN:.3g} ≥ α, exact one-sided binomial on the item counts; {CI}; at the rate seen, about ")
    + r"(?P<items>[\d,]+)" + re.escape(" items would decide it)  [nfr>30%]"))


def decides_at(line: re.Match) -> bool:
    """The items the undecided line plans ("about N items would decide it"): at the rate seen, the count over N items
    (rounded toward H0) is shown below 30 %, and over 2 % fewer it is not (the plan is rounded to 1 %)."""
    items = int(line["items"].replace(",", ""))

    def shown_below(m: int) -> bool:
        return binomtest(math.ceil(K / N_ITEMS * m - 1e-9), m, 0.30, alternative="less").pvalue < 0.05

    return shown_below(items) and not shown_below(int(items / 1.02))
