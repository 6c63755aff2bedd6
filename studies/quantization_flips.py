"""Does quantizing a model flip its answers even where accuracy holds? (issue 14, experiment 5)

A model update users make every day: the same checkpoint served in lower precision. This script evaluates a model
in fp32, after torch's int8 dynamic quantization of its decoder's linear layers (CPU), and in bf16, on BIG-bench
multiple-choice tasks through lm-eval (zero-shot, log-likelihood of each choice), and compares each variant
against fp32 with adaptguard's flip metrics (paper 002 §3: NFR, PFR, BTC, McNemar p, a 95% bootstrap CI of NFR).

    python studies/quantization_flips.py                      # built:smollm2, 6 tasks x 100 items, int8
    python studies/quantization_flips.py --quick              # 3 tasks x 40 items, int8 (11 min on 2 busy cores)
    python studies/quantization_flips.py --variants int8,bf16 # bf16 too (about 4x slower than fp32 on most CPUs)
    python studies/quantization_flips.py --model Qwen/Qwen2.5-0.5B-Instruct --variants bf16 --limit 1000   # on a GPU
    python studies/quantization_flips.py --e6                 # E6 (studies/preregistration.md): every scheme, resumable
    python studies/quantization_flips.py --schemes nf4,int8_bnb --limit 50   # any subset of E6's schemes
    python studies/quantization_flips.py --e6 --report        # E6's report, recomputed from the committed records

`--schemes` loads each scheme through adaptguard's own quantization config (`models.loading.load_causal_lm`, as
`adaptguard update`'s `new_base.quantization` takes it) and, besides the comparison, records per scheme the memory of
its weights, its KL from fp32 on held-out texts and its forward speed; `--records DIR` keeps each finished scheme's
per-item scores (lm-eval's sample records without the prompt copies) so a killed run resumes at the next scheme.

Writes OUT/report.json, OUT/report.md and OUT/flips.png (one quadrant panel per task and variant), each variant's
lm-eval samples as a `--log_samples` run under OUT/runs/<variant>/ (the fp32 reference in OUT/runs/reference/, so
`adaptguard compare OUT/runs/reference OUT/runs/int8` works on them), and OUT/report_<variant>.html: the page of
what that variant broke, item by item.
Data: BIG-bench (Apache-2.0): `--bigbench` or $ADAPTGUARD_BIGBENCH (the sdist bigbench==1.0.0, an unpacked copy or a
checkout), else an installed bigbench, the cache, or the sdist fetched once from the package index (sha256-checked).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.compat.compare import compare_runs, compare_task
from adaptguard.compat.comparison import Comparison
from adaptguard.compat.render.figure import plot_quadrants
from adaptguard.compat.render.flips import flipped_documents
from adaptguard.compat.render.outputs import write_outputs
from adaptguard.data.bigbench import DEFAULT_TASKS, load_tasks, write_lm_eval_tasks
from adaptguard.models.embedded import resolve_model
from adaptguard.utils.quiet import hide_unused_library_noise
from adaptguard.utils.sweeps import command_line, machine_info, machine_line
from studies.common import write_lm_eval_generative_tasks, write_report


@dataclass
class Args:
    model: str = field(default="built:smollm2", metadata={"help": "Hub id, local path, built:<name> or embedded:<name>."})
    tasks: str = field(default=",".join(DEFAULT_TASKS), metadata={"help": "BIG-bench multiple-choice tasks."})
    bigbench: str | None = field(default=None, metadata={
        "help": "BIG-bench's data: bigbench-1.0.0.tar.gz, an unpacked copy or a checkout (else $ADAPTGUARD_BIGBENCH, "
                "an installed bigbench, the cache, the package index)."})
    # the defaults fit the 60-min budget on 2 CPU cores, where fp32 and int8 take 1-3 s per item and bf16 ~10 s
    limit: int = field(default=100, metadata={"help": "Items per task (the first ones, file order)."})
    variants: str = field(default="int8", metadata={"help": "Compared with fp32, comma-separated: int8 (torch "
                                                          "dynamic int8 quantization of nn.Linear, CPU only), bf16, "
                                                          "fp32 (a rerun: checks that nothing flips)."})
    batch_size: int = field(default=16, metadata={"help": "lm-eval batch size."})
    out: str = field(default="quantization-flips-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": "3 tasks x 40 items, int8 only (bf16 matmuls are slow on "
                                                         "most CPUs): a smoke run."})
    schemes: str = field(default="", metadata={"help": "Instead of --variants: quantization schemes a user can pick, "
                                                    "comma-separated, from " + ", ".join(["fp32"] + [
                                                        "nf4", "fp4", "int8_bnb", "int8_wo", "int4_wo", "quanto_int8",
                                                        "quanto_int4", "bf16", "fp16", "int8_dynamic"]) + "."})
    generated: str = field(default="", metadata={"help": "With --schemes: BIG-bench tasks with generated answers "
                                                      "(exact match, greedy, 8 new tokens), e.g. arithmetic."})
    generated_limit: int = field(default=400, metadata={"help": "Items of each --generated task (the first ones)."})
    floor: bool = field(default=False, metadata={"help": "With --schemes: evaluate fp32 again with batch size 5 on "
                                                         "one thread first: the evaluation's own noise floor."})
    scheme_floors: bool = field(default=False, metadata={"help": "With --schemes: then, on this machine, fp32 and "
                                                                 "every runnable scheme at the recorded setting and "
                                                                 "at batch 5 on one thread (records <scheme>_<cpu> "
                                                                 "and <scheme>_<cpu>_floor): each scheme's own floor "
                                                                 "(E6 amendment 3)."})
    rerun_tasks: str = field(default="", metadata={"help": "With --scheme_floors: the tasks the reruns evaluate "
                                                         "(lm-eval names, comma-separated; empty: all)."})
    batch_one: bool = field(default=False, metadata={"help": "With --scheme_floors: then fp32 and every scheme at "
                                                             "batch 1 on one thread (records <scheme>_b1)."})
    kl_texts: int = field(default=0, metadata={"help": "With --schemes: mean per-token KL(fp32 || scheme) on the "
                                                      "first N logiqa passages of `evals` (held out: not evaluated)."})
    records: str = field(default="", metadata={"help": "With --schemes: keep each finished scheme's per-item scores "
                                                      "in DIR/<scheme>/ and skip schemes already there (resume)."})
    e6: bool = field(default=False, metadata={"help": "E6 as registered: every scheme, six tasks x 400 items plus "
                                                      "arithmetic, the floor, KL on 200 texts, records in "
                                                      "studies/results/e6_records."})
    report: bool = field(default=False, metadata={"help": "With --schemes/--e6: only recompute the report from "
                                                          "--records."})


VARIANTS = ("int8", "bf16", "fp32")  # fp32: a second fp32 run, which must flip nothing (lm-eval scores are deterministic)

# E6's schemes: a quantization library's config as `load_causal_lm` (and `update`'s new_base.quantization) takes it,
# a dtype cast, or torch's dynamic int8 (§5's scheme). fp32 compute for the 4-bit ones: the comparison is with fp32.
_TORCHAO = "torchao"
SCHEMES = {
    "fp32": {"dtype": "float32"},
    "nf4": {"library": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_compute_dtype": "float32"},
    "fp4": {"library": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "fp4",
            "bnb_4bit_compute_dtype": "float32"},
    "int8_bnb": {"library": "bitsandbytes", "load_in_8bit": True},
    "int8_wo": {"library": _TORCHAO, "quant_type": {"_type": "Int8WeightOnlyConfig", "_version": 2, "_data": {}}},
    "int4_wo": {"library": _TORCHAO, "quant_type": {"_type": "Int4WeightOnlyConfig", "_version": 2,
                                                    "_data": {"group_size": 64}}},
    "quanto_int8": {"library": "quanto", "weights": "int8"},
    "quanto_int4": {"library": "quanto", "weights": "int4"},
    "bf16": {"dtype": "bfloat16"},
    "fp16": {"dtype": "float16"},
    "int8_dynamic": {"dtype": "float32", "dynamic_int8": True},
}
LOW_BIT = ("nf4", "fp4", "int4_wo", "quanto_int4")  # ≤ 4.5 bits per weight (H3)
FLOOR = "fp32_floor"  # fp32 again, batch 5 on one thread
# E6 amendment 3: each scheme's own floor, measured between two runs on one machine. Run names:
# <scheme>_<cpu> (the recorded batch and threads on this CPU; <cpu> is torch's kernel set, e.g. avx2), then
# <scheme>_<cpu>_floor (batch 5, one thread) and <scheme>_<cpu>_b1 (batch 1, one thread): {kind: (batch, threads)}
RERUNS = {"": None, "_floor": (5, 1), "_b1": (1, 1)}
# amendment 4: the two schemes whose kernels compute from the batch first, then amendment 3's order
RERUN_ORDER = ("int8_dynamic", "int8_bnb", "quanto_int4", "quanto_int8", "int8_wo", "fp4", "nf4", "fp16", "bf16")
_RERUN_NAME = re.compile(r"^(?P<scheme>.+?)_(?P<cpu>avx[0-9a-z]*|default|zvector|sve[0-9]*)(?P<kind>_floor|_b1)?$")


def cpu_tag() -> str:
    """This CPU's kernel set as torch picks it (avx2, avx512, …): the tag of the reruns made here."""
    return torch.backends.cpu.get_cpu_capability().lower()


