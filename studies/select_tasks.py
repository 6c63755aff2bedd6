# Copyright 2026 The adaptguard developers. Licensed under the Apache License, Version 2.0.
"""
Consistency–diversity task selection (paper 001 §3.3.2, Algorithm 1) against its ablations and random
choice, on the embedded default — offline, CPU only (paper 001 Table 3.1 in spirit).

Each target task (a skill of the tiny model asked in a format it never saw) is taken in turn; the other
tasks of the grid and three compositional-suite distractors are the candidates. Every method's choice
becomes a mixture of the same number of rows, the tiny model is fine-tuned on it (plain SFT) and scored
zero-shot on the target. See `studies.selection` for the design.

```bash
python -m studies.select_tasks --out selection-out            # default run, about 3 minutes on a CPU
python -m studies.select_tasks --quick --out selection-quick  # one target, under a minute
python -m studies.select_tasks --targets capital/qa opposite/qa next/qa --p 0.05 --out selection-qa
```

Writes `selection.json`, `selection.md` and the `full` mixture of each target (`mixtures/*.jsonl`, ready
for multitask SFT, e.g. `examples/sft_talr.py`). On your own datasets the same selection is one command:
`adaptguard select TARGET CANDIDATE... --model MODEL --out mixture.jsonl`.
"""

import argparse
import dataclasses


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from studies.selection import GRID

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="selection-out", help="output directory (default: selection-out)")
    parser.add_argument("--quick", action="store_true", help="one target and two seeds (under a minute)")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling, ablations and training")
    parser.add_argument("--targets", nargs="+", choices=GRID, help="target tasks (default: the preset's)")
    parser.add_argument("--p", type=float, help="Algorithm 1's threshold p (default: the preset's)")
    parser.add_argument("--n_random", type=int, help="seeds of the random and no_consistency ablations")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    return parser


def main(args: argparse.Namespace) -> dict:
    from studies.selection import (
        QUICK,
        ExperimentConfig,
        run_selection_experiment,
    )

    config = QUICK if args.quick else ExperimentConfig()
    overrides = {"targets": tuple(args.targets) if args.targets else None, "p": args.p,
                 "n_random": args.n_random, "threads": args.threads}
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    report = run_selection_experiment(args.out, seed=args.seed, config=config)
    print(f"{'method':16s} {'mean EM':>8s} {'word EM':>8s}  selected tasks per target")
    for method, scores in report["summary"].items():
        chosen = "; ".join(",".join(t["methods"][method]["runs"][0]["selected"]) or "-"
                           for t in report["targets"].values())
        runs = len(next(iter(report["targets"].values()))["methods"][method]["runs"])
        note = f" (first of {runs} seeds)" if runs > 1 else ""
        print(f"{method:16s} {100 * scores['exact_match']:8.1f} {100 * scores['word_exact_match']:8.1f}  "
              f"{chosen}{note}")
    print(f"\n{report['trainings']} trainings in {report['seconds']:.0f} s; "
          f"tables in {args.out}/selection.md, numbers in {args.out}/selection.json")
    return report


if __name__ == "__main__":
    main(make_parser().parse_args())
