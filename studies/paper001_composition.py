"""Paper 001 on a real model: compositional in-context learning through lm-eval (issue 14, experiment 3).

Runs adaptguard's lm-eval suites `compose_logic` (Ch. 4.3.1, Table 4.4: 7 composites of the simple tasks A–H) and
`compose_translation` (§4.3.2: two COGS-like composites) on a model (default SmolLM2-135M-Instruct), each pair in
four settings — the two simple tasks, the composite with only simple demonstrations (`composite`), and the
composite with composite demonstrations (`composite_icl`, the paper's gold standard) — K demonstrations per query,
greedy decoding. The paper's claims read off the table: on *separable* composites (by parts: A+F, D+F; both
translation composites) the composite score comes close to composite-ICL; on by-steps composites it does not;
composite demonstrations help everywhere. `composite` and `composite_icl` share their queries, so their
difference is tested per item (McNemar's exact test on exact match).

    python studies/paper001_composition.py --quick        # logic pairs af, df, ab, 20 queries each: ≤ 10 min
    python studies/paper001_composition.py                # 7 logic pairs x 50 queries, 2 translation pairs x 20
    python studies/paper001_composition.py --model meta-llama/Llama-3.2-1B --n_test 100   # on a GPU

Writes OUT/report.json, OUT/report.md and OUT/composition.png.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.compat.harness.callback import evaluate_with_lm_eval
from adaptguard.compat.stats.metrics import flip_metrics
from adaptguard.models.embedded import resolve_model
from adaptguard.utils.figures import new_figure, save_figure
from adaptguard.utils.progress import say
from adaptguard.utils.sweeps import command_line, machine_info, report_footer
from studies.common import write_report

SETTINGS = ("simple1", "simple2", "composite", "composite_icl")
# (suite, pair) -> separable? (paper 001 §4.3.1: the by-parts composites A+F, D+F; §4.3.2: both translations)
PAIRS = {("compose_logic", "ab"): False, ("compose_logic", "ac"): False, ("compose_logic", "af"): True,
         ("compose_logic", "bd"): False, ("compose_logic", "be"): False, ("compose_logic", "df"): True,
         ("compose_logic", "gh"): False, ("compose_translation", "t1"): True, ("compose_translation", "t2"): True}
QUICK_PAIRS = ("af", "df", "ab")  # translation prompts are ~4x longer: 4 s per query on 2 CPU cores


@dataclass
class Args:
    model: str = field(default="built:smollm2", metadata={"help": "Hub id, local path, built:<name> or embedded:<name>."})
    pairs: str = field(default=",".join(p for _, p in PAIRS), metadata={"help": "Pairs: ab,ac,af,bd,be,df,gh,t1,t2."})
    k: int = field(default=10, metadata={"help": "Demonstrations per query (the paper's K = 10)."})
    n_test: int = field(default=50, metadata={"help": "Queries per compose_logic task."})
    n_test_translation: int = field(default=20, metadata={"help": "Queries per compose_translation task (their "
                                                                  "10 demonstrations make prompts ~4x longer)."})
    seed: int = field(default=0, metadata={"help": "Data seed (the paper averages 3)."})
    batch_size: int = field(default=16, metadata={"help": "lm-eval batch size."})
    out: str = field(default="paper001-composition-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": f"Pairs {','.join(QUICK_PAIRS)}, 20 queries each."})


def main(args: Args) -> dict:
    if args.quick:
        args.pairs, args.n_test = ",".join(QUICK_PAIRS), 20
    by_name = {pair: suite for suite, pair in PAIRS}
    pairs = args.pairs.split(",")
    unknown = [p for p in pairs if p not in by_name]
    if unknown:
        raise ValueError(f"--pairs: unknown {unknown}; known: {', '.join(by_name)}")
    start, out = time.perf_counter(), Path(args.out)
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if torch.cuda.is_available() else None)
    if torch.cuda.is_available():
        model.to("cuda")
    tokenizer = AutoTokenizer.from_pretrained(path)
    output = {"results": {}, "samples": {}}
    for suite, n_test in (("compose_logic", args.n_test), ("compose_translation", args.n_test_translation)):
        tasks = [f"{suite}_{p}_{s}" for p in pairs if by_name[p] == suite for s in SETTINGS]
        if tasks:
            say(f"lm-eval: {len(tasks)} {suite} tasks x {n_test} queries, K = {args.k} ...")
            run = evaluate_with_lm_eval(model, tokenizer, tasks, batch_size=args.batch_size,
                                        metadata={"k": args.k, "n_test": n_test, "seed": args.seed})
            output["results"].update(run["results"])
            output["samples"].update(run["samples"])
    rows = []
    for p in pairs:
        suite = by_name[p]
        res = {s: output["results"][f"{suite}_{p}_{s}"] for s in SETTINGS}
        em = {s: res[s]["exact_match,none"] for s in SETTINGS}
        # the suite's own word-level score: word exact match (logic, higher is better) or WER (translation)
        word_key = "word_exact_match,none" if suite == "compose_logic" else "wer,none"
        flags = {s: [bool(r["exact_match"]) for r in sorted(output["samples"][f"{suite}_{p}_{s}"],
                                                             key=lambda r: r["doc_id"])] for s in SETTINGS}
        paired = flip_metrics(flags["composite"], flags["composite_icl"])
        rows.append({"suite": suite, "pair": p, "separable": PAIRS[(suite, p)], "exact_match": em,
                     "word_metric": word_key.split(",")[0], "word": {s: res[s][word_key] for s in SETTINGS},
                     "icl_minus_composite": em["composite_icl"] - em["composite"],
                     "mcnemar_p": paired["mcnemar_p"], "n": paired["n"]})
        say(f"  {p}: " + ", ".join(f"{s} {em[s]:.2f}" for s in SETTINGS))
    command = command_line("studies/paper001_composition.py", args)
    report = {"settings": {**vars(args), "command": command}, "pairs": rows, "machine": machine_info(),
              "seconds": time.perf_counter() - start}
    out.mkdir(parents=True, exist_ok=True)
    plot(rows, out / "composition.png", args.model)
    write_report(out, report, markdown(report))
    return report


def plot(rows: list[dict], path: Path, model: str) -> None:
    """Grouped bars: exact match of the four settings per pair, separable pairs marked."""
    import numpy as np

    fig = new_figure(figsize=(max(5.0, 1.1 * len(rows) + 1.5), 3.4))
    ax = fig.add_subplot(1, 1, 1)
    x, width = np.arange(len(rows)), 0.2
    for i, s in enumerate(SETTINGS):
        ax.bar(x + (i - 1.5) * width, [r["exact_match"][s] for r in rows], width, label=s)
    ax.set_xticks(x, [r["pair"] + (" (sep.)" if r["separable"] else "") for r in rows], fontsize=8)
    ax.set_ylabel("exact match")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Compositional ICL on {model}", fontsize=10)
    ax.legend(fontsize=7, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# Paper 001 compositional ICL on {s['model']}", "",
             f"lm-eval, greedy, K = {s['k']} demonstrations, {s['n_test']} queries per logic task and "
             f"{s['n_test_translation']} per translation task, data seed {s['seed']}. "
             "Exact match per setting; the word-level score in brackets (word exact match for logic, higher is "
             "better; WER for translation, lower is better). ICL − comp.: composite-ICL minus composite exact "
             "match on the same queries, with McNemar's exact p.", "",
             "| pair | separable | simple1 | simple2 | composite | composite-ICL | ICL − comp. | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["pairs"]:
        cells = " | ".join(f"{r['exact_match'][k]:.2f} ({r['word'][k]:.2f})" for k in SETTINGS)
        lines.append(f"| {r['pair']} | {'yes' if r['separable'] else 'no'} | {cells} | "
                     f"{r['icl_minus_composite']:+.2f} | {r['mcnemar_p']:.3g} |")
    lines += ["", "![composition](composition.png)", "",
              report_footer(report), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