def parse_run(name: str) -> tuple[str, str | None, str]:
    """(scheme, cpu tag or None for a recorded E6 run, kind): `nf4_avx2_floor` → (nf4, avx2, _floor)."""
    m = _RERUN_NAME.match(name)
    if m and m["scheme"] in SCHEMES:
        return m["scheme"], m["cpu"], m["kind"] or ""
    return ("fp32", None, "_floor") if name == "fp32_floor" else (name, None, "")


def load_scheme(path: str, scheme: str):
    spec = SCHEMES[scheme]
    if "library" in spec:
        from adaptguard.models.loading import load_causal_lm

        return load_causal_lm(path, spec, use_cpu=not torch.cuda.is_available()).eval()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, spec["dtype"]))
    if spec.get("dynamic_int8"):
        # the decoder's linear layers: weights int8 per tensor, activations quantized on the fly. The LM head stays
        # fp32, as usual (it is tied to the embeddings here, and lm-eval re-ties the weights)
        torch.ao.quantization.quantize_dynamic(model.base_model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    return model.eval()


def load_variant(path: str, variant: str):
    if variant not in VARIANTS:
        raise ValueError(f"--variants: unknown variant {variant!r}; use {', '.join(VARIANTS)}")
    return load_scheme(path, "int8_dynamic" if variant == "int8" else variant)


def main(args: Args) -> dict:
    hide_unused_library_noise()  # before lm-eval's imports load torchao and bitsandbytes (their import-time lines)
    if args.e6 or args.schemes:
        return run_schemes(args)
    from adaptguard.compat.harness.callback import evaluate_with_lm_eval, task_runs_from_output

    variants = ["int8"] if args.quick else args.variants.split(",")
    for variant in variants:  # fail before any output or the long reference run
        if variant not in VARIANTS:
            raise ValueError(f"--variants: unknown variant {variant!r}; use {', '.join(VARIANTS)}")
    names = args.tasks.split(",")[:3] if args.quick else args.tasks.split(",")
    limit = 40 if args.quick else args.limit
    out = Path(args.out)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = write_lm_eval_tasks(load_tasks(names, args.bigbench), out / "tasks", limit=limit)
    runs, seconds = [], {}
    for i, variant in enumerate(["fp32", *variants]):  # runs[0] is the reference; a listed fp32 is a second run
        start = time.perf_counter()
        output = evaluate_with_lm_eval(load_variant(path, variant), tokenizer, tasks, batch_size=args.batch_size,
                                       include_path=[out / "tasks"])
        runs.append(task_runs_from_output(output))
        save_run(output, out / "runs" / (variant if i else "reference"))
        seconds[variant if i else "fp32 (reference)"] = time.perf_counter() - start
        print(f"{variant}: " + ", ".join(f"{t} {output['results'][t]['acc,none']:.3f}" for t in tasks), flush=True)
    report = {"model": args.model, "limit": limit, "tasks": {}, "seconds": seconds, "machine": machine_info(),
              "command": command_line("studies/quantization_flips.py", args)}
    quadrants = Comparison(old="fp32", new="variant")
    for variant, variant_runs in zip(variants, runs[1:]):
        for task in tasks:
            (entry,) = compare_task(runs[0][task], variant_runs[task]).values()
            quadrants.tasks[f"{task}: fp32 → {variant}"] = entry
            report["tasks"][f"{task} {variant}"] = entry.metrics
    out.mkdir(parents=True, exist_ok=True)
    plot_quadrants(quadrants, out / "flips.png")
    write_report(out, report, markdown(report))
    for variant in variants:  # the page of each variant, from the saved runs as `adaptguard compare --html` makes it
        compared = compare_runs(out / "runs" / "reference", out / "runs" / variant)
        flips = [{"task": t, **f} for t, e in compared["tasks"].items() for f in flipped_documents(e)]
        write_outputs(compared, html_path=out / f"report_{variant}.html", flips=flips)
    return report


def save_run(output: dict, folder: Path) -> None:
    """lm-eval's in-memory samples and task configs as the files `lm_eval --log_samples --output_path` writes."""
    import json

    from lm_eval.utils import handle_non_serializable, sanitize_list

    from adaptguard.utils.files import atomic_write_text

    def as_logged(r: dict) -> dict:  # what lm-eval's EvaluationTracker.save_results_samples writes of a sample
        return {**r, "arguments": {f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(args)}
                                   for i, args in enumerate(r["arguments"])},
                "resps": sanitize_list(r["resps"]), "filtered_resps": sanitize_list(r["filtered_resps"]),
                "target": str(r["target"])}

    stamp = "2026-01-01T00-00-00.000000"
    for task, records in output["samples"].items():
        atomic_write_text(folder / f"samples_{task}_{stamp}.jsonl", "".join(
            json.dumps(as_logged(r), default=handle_non_serializable, ensure_ascii=False) + "\n" for r in records))
    atomic_write_text(folder / f"results_{stamp}.json", json.dumps(
        {"configs": output.get("configs", {}), "n-shot": output.get("n-shot", {})}, default=handle_non_serializable))


