"""benchmarks/mutation.sh's arithmetic: `sample N SEED` draws N mutants per module (uniformly, from `mutmut results
--all true` on stdin); `score [SAMPLE_FILE]` prints the score per module and pooled, with 95 % Wilson intervals, over
the sample (or every mutant), and each mutant not killed."""

import math
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

AGAINST = ("survived", "timeout", "no tests", "suspicious", "segfault")  # a mutant no test reaches counts against


def module(name: str) -> str:
    return name.split(".x")[0].removesuffix(".plugin")  # testing/ and its plugin: one module


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def sample(n: int, seed: int) -> None:
    per_module = defaultdict(list)
    for line in sys.stdin:
        name = line.strip().split(": ")[0]
        if name:
            per_module[module(name)].append(name)
    rng = random.Random(seed)
    for m in sorted(per_module):
        print("\n".join(sorted(rng.sample(per_module[m], min(n, len(per_module[m]))))))


def score(sample_file: str | None) -> None:
    lines = Path("mutants/all.txt").read_text().splitlines()
    status = dict(line.strip().split(": ", 1) for line in lines if ": " in line)
    chosen = Path(sample_file).read_text().split() if sample_file else list(status)
    by_module = defaultdict(Counter)
    for name in chosen:
        by_module[module(name)][status.get(name, "not checked")] += 1
    total = Counter()
    print(f"{'module':40} {'mutants':>7} {'killed':>6} {'not killed':>10} {'not run':>7}  score (95 % interval)")
    for m, c in sorted(by_module.items()):
        total += c
        bad = sum(c[k] for k in AGAINST)
        lo, hi = wilson(c["killed"], c["killed"] + bad)
        rate = c["killed"] / (c["killed"] + bad) if c["killed"] + bad else math.nan
        print(f"{m:40} {sum(c.values()):7} {c['killed']:6} {bad:10} {c['not checked']:7}  "
              f"{100 * rate:5.1f} % ({100 * lo:.1f}–{100 * hi:.1f})")
    bad = sum(total[k] for k in AGAINST)
    lo, hi = wilson(total["killed"], total["killed"] + bad)
    print(f"mutation score: {total['killed']} killed of {total['killed'] + bad} run "
          f"({100 * total['killed'] / max(1, total['killed'] + bad):.1f} %, 95 % interval {100 * lo:.1f}–{100 * hi:.1f}); "
          + ", ".join(f"{k} {total[k]}" for k in AGAINST if total[k]) + f"; not yet run {total['not checked']}")
    survivors = sorted(n for n in chosen if status.get(n) in AGAINST)
    print(f"{len(survivors)} not killed (mutmut show NAME prints one's diff):")
    print("\n".join(f"  {n}: {status[n]}" for n in survivors))


if __name__ == "__main__":
    if sys.argv[1] == "sample":
        sample(int(sys.argv[2]), int(sys.argv[3]))
    else:
        score(sys.argv[2] if len(sys.argv) > 2 else None)
