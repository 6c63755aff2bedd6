"""E6's words from its report (studies/results/e6/report.json): report.md, studies/results.md §11 and the two E6 rows
of its claims table (the numbers), and README's two E6 rows (the verdict words). Every number and verdict in them is
rendered here from the report, so a test can hold each document to it (tests/studies/test_claims.py); pure Python,
no torch, so that test stays fast.

Each sentence is as strong as its interval: a verdict word only where the registered rule decides it, "reaches 0" (not
"shows") for an interval that includes 0, ratios with their intervals, "orders" only as far as the reversed pairs
allow."""

from __future__ import annotations

LABELS = {"int8_wo": "int8_wo (torchao)", "int8_bnb": "int8_bnb (LLM.int8)", "nf4": "nf4 (bnb)", "fp4": "fp4 (bnb)",
          "int8_dynamic": "int8_dynamic (torch)", "int4_wo": "int4_wo (torchao)"}
TASK = {"bb_arithmetic": "arithmetic", "bb_date_understanding": "date_understanding",
        "bb_general_knowledge": "general_knowledge", "bb_hindu_knowledge": "hindu_knowledge",
        "bb_misconceptions": "misconceptions", "bb_navigate": "navigate", "bb_sports_understanding": "sports_understanding"}


def pct(x: float | None, digits: int = 1, minus: str = "−") -> str:
    """A share as percent; "−" for negative values (docs), "-" in report.md; never "−0.0"."""
    if x is None:
        return "–"
    text = f"{100 * x:.{digits}f}"
    if text.lstrip("-").strip("0.") == "":
        text = text.lstrip("-")
    return text.replace("-", minus)


def signed(x: float) -> str:
    text = pct(x)
    return text if text.startswith("−") or text.strip("0.") == "" else "+" + text


def num(n: int) -> str:
    return f"{n:,}"


def ratio(x: float) -> str:
    return "∞" if x == float("inf") else f"{x:.1f}"