def markdown(report: dict) -> str:
    lines = [f"# Flips from quantization: {report['model']}", "",
             f"fp32 vs each variant on BIG-bench multiple-choice tasks (zero-shot, first {report['limit']} items "
             "each; lm-eval log-likelihood of each choice). NFR/PFR: share of items fp32 got right and the variant "
             "wrong / the reverse; BTC: share of fp32's right answers kept; p: McNemar's exact test.", "",
             "| task | variant | n | fp32 acc | variant acc | NFR (95% CI) | PFR | BTC | McNemar p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, e in report["tasks"].items():
        task, variant = key.rsplit(" ", 1)
        lo, hi = e["nfr_ci"]
        btc = "–" if e["btc"] is None else f"{e['btc']:.3f}"  # undefined where fp32 got nothing right
        lines.append(f"| {task} | {variant} | {e['n']} | {e['old_acc']:.3f} | {e['new_acc']:.3f} | "
                     f"{e['nfr']:.3f} ({lo:.3f}–{hi:.3f}) | {e['pfr']:.3f} | {btc} | {e['mcnemar_p']:.3g} |")
    lines += ["", "![flips](flips.png)", "",
              f"Reproduce: `{report['command']}`. Time per variant: "
              + ", ".join(f"{v} {s:.0f} s" for v, s in report["seconds"].items()) + ". " + machine_line(report["machine"]),
              ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# E6 (studies/preregistration.md § E6): every scheme against fp32, with records a later run resumes from


E6 = {"tasks": ",".join(DEFAULT_TASKS), "limit": 400, "schemes": ",".join(s for s in SCHEMES if s != "fp32"),
      "generated": "arithmetic", "generated_limit": 400, "floor": True, "kl_texts": 200,
      "records": "studies/results/e6_records", "batch_size": 16, "scheme_floors": True,
      "rerun_tasks": "bb_general_knowledge,bb_hindu_knowledge"}  # amendment 4 (fp32_avx2 ran on all four kept tasks)
RECORD_KEYS = ("doc_id", "doc_hash", "prompt_hash", "target_hash", "filter", "metrics", "acc", "acc_norm",
               "exact_match")


def weight_bytes(model) -> int:
    """Bytes the model's parameters and buffers hold, counted in their stored form: a tensor subclass (torchao,
    quanto) by its inner tensors, a bitsandbytes parameter with its quantization state; tied tensors once."""
    seen, total = set(), 0

    def stored(t) -> int:
        if hasattr(type(t), "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
            names, _ = t.__tensor_flatten__()
            return sum(stored(getattr(t, n)) for n in names)
        return t.numel() * t.element_size()

    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += stored(t)
        state = getattr(t, "quant_state", None)  # bitsandbytes 4-bit: absmax, code, nested state
        if state is not None:
            total += sum(v.numel() * v.element_size() for v in state.as_dict(packed=True).values()
                         if isinstance(v, torch.Tensor))
        scb = getattr(t, "SCB", None)  # bitsandbytes LLM.int8: one scale per row
        if isinstance(scb, torch.Tensor):
            total += scb.numel() * scb.element_size()
    for module in model.modules():  # torch's dynamic int8 Linear keeps its weight packed, outside the parameters
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            total += sum(t.numel() * t.element_size() for t in module._weight_bias() if t is not None)
    return total


@torch.no_grad()
def kl_from_reference(reference, model, tokenizer, texts: list[str], batch: int = 4, max_length: int = 512) -> dict:
    """Per text, the sum over its tokens of KL(reference ‖ model) of the next-token distributions (teacher-forced)
    and the number of tokens; and the seconds `model`'s own forward passes took (for tokens per second)."""
    sums, counts, seconds = [], [], 0.0
    for start in range(0, len(texts), batch):
        enc = tokenizer(texts[start:start + batch], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_length)
        mask = enc["attention_mask"].bool()
        ref = reference(**enc).logits.float().log_softmax(-1)
        tick = time.perf_counter()
        logits = model(**enc).logits
        seconds += time.perf_counter() - tick
        kl = (ref.exp() * (ref - logits.float().log_softmax(-1))).sum(-1)  # (batch, length)
        sums += kl.masked_fill(~mask, 0).sum(1).tolist()
        counts += mask.sum(1).tolist()
    return {"sum": sums, "tokens": counts, "forward_seconds": seconds}


def slim_records(output: dict) -> dict[str, str]:
    """lm-eval's sample records with the per-item fields `compare` reads (ids, hashes, answers, scores, and a
    multiple-choice item's continuations, which give its chance rate), without the copies of the prompt (`doc`, the
    requests' contexts, raw `resps`): {task: JSONL text}."""
    import json

    from lm_eval.utils import handle_non_serializable, sanitize_list

    def slim(r: dict) -> dict:
        args = r["arguments"]  # in memory: one tuple per request; as logged: {"gen_args_i": {"arg_0", "arg_1"}}
        args = [a for _, a in sorted(args.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))] \
            if isinstance(args, dict) else [{"arg_1": a[1]} if len(a) > 1 else {} for a in args]
        choices = {f"gen_args_{i}": {"arg_1": a["arg_1"]} for i, a in enumerate(args)
                   if isinstance(a.get("arg_1"), str)}
        return {**{k: r[k] for k in RECORD_KEYS if k in r}, "target": str(r["target"]),
                "filtered_resps": sanitize_list(r["filtered_resps"]), **({"arguments": choices} if choices else {})}

    return {task: "".join(json.dumps(slim(r), default=handle_non_serializable) + "\n" for r in records)
            for task, records in output["samples"].items()}


def library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "lm_eval", "bitsandbytes", "torchao", "optimum-quanto"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


@contextlib.contextmanager
def logged(name: str):
    """The lines logged under `name` while the block runs (besides their usual output)."""
    import logging

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.extend(record.getMessage().splitlines())
    logging.getLogger(name).addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger(name).removeHandler(handler)


def run_schemes(args: Args) -> dict:
    """Evaluate fp32 (and its floor rerun) and each scheme, keep each finished one's records, then report."""
    import dataclasses
    import json
    import os
    import shutil

    from adaptguard.compat.harness.callback import evaluate_with_lm_eval
    from adaptguard.data.bigbench import load_generative_task
    from adaptguard.utils.files import atomic_write_text

    asked = args  # the command line names what the user gave (--e6), not what it expands to
    if args.e6:
        args = dataclasses.replace(args, **{k: v for k, v in E6.items() if getattr(args, k) == getattr(Args, k)})
    schemes = [s for s in args.schemes.split(",") if s and s != "fp32"]
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise ValueError(f"--schemes: unknown {', '.join(map(repr, unknown))}; use {', '.join(SCHEMES)}")
    out = Path(args.out)
    records = Path(args.records) if args.records else out / "records"
    order = ["fp32", *([FLOOR] if args.floor else []), *schemes]
    reruns = scheme_reruns(schemes, args) if args.scheme_floors else []
    if args.report and args.scheme_floors:
        # the report reads the reruns the records hold, made on whichever CPU they were made on: not this one's tag
        tags = sorted({parse_run(p.name)[1] for p in records.iterdir() if p.is_dir()} - {None}) if records.is_dir() else []
        reruns = [r for tag in tags for r in scheme_reruns(schemes, args, tag)] or reruns
    if args.report:
        return write_schemes_report(records, order, out, asked, reruns)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tasks = write_lm_eval_tasks(load_tasks(args.tasks.split(","), args.bigbench), out / "tasks", limit=args.limit)
    if args.generated:
        generated = {name: load_generative_task(name, args.bigbench) for name in args.generated.split(",")}
        tasks += write_lm_eval_generative_tasks(generated, out / "tasks", limit=args.generated_limit)
    texts = []
    if args.kl_texts:
        from studies.openai_evals import load_set

        texts = [r["input"] for r in load_set("logiqa")[:args.kl_texts]]
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    for scheme in order + reruns:
        if (records / scheme / "meta.json").exists():
            print(f"{scheme}: recorded in {records / scheme}, skipped", flush=True)
            continue
        base, _, kind = parse_run(scheme)
        if scheme in reruns and not json.loads((records / base / "meta.json").read_text())["runnable"]:
            continue  # a scheme that did not run in E6 has no rerun
        batch_size, n_threads = RERUNS[kind] or (args.batch_size, threads)
        run_tasks = [t for t in tasks if t in args.rerun_tasks.split(",")] if scheme in reruns and args.rerun_tasks \
            else tasks
        meta = {"scheme": scheme, "spec": SCHEMES[base], "model": args.model, "batch_size": batch_size,
                "threads": n_threads, "tasks": run_tasks, "machine": machine_info(), "versions": library_versions(),
                "loadavg_start": os.getloadavg()}
        partial = records / f".{scheme}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            tick = time.perf_counter()
            with logged("transformers") as lines:  # transformers reports a failed weight conversion in its log
                model = reference if base == "fp32" else load_scheme(path, base)
            meta["load_seconds"] = time.perf_counter() - tick
            torch.set_num_threads(meta["threads"])
            try:
                tick = time.perf_counter()
                output = evaluate_with_lm_eval(model, tokenizer, run_tasks, batch_size=meta["batch_size"],
                                               include_path=[out / "tasks"])
                meta["eval_seconds"] = time.perf_counter() - tick
                meta["loadavg_end"] = os.getloadavg()  # other users of the cores show here, not in the seconds
            finally:
                torch.set_num_threads(threads)
        except Exception as e:  # reported as not runnable here, with its error, never dropped
            causes = list(dict.fromkeys(line.strip() for line in lines if "Error" in line or "Requires" in line))[:2]
            meta |= {"runnable": False, "error": "; ".join([f"{type(e).__name__}: {e}", *causes])}
            print(f"{scheme}: not runnable here: {meta['error'][:300]}", flush=True)
        else:
            meta |= {"runnable": True, "weight_bytes": weight_bytes(model),
                     "accuracy": {t: output["results"][t].get("acc,none", output["results"][t].get(
                         "exact_match,none")) for t in run_tasks}}
            if texts and scheme != FLOOR and scheme not in reruns:
                kl = kl_from_reference(reference, model, tokenizer, texts)
                meta["tokens_per_second"] = sum(kl["tokens"]) / kl["forward_seconds"]
                meta["kl_mean"] = sum(kl["sum"]) / sum(kl["tokens"])
                atomic_write_text(partial / "kl.json", json.dumps({k: kl[k] for k in ("sum", "tokens")}))
            for task, text in slim_records(output).items():
                atomic_write_text(partial / f"samples_{task}_2026-01-01T00-00-00.000000.jsonl", text)
            save_run(output, out / "runs" / scheme)
            print(f"{scheme}: " + ", ".join(f"{t} {a:.3f}" for t, a in meta["accuracy"].items())
                  + f" ({meta['eval_seconds']:.0f} s)", flush=True)
        atomic_write_text(partial / "meta.json", json.dumps(meta, indent=1))
        shutil.rmtree(records / scheme, ignore_errors=True)  # a folder without meta.json: an older unfinished copy
        os.replace(partial, records / scheme)  # the scheme's records appear whole or not at all
        if meta["runnable"] and scheme != "fp32" and scheme not in reruns:
            runs = out / "runs" if (out / "runs" / "fp32").exists() else records  # resumed: the records' page
            compared = compare_runs(runs / "fp32", runs / scheme)
            flips = [{"task": t, **f} for t, e in compared["tasks"].items() for f in flipped_documents(e)]
            write_outputs(compared, html_path=out / f"report_{scheme}.html", flips=flips)
    return write_schemes_report(records, order, out, asked, reruns)


def scheme_reruns(schemes: list[str], args: Args, tag: str | None = None) -> list[str]:
    """E6 amendment 3's runs on this machine, in their registered order: fp32 at the recorded setting, each scheme at
    the recorded setting and at its floor's (cheapest first, the 16-bit casts last), fp32's floor, then (with
    `batch_one`, or for the report) batch 1."""
    tag = tag or cpu_tag()
    ranked = [s for s in RERUN_ORDER if s in schemes] + [s for s in schemes if s not in RERUN_ORDER]
    runs = [f"fp32_{tag}", *(f"{s}_{tag}{k}" for s in ranked for k in ("", "_floor")), f"fp32_{tag}_floor"]
    return runs + ([f"{s}_{tag}_b1" for s in ranked] if args.batch_one or args.report else [])


def item_scores(folder: Path) -> dict[str, dict[int, float]]:
    """{task: {doc_id: 0/1 score}} of a records folder (acc for multiple choice, exact_match for generated)."""
    import json

    scores = {}
    for file in sorted(folder.glob("samples_*.jsonl")):
        task = file.name.removeprefix("samples_").rsplit("_", 1)[0]
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        scores[task] = {r["doc_id"]: float(r["acc"] if "acc" in r else r["exact_match"]) for r in rows}
    return scores


def pooled_vectors(ref: dict, new: dict, kept: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """fp32's and a scheme's 0/1 scores over the kept tasks' items, in one fixed order."""
    keys = [(t, d) for t in kept for d in sorted(ref[t])]
    return np.array([ref[t][d] for t, d in keys]), np.array([new[t][d] for t, d in keys])


def hidden_flips(old: np.ndarray, new: np.ndarray) -> float:
    """H1's statistic: NFR − |Δ accuracy| (items fp32 had right and the scheme wrong, minus the net change)."""
    return float(np.mean(old * (1 - new)) - abs(np.mean(new) - np.mean(old)))


def write_schemes_report(records: Path, order: list[str], out: Path, args: Args, reruns=()) -> dict:
    """E6's table and the three registered decisions, from the records alone."""
    import json

    from scipy.stats import binomtest, spearmanr

    from adaptguard.compat.stats.replicates import benjamini_hochberg

    metas = {s: json.loads((records / s / "meta.json").read_text()) for s in order
             if (records / s / "meta.json").exists()}
    if "fp32" not in metas:
        raise FileNotFoundError(f"{records}/fp32/meta.json: no fp32 reference recorded yet; run without --report")
    ran = [s for s in order if s != "fp32" and metas.get(s, {}).get("runnable")]
    ref = item_scores(records / "fp32")
    first = compare_runs(records / "fp32", records / ran[0]) if ran else {"tasks": {}}
    churn = sorted(t for t, e in first["tasks"].items() if (e.get("churn") or {}).get("churn"))
    kept = [t for t in ref if t not in churn]
    report = {"model": metas["fp32"]["model"], "records": str(records), "kept_tasks": kept, "churn_tasks": churn,
              "not_runnable": {s: metas[s]["error"] for s in order if s in metas and not metas[s]["runnable"]},
              "not_run": [s for s in order if s not in metas], "schemes": {},
              "complete": all(s in metas for s in order),  # the decisions are final only over every scheme
              "machine": metas["fp32"]["machine"], "versions": metas["fp32"]["versions"]}
    fp32 = metas["fp32"]
    report["reference"] = {k: fp32.get(k) for k in ("weight_bytes", "tokens_per_second", "eval_seconds",
                                                    "batch_size", "threads")}
    if FLOOR in metas:
        report["reference"]["floor_setting"] = [metas[FLOOR]["batch_size"], metas[FLOOR]["threads"]]
    vectors, kl_texts = {}, {}
    for scheme in ran:
        meta, scores = metas[scheme], item_scores(records / scheme)
        compared = compare_runs(records / "fp32", records / scheme)
        old, new = pooled_vectors(ref, scores, kept)
        vectors[scheme] = new
        row = {"tasks": {t: {k: e[k] for k in ("n", "old_acc", "new_acc", "nfr", "pfr", "nfr_ci")}
                         for t, e in compared["tasks"].items()},
               "pooled": {"n": len(old), "old_acc": float(old.mean()), "new_acc": float(new.mean()),
                          "nfr": float(np.mean(old * (1 - new))), "pfr": float(np.mean((1 - old) * new))},
               "across_tasks": compared.get("across_tasks"), "weight_bytes": meta["weight_bytes"],
               "eval_seconds": meta["eval_seconds"], "tokens_per_second": meta.get("tokens_per_second"),
               "kl_mean": meta.get("kl_mean")}
        if scheme != FLOOR and FLOOR in ran:
            floored = compare_runs([records / "fp32", records / FLOOR], records / scheme)
            row["excess_nfr"] = {t: (e.get("replicates") or {}).get("excess_nfr") for t, e in floored["tasks"].items()}
        if (records / scheme / "kl.json").exists():
            kl_texts[scheme] = json.loads((records / scheme / "kl.json").read_text())
        report["schemes"][scheme] = row
    old = pooled_vectors(ref, ref, kept)[0]
    schemes = [s for s in ran if s != FLOOR]
    floor_nfr = report["schemes"][FLOOR]["pooled"]["nfr"] if FLOOR in ran else 0.0
    rng = np.random.default_rng(0)
    boot_items = rng.integers(0, len(old), size=(10_000, len(old)))
    # H1: per scheme, NFR − |Δacc| with a percentile bootstrap over items, in counts (amendment 3): per resample
    # n·(NFR − |Δacc|) = min(pos, 2·neg − pos), an integer, and the percentile's interpolation in rationals
    h1, floor_neg = {}, int(np.sum(old * (1 - vectors[FLOOR]))) if FLOOR in ran else 0
    for s in schemes:
        neg_i, pos_i = (old * (1 - vectors[s])).astype(np.int64), ((1 - old) * vectors[s]).astype(np.int64)
        neg, pos = neg_i[boot_items].sum(1), pos_i[boot_items].sum(1)
        counts = np.sort(np.minimum(pos, 2 * neg - pos))
        lo, hi = (exact_percentile(counts, q) for q in (Fraction(25, 1000), Fraction(975, 1000)))
        n_neg, n_pos = int(neg_i.sum()), int(pos_i.sum())
        h1[s] = {"statistic": hidden_flips(old, vectors[s]), "ci": [float(lo / len(old)), float(hi / len(old))],
                 "right_to_wrong": n_neg, "wrong_to_right": n_pos, "statistic_count": min(n_pos, 2 * n_neg - n_pos),
                 "ci_counts": [str(lo), str(hi)], "supported": lo > 0,
                 # no wrong → right item: the statistic is 0 in every resample, H1 can never be supported
                 "zero_by_construction": n_pos == 0, "above_floor": n_neg > floor_neg}
    judged = [s for s in schemes if h1[s]["above_floor"]]
    report["H1"] = {"per_scheme": h1, "floor_pooled_nfr": floor_nfr, "floor_right_to_wrong": floor_neg,
                    "holds": bool(judged) and all(h1[s]["supported"] for s in judged)}
    # "fewer" as a ratio: torch's dynamic int8 against each 8-bit weight-only scheme, right → wrong counts, with the
    # percentile interval over the same resampled items (a resample where the other broke nothing: infinite)
    report["ratios"] = {}
    for other in ("int8_wo", "quanto_int8"):
        if "int8_dynamic" in schemes and other in schemes:
            a_i, b_i = (old * (1 - vectors["int8_dynamic"])), (old * (1 - vectors[other]))
            a, b = a_i[boot_items].sum(1), b_i[boot_items].sum(1)
            with np.errstate(divide="ignore"):
                ratio = np.where(b > 0, a / np.maximum(b, 1), np.inf)
            lo, hi = np.percentile(ratio, [2.5, 97.5])
            report["ratios"][f"int8_dynamic/{other}"] = {"counts": [int(a_i.sum()), int(b_i.sum())],
                                                        "ratio": float(a_i.sum() / b_i.sum()),
                                                        "ci": [float(lo), float(hi)]}
    # H2: Spearman's rho of mean KL against pooled NFR, bootstrap over items and texts jointly
    with_kl = [s for s in schemes if s in kl_texts]
    if len(with_kl) >= 3:
        sums = np.array([kl_texts[s]["sum"] for s in with_kl])
        tokens = np.array(kl_texts[with_kl[0]]["tokens"], dtype=float)
        nfrs = np.array([np.mean(old * (1 - vectors[s])) for s in with_kl])
        rho = float(spearmanr(sums.sum(1) / tokens.sum(), nfrs).statistic)
        boot_texts = rng.integers(0, len(tokens), size=(10_000, len(tokens)))
        rhos = []
        for i, j in zip(boot_items, boot_texts):
            nfr_b = [np.mean(old[i] * (1 - vectors[s][i])) for s in with_kl]
            rhos.append(spearmanr(sums[:, j].sum(1) / tokens[j].sum(), nfr_b).statistic)
        lo, hi = np.nanpercentile(rhos, [2.5, 97.5])  # a resample where every NFR ties has no rho: counted, left out
        kls, negs = sums.sum(1) / tokens.sum(), [int(np.sum(old * (1 - vectors[s]))) for s in with_kl]
        reversed_pairs = [[a, b] for i, a in enumerate(with_kl) for j, b in enumerate(with_kl)
                          if i < j and (kls[i] - kls[j]) * (negs[i] - negs[j]) < 0]
        report["H2"] = {"schemes": with_kl, "rho": rho, "ci": [float(lo), float(hi)],
                        "resamples_without_rho": int(np.isnan(rhos).sum()),
                        "supported": bool(rho >= 0.7 and lo > 0),
                        # pairs whose KL order is not their NFR order, of all the pairs
                        "reversed_pairs": reversed_pairs, "pairs": len(with_kl) * (len(with_kl) - 1) // 2}
        cut = [int(t) for t in tokens]
        report["kl_texts"] = {"n": len(cut), "max_length": 512, "at_max_length": sum(t >= 512 for t in cut)}
    else:
        report["H2"] = {"schemes": with_kl, "rho": None, "supported": None,
                        "reason": f"{len(with_kl)} schemes with KL; Spearman's rho needs 3 or more"}
    # H3: the lowest pooled NFR at ≤ 4.5 bits, and whether it flips fewer than each other low-bit scheme
    low = [s for s in LOW_BIT if s in schemes]
    if len(low) >= 2:
        best = min(low, key=lambda s: report["schemes"][s]["pooled"]["nfr"])
        flips = {s: old * (1 - vectors[s]) for s in low}
        tests = {}
        for other in (s for s in low if s != best):
            b = int(np.sum(flips[best] * (1 - flips[other])))  # best flipped, other did not
            c = int(np.sum(flips[other] * (1 - flips[best])))
            tests[other] = {"best_only": b, "other_only": c,
                            "p": binomtest(b, b + c, 0.5, alternative="less").pvalue if b + c else 1.0}
        rejected, _ = benjamini_hochberg([t["p"] for t in tests.values()], 0.05)
        # registered: BH over 3 pairs; the pairs of a scheme that did not run count as p = 1 in this check
        registered_pairs = len(LOW_BIT) - 1
        padded, _ = benjamini_hochberg([t["p"] for t in tests.values()] + [1.0] * (registered_pairs - len(tests)),
                                       0.05)
        report["H3"] = {"candidates": low, "lowest": best, "tests": tests,
                        "best": best if all(rejected) else None, "pairs_tested": len(tests),
                        "pairs_registered": registered_pairs,
                        "best_with_missing_pairs_at_p1": best if all(padded) else None}
    else:
        report["H3"] = {"candidates": low, "best": None, "reason": "fewer than two low-bit schemes ran"}
    if FLOOR in ran:  # the registered floor's answers, and how far its log-likelihoods moved (all seven tasks)
        report["floor_loglikelihoods"] = loglikelihood_drift(records / "fp32", records / FLOOR)
    report["floors"] = scheme_floors(records, list(reruns), kept, ref, ran) if reruns else None
    report["command"] = command_line("studies/quantization_flips.py", args) + ("" if args.report else " --report")
    out.mkdir(parents=True, exist_ok=True)
    write_report(out, report, schemes_markdown(report))
    return report


def exact_percentile(sorted_counts: np.ndarray, q: Fraction) -> Fraction:
    """numpy's default (linear) percentile of sorted integers, in rationals: its sign is exact."""
    h = q * (len(sorted_counts) - 1)
    k = int(h)
    lo = Fraction(int(sorted_counts[k]))
    return lo if k + 1 >= len(sorted_counts) else lo + (h - k) * (int(sorted_counts[k + 1]) - lo)


def changed_answers(a: np.ndarray, b: np.ndarray) -> dict:
    """Two runs' 0/1 scores on the same items: right → wrong, wrong → right, their sum, and an exact (Clopper–Pearson)
    95 % interval over items on the changed share (one pair of runs: items only)."""
    from scipy.stats import binomtest

    neg, pos = int(np.sum(a * (1 - b))), int(np.sum((1 - a) * b))
    ci = binomtest(neg + pos, len(a)).proportion_ci(0.95, method="exact")
    return {"n": len(a), "right_to_wrong": neg, "wrong_to_right": pos, "changed": neg + pos,
            "changed_ci": [float(ci.low), float(ci.high)]}


def loglikelihood_drift(a: Path, b: Path, tasks: list[str] | None = None) -> dict:
    """How far two runs' multiple-choice log-likelihoods (lm-eval's `filtered_resps`, kept in the records) moved on
    the items both have: requests compared, how many differ, the largest difference, and the smallest gap between
    the two likeliest choices in run `a` (an answer can change only where a difference reaches that gap)."""
    import json

    def lls(folder: Path) -> dict:
        rows = {}
        for file in sorted(folder.glob("samples_*.jsonl")):
            task = file.name.removeprefix("samples_").rsplit("_", 1)[0]
            if tasks is not None and task not in tasks:
                continue
            for line in file.read_text().splitlines():
                r = json.loads(line)
                if "acc" in r:
                    rows[task, r["doc_id"]] = [float(x[0]) for x in r["filtered_resps"]]
        return rows

    x, y = lls(a), lls(b)
    common = sorted(set(x) & set(y))
    diffs = np.concatenate([np.abs(np.subtract(x[k], y[k])) for k in common]) if common else np.zeros(0)
    margins = [np.diff(sorted(x[k])[-2:])[0] for k in common if len(x[k]) > 1]
    return {"requests": int(diffs.size), "differing": int(np.sum(diffs > 0)),
            "max_abs_diff": float(diffs.max()) if diffs.size else 0.0,
            "min_top_two_margin": float(min(margins)) if margins else None}


def excess_nfr(sides: tuple, tasks: list[str], vectors) -> dict:
    """`compare`'s replicate mode on (fp32 here, the scheme here, its floor) over `tasks`, at 95 %."""
    from adaptguard.compat.stats.replicates import replicate_flips

    fp32, here, floor = sides
    rf = replicate_flips(vectors(fp32, tasks)[None], np.stack([vectors(here, tasks), vectors(floor, tasks)]),
                         level=0.95)
    return {k: rf[k] for k in ("n", "runs", "nfr", "pfr", "noise_floor", "excess_nfr", "se", "df", "ci", "p_value")}


def scheme_floors(records: Path, reruns: list[str], kept: list[str], ref: dict, ran: list[str]) -> dict:
    """E6 amendment 3, from the rerun records: per scheme its own floor (the recorded setting against batch 5 on one
    thread, on one machine), the excess NFR over fp32 beyond it as `compare`'s replicate mode computes it
    (`replicate_flips(old=[fp32 here], new=[scheme here, its floor])` at 95 %: items and runs), and what the CPU
    alone changed (the recorded run against the same setting here); per kept task and pooled over them."""
    import json

    have = {r for r in reruns if (records / r / "meta.json").exists()}
    scores = {r: item_scores(records / r) for r in have}
    metas = {r: json.loads((records / r / "meta.json").read_text()) for r in have}
    tags = sorted({parse_run(r)[1] for r in reruns})
    out = {"runs": {r: {k: metas[r].get(k) for k in ("batch_size", "threads", "tasks", "eval_seconds",
                                                   "loadavg_start", "loadavg_end")} | {"machine": metas[r]["machine"]}
                    for r in reruns if r in have},
           "not_run": [r for r in reruns if r not in have and parse_run(r)[0] in ("fp32", *ran)],
           "schemes": {}}
    notes = records / "amendment3_shared.json"  # what else ran on the cores during a run, as the session saw it
    out["shared"] = json.loads(notes.read_text()) if notes.exists() else {}

    def vectors(run_scores: dict, tasks: list[str]) -> np.ndarray:
        return np.array([run_scores[t][d] for t in tasks for d in sorted(ref[t])])

    for base in ["fp32", *(s for s in RERUN_ORDER if s in ran)]:
        for tag in tags:
            here, floor, fp32_here = f"{base}_{tag}", f"{base}_{tag}_floor", f"fp32_{tag}"
            recorded = ref if base == "fp32" else item_scores(records / base)
            row = {"here": here, "floor": floor}
            tasks = [t for t in kept if here in have and t in scores[here]]
            if tasks:  # a rerun on none of the kept tasks says nothing here
                row["tasks"] = tasks
                row["cpu_alone"] = {"pooled": changed_answers(vectors(recorded, tasks), vectors(scores[here], tasks)),
                                    "loglikelihoods": loglikelihood_drift(records / base, records / here, tasks),
                                    "per_task": {t: changed_answers(vectors(recorded, [t]), vectors(scores[here], [t]))
                                                 for t in tasks}}
            tasks = [t for t in tasks if floor in have and t in scores[floor]]
            if tasks:
                row["own_floor"] = {"pooled": changed_answers(vectors(scores[here], tasks),
                                                              vectors(scores[floor], tasks)),
                                    "loglikelihoods": loglikelihood_drift(records / here, records / floor, tasks),
                                    "per_task": {t: changed_answers(vectors(scores[here], [t]),
                                                                    vectors(scores[floor], [t])) for t in tasks}}
                if base != "fp32" and fp32_here in have:
                    sides = (scores[fp32_here], scores[here], scores[floor])
                    row["excess"] = {"pooled": excess_nfr(sides, tasks, vectors),
                                     "per_task": {t: excess_nfr(sides, [t], vectors) for t in tasks}}
                    lo = row["excess"]["pooled"]["ci"][0]
                    row["beyond_own_floor"] = bool(lo > 0)
            row["flips_by_batch_alone"] = row["own_floor"]["pooled"]["changed"] > 0 if "own_floor" in row else None
            out["schemes"][base if len(tags) == 1 else f"{base}_{tag}"] = row
    return out


def schemes_markdown(report: dict) -> str:
    """report.md, as studies/e6_text.py renders every E6 text from the report."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("e6_text", Path(__file__).with_name("e6_text.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.report_markdown(report)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