def p_value(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else f"{p:.1g}"


def listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else "none"


def schemes(report: dict) -> list[str]:
    """The runnable schemes, fewest right → wrong first."""
    h1 = report["H1"]["per_scheme"]
    return sorted(h1, key=lambda s: (h1[s]["right_to_wrong"], s))


def h1_groups(report: dict) -> tuple[list[str], list[str], list[str]]:
    """(supported, interval reaching 0, zero by construction) in the order of `schemes`."""
    h1 = report["H1"]["per_scheme"]
    order = schemes(report)
    return ([s for s in order if h1[s]["supported"]], [s for s in order if not h1[s]["supported"]],
            [s for s in order if h1[s]["zero_by_construction"]])


def h1_verdict(report: dict) -> str:
    return "H1 holds" if report["H1"]["holds"] else "H1 does not hold"


def h3_verdict(report: dict) -> str:
    return "no single best" if report["H3"]["best"] is None else f"{report['H3']['best']} best"


def h2_verdict(report: dict) -> str:
    return "supported" if report["H2"]["supported"] else "not supported"


# ---------------------------------------------------------------------------------------------------------------------
# each scheme's own floor (amendment 3)


def floor_rows(report: dict) -> tuple[list[str], list[str]]:
    """(schemes with their own floor measured, runnable schemes without one yet)."""
    floors = (report.get("floors") or {}).get("schemes", {})
    measured = [s for s in schemes(report) if "own_floor" in floors.get(s, {})]
    return measured, [s for s in schemes(report) if s not in measured]


def floor_words(report: dict) -> dict:
    floors = report["floors"]["schemes"]
    measured, missing = floor_rows(report)
    moved = [s for s in measured if floors[s]["flips_by_batch_alone"]]
    still = [s for s in measured if not floors[s]["flips_by_batch_alone"]]
    beyond = [s for s in measured if floors[s].get("beyond_own_floor")]
    not_beyond = [s for s in measured if "excess" in floors[s] and not floors[s]["beyond_own_floor"]]
    return {"measured": measured, "missing": missing, "moved": moved, "still": still, "beyond": beyond,
            "not_beyond": not_beyond}


def changed(entry: dict) -> str:
    lo, hi = entry["changed_ci"]
    return f"{num(entry['changed'])} of {num(entry['n'])} ({pct(entry['changed'] / entry['n'])} %; {pct(lo)}–{pct(hi)})"


def floors_section(report: dict) -> list[str]:
    floors = report.get("floors")
    if not floors:
        return []
    w = floor_words(report)
    rows = floors["schemes"]
    runs = floors["runs"]
    fp32 = rows.get("fp32", {})
    rec = report["machine"]
    scheme_tasks = [r["tasks"] for name, r in runs.items() if not name.startswith("fp32_") and r.get("tasks")]
    fp32_tasks = [r["tasks"] for name, r in runs.items() if name.startswith("fp32_") and r.get("tasks")]
    if scheme_tasks:
        names = [TASK[t] for t in report["kept_tasks"] if t in scheme_tasks[0]]
        n = sum(report["schemes"]["fp32_floor"]["tasks"][t]["n"] for t in report["kept_tasks"] if t in scheme_tasks[0])
        covered = f"{listing(names)} ({num(n)} items" + ("; amendment 4: the schemes' reruns cover these tasks only, "
                                                          "to fit the session)" if len(names) < len(report["kept_tasks"])
                                                          else ")")
        if fp32_tasks and len(fp32_tasks[0]) > len(scheme_tasks[0]):
            covered += f"; fp32 here ran on all {len(fp32_tasks[0])} kept tasks"
    else:
        covered = "the kept tasks"
    where = "one machine"
    if runs:
        here = next(iter(runs.values()))["machine"]
        where = f"{here['cpu']} ({here['cpu_capability']})"
        if (here["cpu"], here["cpu_capability"]) != (rec["cpu"], rec["cpu_capability"]):
            where += (" (another CPU than the recorded runs': a rerun there against a record would mix the batch "
                      "with the CPU's kernels)")
    lines = ["**Each scheme's own floor (amendment 3).** The registered floor above is fp32's; a quantized model's "
             "kernels may depend on the batch (activation scales computed per batch, LLM.int8's outlier columns), "
             f"which fp32 cannot show. The recorded runs were made on {rec['cpu']} ({rec['cpu_capability']}). On "
             f"{where}, fp32 and each scheme ran at the recorded setting (batch "
             f"{report['reference']['batch_size']}, {report['reference']['threads']} threads) and again at batch 5 on "
             f"one thread, on {covered}. *Own floor*: answers that changed between those two runs (exact "
             "95 % interval over items; one pair of runs). *Excess NFR*: `compare`'s replicate mode, fp32 here "
             "against the scheme's two runs here (`replicate_flips` at 95 %: the scheme's rerun pairs are the floor; "
             "the interval counts items and runs). *CPU alone*: answers that changed between the recorded run and the "
             "same setting here.", ""]
    if not w["measured"]:
        lines += [f"No scheme's own floor has run yet; not measured: {listing(w['missing'])}.", ""]
        return lines
    lines += ["| scheme | own floor: answers changed (95 % CI) | right → wrong / wrong → right | log-likelihoods "
              "moved (largest) | NFR vs fp32 here % | excess NFR % (95 % CI) | CPU alone: answers changed |",
              "|---|---|---|---|---|---|---|"]
    if "own_floor" in fp32:
        o, ll = fp32["own_floor"]["pooled"], fp32["own_floor"]["loglikelihoods"]
        lines.append(f"| fp32 | {changed(o)} | {o['right_to_wrong']} / {o['wrong_to_right']} | "
                     f"{num(ll['differing'])} of {num(ll['requests'])} ({ll['max_abs_diff']:.1e}) | – | – | "
                     f"{changed(fp32['cpu_alone']['pooled'])} |")
    for s in w["measured"]:
        row = rows[s]
        o, ll = row["own_floor"]["pooled"], row["own_floor"]["loglikelihoods"]
        ex = row.get("excess", {}).get("pooled")
        excess = "–" if ex is None else f"{pct(ex['excess_nfr'])} ({pct(ex['ci'][0])} to {pct(ex['ci'][1])})"
        lines.append(f"| {LABELS.get(s, s)} | {changed(o)} | {o['right_to_wrong']} / {o['wrong_to_right']} | "
                     f"{num(ll['differing'])} of {num(ll['requests'])} ({ll['max_abs_diff']:.1e}) | "
                     f"{'–' if ex is None else pct(ex['nfr'])} | {excess} | {changed(row['cpu_alone']['pooled'])} |")
    lines.append("")
    said = []
    if w["moved"]:
        said.append(f"**Answers changed by batch and threads alone**: {listing(w['moved'])} — on this CPU their "
                    "answers depend on the batch or the thread count, so part of what they flip against fp32 is "
                    "that.")
    if w["still"]:
        worst = max(rows[s]["own_floor"]["pooled"]["changed_ci"][1] for s in w["still"])
        said.append(f"No answer changed for {listing(w['still'])}: a rate of such changes above {pct(worst)} % "
                    "is excluded at 95 %, a smaller one is not (absence in these runs, not proof of none).")
    if w["beyond"]:
        said.append(f"Flips beyond the scheme's own floor (lower end above 0): {listing(w['beyond'])}.")
    if w["not_beyond"]:
        said.append(f"Not shown beyond its own floor (the interval reaches 0): {listing(w['not_beyond'])}.")
    if "cpu_alone" in fp32:
        c = fp32["cpu_alone"]["pooled"]
        said.append(f"fp32 on this CPU against the recorded Xeon run: {num(c['changed'])} of {num(c['n'])} answers "
                    "changed.")
    if "own_floor" in fp32:
        said.append(f"fp32's own floor here: {fp32['own_floor']['pooled']['changed']} answers changed.")
    if w["missing"]:
        said.append(f"**No own floor yet** (not run so far): {listing(w['missing'])}; for them only fp32's "
                    "floor exists, and how much of their flips batch alone would make is not known.")
    main = [r for r in floors.get("not_run", []) if not r.endswith("_b1")]
    batch_one = [r for r in floors.get("not_run", []) if r.endswith("_b1")]
    if main:
        said.append(f"Registered runs not made so far: {', '.join(main)}.")
    if batch_one:
        said.append(f"The batch-1 runs (registered only for time left after every floor) were not made: "
                    f"{', '.join(batch_one)}.")
    loads = [x for r in runs.values() for x in (r["loadavg_start"][0], (r.get("loadavg_end") or [None])[0])
             if x is not None]
    seconds = sum(r["eval_seconds"] or 0 for r in runs.values())
    by_note: dict[str, list[str]] = {}  # runs that shared the cores the same way, named together
    for run, note in floors.get("shared", {}).items():
        if run in runs:
            by_note.setdefault(note, []).append(run)
    shared = [f"during {', '.join(names)}, {note}" for note, names in by_note.items()]
    if shared:
        said.append("Our own work shared the cores too: " + "; ".join(shared) + ".")
    said.append(f"These {len(runs)} runs took {seconds / 60:.0f} min; test runs and other work shared the 2 cores "
                f"(1-min load average {min(loads):.1f}–{max(loads):.1f} at their starts and ends, in each `meta.json`),"
                " so their seconds are not speeds.")
    return lines + [" ".join(said), ""]


# ---------------------------------------------------------------------------------------------------------------------
# report.md


def report_markdown(report: dict) -> str:
    p = lambda x: pct(x, minus="-")  # noqa: E731
    lines = [f"# E6: flips from quantization, {report['model']} (fp32 reference)", "",
             f"Kept tasks: {', '.join(report['kept_tasks'])}; churn (fp32 not above chance, reported apart): "
             f"{', '.join(report['churn_tasks']) or 'none'}. Pooled over the kept tasks' items; % of items.", "",
             "| scheme | weights MB | fp32 acc | acc | Δacc | NFR | PFR | NFR − abs(Δacc) (95% CI) | mean KL | "
             "across tasks | tokens/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, row in report["schemes"].items():
        q, h = row["pooled"], report["H1"]["per_scheme"].get(s)
        across = next(iter((row["across_tasks"] or {}).values()), {})
        verdict = {True: "regression", False: "none shown"}.get(across.get("regression"), "–")
        hidden = "–" if h is None else f"{p(h['statistic'])} ({p(h['ci'][0])} to {p(h['ci'][1])})"
        kl = "–" if row["kl_mean"] is None else f"{row['kl_mean']:.4f}"
        speed = "–" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:.0f}"
        lines.append(f"| {s} | {row['weight_bytes'] / 1e6:.0f} | {p(q['old_acc'])} | {p(q['new_acc'])} | "
                     f"{p(q['new_acc'] - q['old_acc'])} | {p(q['nfr'])} | {p(q['pfr'])} | {hidden} | {kl} | "
                     f"{verdict} | {speed} |")
    for s, error in report["not_runnable"].items():
        # the root cause is the last line of the error chain; the whole chain is in report.json
        lines.append(f"| {s} | not runnable here: {error.split('; ')[-1][:160]} |||||||||| ")
    if report["not_run"]:
        lines += ["", f"Not run yet: {', '.join(report['not_run'])}."]
    h1, h2, h3 = report["H1"], report["H2"], report["H3"]
    if not report["complete"]:
        lines += ["", f"**Provisional**: {len(report['not_run'])} of the registered runs have not run yet; the "
                      "decisions below are over the schemes that have, and are not E6's."]
    supported, reaching, zero = h1_groups(report)
    lines += ["", f"**H1** (flips hidden by accuracy): {'holds' if h1['holds'] else 'does not hold'} "
                  f"(the floor's pooled NFR {p(h1['floor_pooled_nfr'])} %; schemes at or below it judged apart). "
                  f"Interval above 0 (decided on counts): {', '.join(supported) or 'none'}; reaching 0: "
                  f"{', '.join(reaching) or 'none'}"
                  + (f"; no wrong → right item, so the statistic is 0 in every resample and cannot support H1: "
                     f"{', '.join(zero)}" if zero else "") + ". Does not hold = not shown for every scheme."]
    if h2.get("rho") is None:
        lines.append(f"**H2** (KL tracks flips): {h2['reason']}")
    else:
        rev = "; ".join(f"{a} / {b}" for a, b in h2["reversed_pairs"]) or "none"
        lines.append(f"**H2** (KL tracks flips): ρ = {h2['rho']:.2f} (95 % CI {h2['ci'][0]:.2f} to {h2['ci'][1]:.2f})"
                     f" over {len(h2['schemes'])} schemes: {h2_verdict(report)} (weak evidence with this few "
                     f"schemes). Pairs whose KL order is not their NFR order: {len(h2['reversed_pairs'])} of "
                     f"{h2['pairs']} ({rev}).")
    if h3.get("reason"):
        lines.append(f"**H3** (best at ≤ 4.5 bits): {h3['reason']}")
    else:
        lines.append("**H3** (best at ≤ 4.5 bits): "
                     + (f"{h3['best']}" if h3["best"] else f"no single best (lowest NFR: {h3['lowest']})")
                     + f"; Benjamini–Hochberg over the {h3['pairs_tested']} pairs that ran (registered: "
                       f"{h3['pairs_registered']}); with the missing pairs at p = 1: "
                     + (h3["best_with_missing_pairs_at_p1"] or "no single best") + ".")
    if report.get("kl_texts"):
        k = report["kl_texts"]
        lines.append(f"KL texts: {k['n']}, {k['at_max_length']} of them at the {k['max_length']}-token limit (cut "
                     "there).")
    for key, r in (report.get("ratios") or {}).items():
        lines.append(f"Right → wrong, {key}: {r['counts'][0]} / {r['counts'][1]} = {ratio(r['ratio'])} "
                     f"(95 % CI {ratio(r['ci'][0])}–{ratio(r['ci'][1])}).")
    if report.get("floors"):
        lines += [""] + floors_section(report)
    lines += ["", f"Reproduce: `{report['command']}`.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# the claims tables: studies/results.md's (the numbers) and README's (the verdict words)

QUANTIZATION_HIDES = "quantization flips answers that accuracy hides (Dutta et al. 2024)"
FEWEST = "which quantization breaks the fewest answers (E6)"


def results_rows(report: dict) -> dict[str, str]:
    """{claim cell: what-we-found cell} of the two E6 rows in studies/results.md's claims table."""
    h1 = report["H1"]["per_scheme"]
    rows = report["schemes"]
    supported, reaching, zero = h1_groups(report)
    stats = [h1[s]["statistic"] for s in supported]
    nfr = lambda s: pct(rows[s]["pooled"]["nfr"])  # noqa: E731
    hides = (f"shown for {len(supported)} of {len(h1)} schemes ({', '.join(supported)}: NFR − abs(Δacc) "
             f"{pct(min(stats))}–{pct(max(stats))} points, each 95 % interval above 0)" if supported else
             f"shown for none of {len(h1)} schemes")
    if reaching:
        hides += (f"; for {', '.join(reaching)} (NFR ≤ {pct(max(rows[s]['pooled']['nfr'] for s in reaching))} %) "
                  "the interval reaches 0: not shown either way")
    # §5's one int8 run on 6 tasks × 100 items, stated beside E6 as before (tests/test_claims reads it from its file)
    import json
    from pathlib import Path

    quant = json.loads((Path(__file__).resolve().parents[1] / "studies/results/quantization_flips_full.json").read_text())
    per_task = sorted(t["nfr"] for t in quant["tasks"].values())
    hides += (f"; §5's int8 run: {round(100 * per_task[0])}–{round(100 * per_task[-1])} % per task: "
              f"**{h1_verdict(report)}**")
    h2, h3 = report["H2"], report["H3"]
    low = [s for s in schemes(report) if s in h3["candidates"]]
    high = [s for s in schemes(report) if s not in h3["candidates"]]
    above = [s for s in high if rows[s]["pooled"]["nfr"] > max(rows[x]["pooled"]["nfr"] for x in low)]
    below = [s for s in high if s not in above]
    n = rows[low[0]]["pooled"]["n"]
    rev = "; ".join(f"{a} / {b}" for a, b in h2["reversed_pairs"])
    fewest = (f"right → wrong over {num(n)} items: " + ", ".join(f"{s} {nfr(s)} %" for s in below)
              + f"; at ≤ 4.5 bits **{h3_verdict(report)}** (" + ", ".join(f"{s} {nfr(s)} %" for s in low) + "); "
              + ", ".join(f"{s} {nfr(s)} %" for s in above)
              + f"; KL's order is NFR's in {h2['pairs'] - len(h2['reversed_pairs'])} of {h2['pairs']} pairs "
                f"(ρ {h2['rho']:.2f}, 95 % CI {h2['ci'][0]:.2f}–{h2['ci'][1]:.2f}"
              + (f"; reversed: {rev}" if rev else "") + f"): **{h2_verdict(report)}**, weakly "
                f"({len(h2['schemes'])} schemes)")
    if report.get("floors"):
        w = floor_words(report)
        fl = report["floors"]["schemes"]
        if w["measured"]:
            cpu = next(iter(report["floors"]["runs"].values()))["machine"]["cpu"]
            n = fl[w["measured"][0]]["own_floor"]["pooled"]["n"]
            def own(s: str) -> str:
                text = f"{s} {fl[s]['own_floor']['pooled']['changed']} of {num(n)}"
                ex = fl[s].get("excess", {}).get("pooled")
                if ex:
                    text += (f" (excess NFR beyond it {pct(ex['excess_nfr'])} %, 95 % CI {pct(ex['ci'][0])} to "
                             f"{pct(ex['ci'][1])})")
                return text

            fewest += (f"; answers changed by batch and threads alone (each scheme's own floor, batch 16 vs 5 on one "
                       f"{cpu}): " + ", ".join(own(s) for s in w["measured"]))
        fewest += (f"; no own floor yet: {', '.join(w['missing'])}" if w["missing"] else "")
    return {QUANTIZATION_HIDES: hides, FEWEST: fewest}


def readme_rows(report: dict) -> dict[str, str]:
    """{claim cell: verdict cell} of README's two E6 rows: the verdict words of `results_rows`, nothing else."""
    return {QUANTIZATION_HIDES: f"**{h1_verdict(report)}**",
            FEWEST: f"≤ 4.5 bits **{h3_verdict(report)}**; KL **{h2_verdict(report)}**"}


# ---------------------------------------------------------------------------------------------------------------------
# studies/results.md §11


def section_11(report: dict) -> str:
    rows, h1, h2, h3 = report["schemes"], report["H1"], report["H2"], report["H3"]
    ref = report["reference"]
    order = schemes(report)
    supported, reaching, zero = h1_groups(report)
    kept, churn = report["kept_tasks"], report["churn_tasks"]
    any_row = rows[order[0]]
    n_kept = any_row["pooled"]["n"]
    floor = rows.get("fp32_floor")
    ll = report.get("floor_loglikelihoods")
    m = report["machine"]
    v = report["versions"]
    floor_setting = ref.get("floor_setting", [5, 1])
    threads = lambda k: "one thread" if k == 1 else f"{k} threads"  # noqa: E731
    out = ["## 11. E6 — which quantization breaks the fewest answers", ""]
    summary = (f"accuracy hides the flips of {listing(supported)} (the interval of NFR − |Δacc| above 0)" if supported
               else "accuracy is not shown to hide any scheme's flips")
    if reaching:
        summary += (f"; for {listing(reaching)} that interval reaches 0 — not shown either way — so \"every scheme "
                    f"hides its flips\" (H1) {'holds' if h1['holds'] else 'is not shown'}")
    out += ["**The paper.** Dutta et al., \"Accuracy is not all you need\" (NeurIPS 2024, arXiv 2407.09141): on larger "
            "models, quantization flips answers while accuracy barely moves, and the KL divergence from the "
            "full-precision model tracks the share of flips across schemes. Here, on SmolLM2-135M: KL tracks flips "
            f"(H2, {h2_verdict(report)}, weakly); {summary}.", ""]
    out += ["Registered in [studies/preregistration.md § E6](preregistration.md#e6-issue-67-which-quantization-breaks-"
            "the-fewest-answers--flips-against-fp32-and-whether-kl-predicts-them) before any E6 run (amendments 1–2 "
            "dated before the results they touch; amendments 3–4, each scheme's own floor, registered after the "
            "results and before their runs). Runner: `python studies/quantization_flips.py --e6 --out DIR` (resumable: a run "
            "with records is skipped; `--schemes nf4,int8_bnb,…` runs any subset; one `compare --html` page per "
            "scheme in `DIR`). Records, committed as each run finished: `studies/results/e6_records/<run>/` (lm-eval's "
            "per-item samples without the prompt copies, `meta.json`, `kl.json`). Report, recomputed from the "
            "records: `python studies/quantization_flips.py --e6 --report --out studies/results/e6` → "
            "[e6/report.md](results/e6/report.md), [e6/report.json](results/e6/report.json); this section, the E6 "
            "rows of [the claims table](#what-we-found-claim-by-claim) and README's E6 verdicts are rendered from "
            "report.json by `studies/e6_text.py` (a test holds them to it).", ""]
    sizes = {t: any_row["tasks"][t]["n"] for t in any_row["tasks"]}
    ref_acc = any_row["pooled"]["old_acc"]
    arith = any_row["tasks"].get("bb_arithmetic")
    out += [f"**Setup.** v1 = `{report['model']}` in fp32; each scheme loaded through "
            "`models.loading.quantization_config`, as `update`'s `new_base.quantization` takes it. "
            f"{len(sizes)} BIG-bench tasks: " + ", ".join(f"{TASK[t]} {sizes[t]}" for t in sizes)
            + " items (the multiple-choice tasks of §5 up to 400 items each; arithmetic as a generated task: greedy, "
              f"exact match). fp32 is not above chance on {listing([TASK[t] for t in churn])} (`compare`'s exact "
              "test): those are **churn**, reported apart; the pooled rows and H1–H3 use the other "
              f"{len(kept)} ({num(n_kept)} items, fp32 accuracy {pct(ref_acc)} %"
            + (f"; arithmetic's {arith['n']} items at {pct(arith['old_acc'])} % weigh on the pool" if arith else "")
            + f"). KL(fp32 ‖ scheme): mean per token over the first {report['kl_texts']['n']} of `evals`' LogiQA "
              f"questions, teacher-forced (not evaluation items); {report['kl_texts']['at_max_length']} of them reach "
              f"the {report['kl_texts']['max_length']}-token limit and were cut there. Machine: {m['cpu']}, "
              f"{m['threads']} cores ({m['cpu_capability']}), torch {v['torch']}, transformers {v['transformers']}, "
              f"lm-eval {v['lm_eval']}, bitsandbytes {v['bitsandbytes']}, torchao {v['torchao']}, optimum-quanto "
              f"{v['optimum-quanto']}.", ""]
    if floor:
        moved = sum(e["nfr"] + e["pfr"] > 0 for e in floor["tasks"].values())
        text = (f"**The registered floor.** fp32 evaluated again at batch {floor_setting[0]} on "
                f"{threads(floor_setting[1])} (the reference: batch {ref['batch_size']}, {threads(ref['threads'])}) "
                + ("changed **no answer on any of the "
                   f"{len(floor['tasks'])} tasks**" if not moved else f"changed answers on {moved} tasks"))
        if ll:
            text += (f". The log-likelihoods themselves are not identical: {ll['differing']} of {num(ll['requests'])}"
                     f" differ, by at most {ll['max_abs_diff']:.1e}, against a smallest gap of "
                     f"{ll['min_top_two_margin']:.1e} between an item's two likeliest choices — so no answer could "
                     "change. That floor is fp32's: it does not show that a quantized model's answers are "
                     "independent of the batch (the noise the registration was motivated by); each scheme's own "
                     "floor is below the table.")
        out += [text, ""]
    out += ["| scheme | weights MB | acc % | Δacc | NFR % | PFR % | NFR − abs(Δacc) (95 % CI) | mean KL | "
            f"`compare` across {len(sizes)} tasks | tokens/s |", "|---|---|---|---|---|---|---|---|---|---|",
            f"| fp32 (v1) | {ref['weight_bytes'] / 1e6:.0f} | {pct(ref_acc)} | – | – | – | – | – | – | "
            f"{ref['tokens_per_second']:,.0f} |"]
    for s in order:
        r, h = rows[s], h1["per_scheme"][s]
        q = r["pooled"]
        across = next(iter((r["across_tasks"] or {}).values()), {})
        verdict = "**regression**" if across.get("regression") else "none shown"
        kl = f"{r['kl_mean']:.5f}" if r["kl_mean"] < 0.001 else f"{r['kl_mean']:.4f}"
        out.append(f"| {LABELS.get(s, s)} | {r['weight_bytes'] / 1e6:.0f} | {pct(q['new_acc'])} | "
                   f"{signed(q['new_acc'] - q['old_acc'])} | {pct(q['nfr'])} | {pct(q['pfr'])} | "
                   f"{pct(h['statistic'])} ({pct(h['ci'][0])} to {pct(h['ci'][1])}) | {kl} | {verdict} | "
                   f"{r['tokens_per_second']:,.0f} |")
    for s, error in report["not_runnable"].items():
        out.append(f"| {LABELS.get(s, s)} | not runnable here: `{error.split('; ')[-1][:120]}` |||||||||")
    regress = [s for s in order if next(iter((rows[s]["across_tasks"] or {}).values()), {}).get("regression")]
    ps = "; ".join(f"{s}: " + ", ".join(f"{k.replace('_', '-')} p = {p_value(p)}" for k, p in
                                        next(iter(rows[s]["across_tasks"].values()))["p"].items())
                   for s in regress)
    per_task = "; ".join(f"{s} " + " / ".join(pct(rows[s]["tasks"][t]["nfr"]) for t in kept) for s in order)
    out += ["", f"Percent of the {num(n_kept)} kept items; Δacc in points; NFR − |Δacc| is H1's statistic with its "
                "registered bootstrap interval over items (10,000 resamples; its ends computed on counts, "
                "amendment 3). *Weights MB*: bytes of the loaded model's parameters and buffers — the 49,152 × 576 "
                "embedding (tied to the head) stays unquantized in every 8- and 4-bit scheme. *Across tasks*: "
                "`compare`'s accuracy verdict (pooled, max-drop and Fisher at α/3; an accuracy test is valid at "
                f"chance, so churn tasks count)" + (f"; p-values of the schemes it calls a regression: {ps}" if ps
                                                    else "")
            + f". Per task (NFR %, {' / '.join(TASK[t] for t in kept)}): {per_task}.", ""]
    # decisions
    stats = [h1["per_scheme"][s]["statistic"] for s in supported]
    exact_zero = [s for s in reaching if h1["per_scheme"][s]["ci_counts"][0] == "0" and s not in zero]
    gainers = [s for s in order if rows[s]["pooled"]["new_acc"] >= rows[s]["pooled"]["old_acc"]
               and h1["per_scheme"][s]["right_to_wrong"] > 0]
    d1 = (f"- **H1 (flips hidden by accuracy): {'holds' if h1['holds'] else 'does not hold'}** — read as \"not shown "
          "for every scheme\". " + (f"Every scheme's pooled NFR is above the registered floor's "
                                    f"({pct(h1['floor_pooled_nfr'])} %), so every scheme counts. "
                                    if all(h1["per_scheme"][s]["above_floor"] for s in order) else ""))
    if supported:
        d1 += (f"The interval of NFR − |Δacc| is above 0 for {len(supported)} of {len(order)}: {listing(supported)} — "
               f"their NFR exceeds what accuracy shows by {pct(min(stats))}–{pct(max(stats))} points. ")
    if reaching:
        d1 += (f"For {listing(reaching)} it reaches 0: not shown that accuracy hides their flips, and not shown that "
               "it reveals them (they flip ≤ "
               f"{pct(max(rows[s]['pooled']['nfr'] for s in reaching))} % of the items). ")
    if zero:
        d1 += ("The statistic equals min(PFR, 2·NFR − PFR): "
               + "; ".join(f"{s}, with {h1['per_scheme'][s]['right_to_wrong']} right → wrong and no wrong → right "
                           "item, has it 0 in every resample" for s in zero)
               + " — it could not support H1 whatever its flips. ")
    if exact_zero:
        d1 += (f"The lower ends of {listing(exact_zero)} are exactly 0 in counts (computed in floats, as before "
               "amendment 3, they came out a few 1e-17 either side of 0, and the verdict hung on rounding). ")
    if gainers:
        d1 += ("Accuracy is no bound on flips even for the near-lossless: "
               + "; ".join(f"{s}'s accuracy moves {signed(rows[s]['pooled']['new_acc'] - rows[s]['pooled']['old_acc'])}"
                           f" points while {pct(rows[s]['pooled']['nfr'])} % of the items broke" for s in gainers)
               + ".")
    d2 = f"- **H2 (KL tracks flips): {h2_verdict(report)}**, ρ = {h2['rho']:.2f} (95 % CI {h2['ci'][0]:.2f} to " \
         f"{h2['ci'][1]:.2f}) between mean KL and pooled NFR over the {len(h2['schemes'])} runnable schemes. Weak " \
         f"evidence, as registered: {len(h2['schemes'])} schemes, one model. KL's order is NFR's order for " \
         f"{h2['pairs'] - len(h2['reversed_pairs'])} of {h2['pairs']} pairs of schemes"
    if h2["reversed_pairs"]:
        d2 += "; reversed: " + "; ".join(
            f"{a} has the {'lower' if rows[a]['kl_mean'] < rows[b]['kl_mean'] else 'higher'} KL and the "
            f"{'higher' if rows[a]['pooled']['nfr'] > rows[b]['pooled']['nfr'] else 'lower'} NFR than {b}"
            for a, b in h2["reversed_pairs"])
    d2 += (". So KL's ranking holds for most pairs, not for every one." if h2["reversed_pairs"] else
           ". KL's ranking holds for every pair here.")
    if h3.get("reason"):
        d3 = f"- **H3 (the best at ≤ 4.5 bits)**: {h3['reason']}."
    else:
        best = h3["lowest"]
        tests = "; ".join(f"{t['best_only']} vs {t['other_only']} items only one of {best} and {o} broke, p = "
                          f"{p_value(t['p'])}" for o, t in h3["tests"].items())
        d3 = (f"- **H3 (the best at ≤ 4.5 bits): {h3_verdict(report)}.** {best} has the lowest NFR "
              f"({pct(rows[best]['pooled']['nfr'])} %); one-sided exact McNemar on the negative flips: {tests}"
              + (" — so it is not the best by the registered test" if h3["best"] is None else "")
              + f". Benjamini–Hochberg ran over the {h3['pairs_tested']} pairs that exist, not the registered "
                f"{h3['pairs_registered']} ({listing(list(report['not_runnable']))} could not run); with the missing "
                "pair at p = 1 the decision is "
              + ("the same" if h3["best_with_missing_pairs_at_p1"] == h3["best"] else "different") + ".")
    out += ["**Decisions, as registered.**", d1.rstrip(), d2, d3, ""]
    out += floors_section(report)
    # churn tasks
    churn_text = []
    for t in churn:
        entries = {s: rows[s]["tasks"][t] for s in order}
        moved = [s for s in order if entries[s]["nfr"] + entries[s]["pfr"] > 0]
        old = entries[order[0]]["old_acc"]
        if len(moved) > len(order) // 2:
            worst = max(moved, key=lambda s: entries[s]["nfr"])
            churn_text.append(f"on {TASK[t]} (fp32 {pct(old)} %) the schemes' NFR runs "
                              f"{pct(min(e['nfr'] for e in entries.values()))}–{pct(entries[worst]['nfr'])} % with PFR "
                              f"alike ({worst} {pct(entries[worst]['nfr'])} / {pct(entries[worst]['pfr'])}): answers "
                              "re-drawn at chance")
        else:
            churn_text.append(f"on {TASK[t]} (fp32 {pct(old)} %) "
                              + (", ".join(f"{s} moved answers (NFR {pct(entries[s]['nfr'])} %, PFR "
                                           f"{pct(entries[s]['pfr'])} %)" for s in moved) or "no scheme moved an answer")
                              + ("; the others none" if moved else ""))
    out += ["**Churn tasks, apart.** " + "; ".join(churn_text)[:1].upper() + "; ".join(churn_text)[1:] + ".", ""]
    # the bridge to §5
    if "int8_dynamic" in rows:
        dyn = rows["int8_dynamic"]
        kept_nfr = [dyn["tasks"][t]["nfr"] for t in kept]
        across = dyn["across_tasks"]["int8_dynamic"]
        bridge = (f"**What it bridges.** §5's scheme, torch's dynamic int8 with the head in fp32, flips the most here "
                  f"too: per-task NFR {pct(min(kept_nfr))}–{pct(max(kept_nfr))} % on the kept tasks (§5: 6–26 % on 100 "
                  f"items per task). With {min(sizes.values())}–{max(sizes.values())} items per task its accuracy "
                  f"loss is {'significant' if across['regression'] else 'not shown'} "
                  f"({signed(dyn['pooled']['new_acc'] - dyn['pooled']['old_acc'])} points pooled over the kept tasks; "
                  f"{signed(across['new_acc'] - across['old_acc'])} over all {len(sizes)}), where §5's per-task tests "
                  "on 100 items saw no significant change.")
        r = report.get("ratios") or {}
        if "int8_dynamic/int8_wo" in r and "int8_dynamic/quanto_int8" in r:
            a, b = r["int8_dynamic/int8_wo"], r["int8_dynamic/quanto_int8"]
            bridge += (f" The same 8 bits stored as weights break fewer answers: {a['counts'][0]} kept items broken "
                       f"against torchao's {a['counts'][1]} and quanto's {b['counts'][1]} — {ratio(a['ratio'])} and "
                       f"{ratio(b['ratio'])} times as many (95 % bootstrap intervals over the same resampled items "
                       f"{ratio(a['ci'][0])}–{ratio(a['ci'][1])} and {ratio(b['ci'][0])}–{ratio(b['ci'][1])}).")
        out += [bridge, ""]
    # speed
    tps = {s: rows[s]["tokens_per_second"] for s in order}
    fastest = max(tps, key=tps.get)
    slower = [s for s in order if tps[s] < ref["tokens_per_second"]]
    secs = ref["eval_seconds"] + sum(rows[s]["eval_seconds"] for s in rows)
    out += [f"**Speed and its limits.** Tokens per second are the scheme's teacher-forced forward on the KL texts "
            f"(batch 4), on the {m['cpu']}: {fastest} runs fastest ({tps[fastest]:,.0f}; this Xeon has AMX bf16 "
            f"units, an AVX2 machine will not see that); slower than fp32: {listing(slower)}. Other developers' tests "
            "shared the 2 cores during some of the registered runs (which ones is not in the records), so these are "
            f"single measurements, not medians, and the flips do not depend on them. The {len(rows) + 1} "
            f"registered evaluations (fp32, the floor and {len(order)} schemes) took {secs / 60:.0f} min in all; "
            "seconds per run are in each `meta.json`.", ""]
    return "\n".join(wrap(line) for line in out)


def wrap(paragraph: str, width: int = 118) -> str:
    """A paragraph or bullet as studies/results.md writes them (lines of up to `width`); tables and headings as they are."""
    import textwrap

    if paragraph.startswith(("|", "#")) or len(paragraph) <= width:
        return paragraph
    indent = "  " if paragraph.startswith("- ") else ""
    return textwrap.fill(paragraph, width=width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


# ---------------------------------------------------------------------------------------------------------------------
# the documents


def section_span(results: str) -> tuple[int, int]:
    """studies/results.md's § 11, from its heading to the next section (or the end)."""
    start = results.index("## 11. E6")
    nxt = results.find("\n## ", start + 1)
    return start, len(results) if nxt < 0 else nxt + 1


def table_cells(text: str) -> dict[str, str]:
    """{claim: its second cell} of the claims table in `text` (README's or studies/results.md's): the first table
    whose header starts with "| claim (paper) |"."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim (paper) |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    return rows


def mismatches(report: dict, readme: str, results: str, report_md: str) -> list[str]:
    """The E6 texts that differ from what the report renders to (empty: every number and verdict word is the
    report's)."""
    wrong = []
    try:
        start, end = section_span(results)
        if results[start:end].rstrip("\n") != section_11(report).rstrip("\n"):
            wrong.append("studies/results.md § 11")
    except ValueError:
        wrong.append("studies/results.md § 11 (not found)")
    for name, doc, rows in (("studies/results.md", results, results_rows(report)),
                            ("README", readme, readme_rows(report))):
        try:
            cells = table_cells(doc)
        except StopIteration:
            wrong.append(f"{name}'s claims table (not found)")
            continue
        for claim, text in rows.items():
            if cells.get(claim) != text:
                wrong.append(f"{name} row {claim!r}")
    if report_md != report_markdown(report):
        wrong.append("studies/results/e6/report.md")
    return wrong


def with_rows(text: str, rows: dict[str, str]) -> str:
    """`text` with the second cell of each claims-table row in `rows` replaced (the other cells kept)."""
    lines = text.splitlines(keepends=True)
    for claim, cell in rows.items():
        i = next(i for i, line in enumerate(lines) if line.startswith(f"| {claim} |"))
        cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
        lines[i] = f"| {claim} | {cell} | {cells[2]} |\n"
    return "".join(lines)


def write_documents(root) -> None:
    """Render studies/results.md's § 11 and the E6 rows of its claims table, and README's E6 rows, from
    studies/results/e6/report.json."""
    import json
    from pathlib import Path

    root = Path(root)
    report = json.loads((root / "studies/results/e6/report.json").read_text())
    results = (root / "studies/results.md").read_text()
    start, end = section_span(results)
    results = (results[:start] + section_11(report).rstrip("\n") + "\n" + ("\n" if end < len(results) else "")
               + results[end:])
    (root / "studies/results.md").write_text(with_rows(results, results_rows(report)))
    (root / "README.md").write_text(with_rows((root / "README.md").read_text(), readme_rows(report)))


if __name__ == "__main__":
    import sys
    from pathlib import Path

    write_documents(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
