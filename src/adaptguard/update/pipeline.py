"""`adaptguard update CONFIG`: paper 002's model-update experiment in one command.

Train a task LoRA adapter on the old base (v1) and on the new base (v2), evaluate both on the test
set, measure compatibility, train the MUSCLE compatibility adapter (on v2, from v2's task adapter,
distilled from both task models), evaluate it, and write `report.json`, `report.md` (paper 002
Tables 3–6 layout) and flip-quadrant plots into the output directory.

CONFIG is a JSON file (see `UpdateConfig`); `--preset tiny` runs on the embedded default
(bases `tiny` → `tiny-v2`, their knowledge asked in six question phrasings). `--seeds N` repeats the
experiment over N seeds (`run_update_seeds`) and reports the mean and min–max of every rate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..models.embedded import resolve_model
from ..models.loading import load_causal_lm
from ..utils.files import atomic_write_text, finished_dir
from ..utils.generation import answer_text, exact_match, generate_answers, prompt_key
from ..utils.lora import default_lora_targets
from .config import UpdateConfig
from .report import seeds_markdown, update_markdown

logger = logging.getLogger(__name__)


def _rows(spec, split: str) -> list[dict]:
    if isinstance(spec, list):
        return spec
    from ..utils.data import load_any_dataset

    return list(load_any_dataset(spec, split))


def _training_kwargs(cfg: UpdateConfig, **specific) -> dict:
    """Training arguments shared by the three trainings; `extra_args` overrides the defaults."""
    from ..trl_adapter import no_activation_checkpointing

    kwargs = dict(per_device_train_batch_size=cfg.batch_size, max_length=cfg.max_length, bf16=False,
                  **no_activation_checkpointing(), use_cpu=cfg.use_cpu, report_to="none", save_strategy="no",
                  disable_tqdm=True, seed=cfg.seed, logging_steps=10)
    return {**kwargs, **specific, **cfg.extra_args}


def _train_task_adapter(cfg: UpdateConfig, base: str, train_rows, out: Path, tokenizer,
                        desc: str = "task adapter", quantization: dict | None = None) -> Path:
    import hashlib

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback

    from ..talr.config import TALRConfig
    from ..talr.trainer import TALRTrainer
    from ..utils.progress import TrainingProgress, say

    # a finished adapter of the same training (a re-run, e.g. with another mask) is reused, not trained again
    rows_hash = hashlib.sha256(json.dumps(train_rows, sort_keys=True).encode()).hexdigest()
    key = {"base": base, **({"quantization": quantization} if quantization else {}), "rows": rows_hash,
           **{k: getattr(cfg, k) for k in ("lora_r", "lora_alpha", "task_learning_rate", "task_epochs", "batch_size",
                                            "max_length", "seed", "extra_args")}}
    marker = out / "adaptguard_task_adapter.json"
    if marker.exists() and json.loads(marker.read_text()) == key:
        say(f"{desc}: reusing the finished adapter in {out} (same base, data and settings)")
        return out
    with finished_dir(out) as tmp:
        args = TALRConfig(**_training_kwargs(cfg, output_dir=str(tmp / "run"), weighting="none",
                                             learning_rate=cfg.task_learning_rate, num_train_epochs=cfg.task_epochs))
        model = load_causal_lm(base, quantization, use_cpu=cfg.use_cpu)
        trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(train_rows),
                              processing_class=tokenizer,
                              peft_config=LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                     target_modules=default_lora_targets(model), task_type="CAUSAL_LM"))
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(TrainingProgress(desc))
        trainer.train()
        trainer.model.save_pretrained(tmp)
        (tmp / marker.name).write_text(json.dumps(key))
    return out


def load_new_base(cfg: UpdateConfig):
    """The new base as the update ships it: another model, or the old one quantized."""
    return load_causal_lm(cfg.new_base_path, cfg.new_quantization, use_cpu=cfg.use_cpu)


def v1_task_model(cfg: UpdateConfig, v1_adapter: Path | str | None):
    """v1's task model: the old base with its task adapter merged (the teacher of every distilling arm), or the
    user's full v1 (`old_model`)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if v1_adapter is None:
        return AutoModelForCausalLM.from_pretrained(cfg.old_model)
    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(cfg.old_base), v1_adapter).merge_and_unload()


def old_tokenizer_source(cfg: UpdateConfig) -> str:
    return cfg.old_model if cfg.old_is_full_model else cfg.old_base


def check_user_models(cfg: UpdateConfig) -> None:
    """The user's v1 adapter must be an adapter of `old_base`, v2's of the new base; read before anything is written
    (a Hub adapter's config is fetched here). One line naming the field."""
    from .config import adapter_base, model_kind, same_model

    for name, base in (("old_model", cfg.old_base), ("new_adapter", cfg.new_base_path)):
        spec = getattr(cfg, name)
        if spec is None or model_kind(spec) == "full":
            continue
        trained_on = adapter_base(spec)
        if trained_on is None:  # a Hub id
            from peft import PeftConfig

            try:
                trained_on = PeftConfig.from_pretrained(spec).base_model_name_or_path
            except Exception as err:  # noqa: BLE001 - offline, missing, or not an adapter: say which field
                raise ValueError(f"{name}: {spec}: cannot read it as a PEFT adapter ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0][:200]})") from None
        if trained_on and not same_model(trained_on, base):
            field_of_base = "old_base" if name == "old_model" else "new_base"
            raise ValueError(f"{name}: the adapter {spec} was trained on {trained_on!r}, but {field_of_base} is "
                             f"{base!r}; set {field_of_base} to the adapter's base")


def _v2_task_model(cfg: UpdateConfig, v2_adapter: Path | None):
    """v2 as the update ships it: the new base with its task adapter, or the new base alone."""
    from peft import PeftModel

    base = load_new_base(cfg)
    return base if v2_adapter is None else PeftModel.from_pretrained(base, v2_adapter)


def resolved(cfg: UpdateConfig) -> UpdateConfig:
    """`cfg` with `embedded:` names replaced by local paths (built on first use), the user's models checked."""
    new = ({**cfg.new_base, "base": resolve_model(cfg.new_base_path)} if isinstance(cfg.new_base, dict)
           else resolve_model(cfg.new_base))
    out = dataclasses.replace(cfg, old_base=resolve_model(cfg.old_base), new_base=new)
    check_user_models(out)
    return out


def task_adapters(cfg: UpdateConfig, train_rows: list[dict], out: Path, tok_old, tok_new
                  ) -> tuple[Path | str | None, Path | str | None]:
    """(v1's task adapter, the task adapter v2 ships with). v1's: the user's `old_model` adapter as it is (None for a
    full v1), else trained on the old base. v2's: the user's `new_adapter`, else its own trained on the new base;
    with `new_task_adapter` false, v1's adapter on a quantized v1 (the quantized task model), else none."""
    from ..utils.progress import say

    if cfg.old_model is not None:
        v1_adapter = None if cfg.old_is_full_model else cfg.old_model
        say(f"update: v1 is your {'model' if v1_adapter is None else 'adapter'} {cfg.old_model}, used as is")
    else:
        v1_adapter = _train_task_adapter(cfg, cfg.old_base, train_rows, out / "v1_task_adapter", tok_old,
                                         "update: v1 task adapter")
    if cfg.new_adapter is not None:
        say(f"update: v2's task adapter is yours, {cfg.new_adapter}, used as is")
        return v1_adapter, cfg.new_adapter
    if cfg.new_task_adapter:
        return v1_adapter, _train_task_adapter(cfg, cfg.new_base_path, train_rows, out / "v2_task_adapter", tok_new,
                                               "update: v2 task adapter", cfg.new_quantization)
    quantized_v1 = cfg.new_quantization is not None and cfg.new_base_path in (cfg.old_base, cfg.old_model)
    return v1_adapter, (v1_adapter if quantized_v1 else None)


def adapter_start(cfg: UpdateConfig, v2_adapter: Path | None, seed: int):
    """(model, peft_config) every adapter training of the update starts from: v2's task adapter (trainable), or a
    fresh LoRA on v2 — the same random init in every arm of a seed (seeded here)."""
    import transformers
    from peft import LoraConfig, PeftModel

    transformers.set_seed(seed)
    model = load_new_base(cfg)
    if v2_adapter is not None:
        return PeftModel.from_pretrained(model, v2_adapter, is_trainable=True), None
    return model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=default_lora_targets(model),
                             task_type="CAUSAL_LM")


def load_rows(cfg: UpdateConfig) -> dict[str, list[dict]]:
    """{train, [dev,] test} prompt/completion rows, checked: non-empty, and — with a dev split, where the pick must
    not see its test items — no prompt in two splits."""
    specs = {"train": (cfg.train, cfg.split_train), **({"dev": (cfg.dev, cfg.split_dev)} if cfg.dev is not None
                                                         else {}), "test": (cfg.test, cfg.split_test)}
    rows = {name: _rows(spec, split) for name, (spec, split) in specs.items()}
    for name, split_rows in rows.items():
        if not split_rows or not {"prompt", "completion"} <= set(split_rows[0]):
            raise ValueError(f"the {name} set must be non-empty prompt/completion rows")
    if not any(answer_text(r["completion"]) for r in rows["train"]):
        raise ValueError(f"train: every row's 'completion' is empty ({len(rows['train'])} rows): nothing to learn")
    names = list(rows) if cfg.dev is not None else []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = {prompt_key(r["prompt"]) for r in rows[a]} & {prompt_key(r["prompt"]) for r in rows[b]}
            if shared:
                raise ValueError(f"{a} and {b} overlap: {len(shared)} prompts are in both (e.g. "
                                 f"{sorted(shared)[0]!r}); the splits must be disjoint")
    return rows


def for_scoring(model, cfg: UpdateConfig):
    """`model` on the GPU for generation when there is one and `use_cpu` is off (a quantized model is placed by its
    loader already)."""
    import torch

    quantized = getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None
    if cfg.use_cpu or quantized or not torch.cuda.is_available():
        return model
    return model.to(f"cuda:{torch.cuda.current_device()}")


def _evaluate(model, tokenizer, test_rows, cfg) -> tuple[list[bool], list[str]]:
    preds = generate_answers(for_scoring(model, cfg), tokenizer, test_rows, cfg.max_new_tokens)
    return exact_match(preds, test_rows), preds


def arms_plan(cfg: UpdateConfig, rows: dict) -> str:
    """The plan of an update without a dev split: what it uses, trains and scores."""
    steps = -(-len(rows["train"]) // cfg.batch_size)
    trained = [*([] if cfg.old_model else [f"v1's task adapter on {cfg.old_base}"]),
               *([f"v2's task adapter on {cfg.new_base_path}"] if cfg.new_adapter is None and cfg.new_task_adapter
                 else [])]
    return "\n".join([
        "update: the plan (no dev split: the MUSCLE and control arms at the config's settings)",
        f"  v1: {'your ' + cfg.old_model + ' (used as is)' if cfg.old_model else 'trained: ' + trained[0]}",
        f"  v2: {cfg.new_base_path}" + (f" + your adapter {cfg.new_adapter} (used as is)" if cfg.new_adapter else ""),
        f"  trainings: {len(trained)} task adapter(s) ({steps * cfg.task_epochs:g} steps each), then the MUSCLE "
        f"adapter{' and the control' if cfg.control else ''} ({steps * cfg.compat_epochs:g} steps each)",
        f"  scorings: {3 + int(cfg.control)} on test ({len(rows['test'])} items)"
        + (f", and lm-eval tasks {cfg.lm_eval_tasks}" if cfg.lm_eval_tasks else ""),
        "  time: not estimated without a dev split (give dev for the pick, whose plan measures its first steps)"])


def run_update(cfg: UpdateConfig, dry_run: bool = False) -> dict:
    """One update without a dev split: task adapters, the MUSCLE adapter at the config's settings and the control."""
    import datasets
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback

    from ..compat.metrics import delta_metrics, flip_indicators, flip_metrics, paired_rate_difference
    from ..compat.report import plot_quadrants
    from ..muscle.config import MUSCLEConfig
    from ..muscle.trainer import MUSCLETrainer, check_same_vocabulary
    from ..talr.config import TALRConfig
    from ..talr.trainer import TALRTrainer
    from ..utils.progress import TrainingProgress

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    start = time.perf_counter()
    cfg = resolved(cfg)
    tok_old = AutoTokenizer.from_pretrained(old_tokenizer_source(cfg))
    tok_new = AutoTokenizer.from_pretrained(cfg.new_base_path)
    check_same_vocabulary(tok_old, tok_new, "old_base/new_base: ")  # before any training
    rows = load_rows(cfg)  # before anything is written
    from ..utils.progress import say

    say(arms_plan(cfg, rows))
    if dry_run:
        return {"plan": arms_plan(cfg, rows)}
    train_rows, test_rows = rows["train"], rows["test"]
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    timings = {}
    t = time.perf_counter()
    v1_adapter, v2_adapter = task_adapters(cfg, train_rows, out, tok_old, tok_new)
    timings["task_adapters_s"] = time.perf_counter() - t
    v1 = v1_task_model(cfg, v1_adapter)
    v2 = _v2_task_model(cfg, v2_adapter)
    old_ok, old_pred = _evaluate(v1, tok_old, test_rows, cfg)
    new_ok, new_pred = _evaluate(v2, tok_new, test_rows, cfg)
    del v2

    def start_of_adapter_training():
        return adapter_start(cfg, v2_adapter, cfg.seed)

    t = time.perf_counter()
    with finished_dir(out / "compat_run") as run_dir, finished_dir(out / "compat_adapter") as adapter_dir:
        args = MUSCLEConfig(**_training_kwargs(cfg, output_dir=str(run_dir), temperature=cfg.temperature,
                                               mask=cfg.mask, ce_weight=cfg.ce_weight,
                                               learning_rate=cfg.compat_learning_rate,
                                               num_train_epochs=cfg.compat_epochs))
        model, peft_config = start_of_adapter_training()
        trainer = MUSCLETrainer(model=model, args=args, old_model=v1, old_processing_class=tok_old,
                                train_dataset=Dataset.from_list(train_rows), processing_class=tok_new,
                                peft_config=peft_config)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(TrainingProgress("update: compatibility adapter (MUSCLE)"))
        trainer.train()
        timings["compat_adapter_s"] = time.perf_counter() - t
        compat_model = trainer.model
        compat_model.save_pretrained(adapter_dir, selected_adapters=[trainer._student_adapter])
    compat_ok, compat_pred = _evaluate(compat_model, tok_new, test_rows, cfg)
    aligned = [h["compat/frac_aligned_old"] for h in trainer.state.log_history if "compat/frac_aligned_old" in h]
    control = None
    if cfg.control:
        t = time.perf_counter()
        with finished_dir(out / "control_run") as run_dir, finished_dir(out / "control_adapter") as adapter_dir:
            args = TALRConfig(**_training_kwargs(cfg, output_dir=str(run_dir), weighting="none",
                                                 learning_rate=cfg.compat_learning_rate,
                                                 num_train_epochs=cfg.compat_epochs))
            model, peft_config = start_of_adapter_training()
            trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(train_rows),
                                  processing_class=tok_new, peft_config=peft_config)
            trainer.remove_callback(PrinterCallback)
            trainer.add_callback(TrainingProgress("update: control adapter (cross-entropy, no v1)"))
            trainer.train()
            timings["control_adapter_s"] = time.perf_counter() - t
            trainer.model.save_pretrained(adapter_dir)
        control_ok, control_pred = _evaluate(trainer.model, tok_new, test_rows, cfg)
        control = flip_metrics(old_ok, control_ok, old_pred, control_pred, seed=cfg.seed)

    lm_eval_report = _lm_eval_flips(cfg, {"v1": (v1, tok_old), "compat": (compat_model, tok_new)},
                                    new_model=(_v2_task_model(cfg, v2_adapter), tok_new)) if cfg.lm_eval_tasks else None
    plain = flip_metrics(old_ok, new_ok, old_pred, new_pred, seed=cfg.seed)
    compat = flip_metrics(old_ok, compat_ok, old_pred, compat_pred, seed=cfg.seed)
    deltas = delta_metrics(plain, compat)
    control_fields = {}
    if control is not None:
        # the primary comparison: compat's negative flips against the control's, item by item
        versus = paired_rate_difference(flip_indicators(old_ok, compat_ok)["nfr"],
                                        flip_indicators(old_ok, control_ok)["nfr"], seed=cfg.seed)
        control_fields = {"control_acc": control["new_acc"], "nfr_control": control["nfr"],
                          "nfr_control_ci": control["nfr_ci"], "pfr_control": control["pfr"],
                          "mcnemar_p_v1_control": control["mcnemar_p"],
                          "nfr_compat_minus_control": versus["diff"], "nfr_compat_minus_control_ci": versus["ci"],
                          "mcnemar_p_compat_vs_control": versus["mcnemar_p"]}
    report = {
        "old_base": cfg.old_base, "new_base": cfg.new_base, "n_train": len(train_rows), "n_test": len(test_rows),
        "old_acc": plain["old_acc"], "new_acc": plain["new_acc"], "compat_acc": compat["new_acc"],
        "nfr": plain["nfr"], "nfr_compat": compat["nfr"], "delta_nfr": deltas["delta_nfr"],
        "delta_nfr_pct": deltas["delta_nfr_pct"], "pfr": plain["pfr"], "pfr_compat": compat["pfr"],
        "inconsistency_flips": plain["inconsistency_flips"], "inconsistency_flips_compat": compat["inconsistency_flips"],
        "nfr_ci": plain["nfr_ci"], "nfr_compat_ci": compat["nfr_ci"], "mcnemar_p_v1_v2": plain["mcnemar_p"],
        "mcnemar_p_v1_compat": compat["mcnemar_p"],
        **control_fields, "new_task_adapter": v2_adapter is not None,
        "frac_aligned_old_first_last": [aligned[0], aligned[-1]] if aligned else None,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("train", "test")},
        "lm_eval": lm_eval_report, "timings": timings, "seconds": time.perf_counter() - start,
    }
    quadrants = {"old": "v1", "new": "v2", "compatible": "v2 + compat", "tasks": {
        "v1 → v2": {**plain, "_correct": (old_ok, new_ok)},
        "v1 → v2 + compatibility adapter": {**compat, "_correct": (old_ok, compat_ok)},
        **({"v1 → v2 + control adapter": {**control, "_correct": (old_ok, control_ok)}} if control else {})}}
    plot_quadrants(quadrants, out / "flips.png")
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    atomic_write_text(out / "report.md", update_markdown(report))
    return report


SWEEP_KEYS = ("old_acc", "new_acc", "compat_acc", "nfr", "nfr_compat", "delta_nfr", "pfr", "pfr_compat")
CONTROL_KEYS = ("control_acc", "nfr_control", "nfr_compat_minus_control")  # with UpdateConfig.control


def run_update_seeds(make_config: Callable[[int], UpdateConfig], seeds: Sequence[int],
                     output_dir: str | Path) -> dict:
    """`run_update(make_config(seed))` for each seed, into `output_dir/seed-<seed>/`, then the spread.

    Writes `output_dir/seeds.json` and `seeds.md`: per rate (`SWEEP_KEYS`) the mean and min–max over the
    seeds, every seed's rates, the machine, and whether NFR_c < NFR holds beyond the spread (on every
    seed: the largest ΔNFR_c is below 0)."""
    from ..utils.sweeps import machine_info, spread

    if not seeds:
        raise ValueError("seeds: give at least one seed")
    out = Path(output_dir)
    per_seed = []
    for seed in seeds:
        cfg = make_config(seed)
        cfg.output_dir = str(out / f"seed-{seed}")
        report = run_update(cfg)
        keys = SWEEP_KEYS + (CONTROL_KEYS if cfg.control else ())
        per_seed.append({"seed": seed, **{k: report[k] for k in keys}, "n_test": report["n_test"],
                         "mcnemar_p_v1_v2": report["mcnemar_p_v1_v2"],
                         "mcnemar_p_v1_compat": report["mcnemar_p_v1_compat"]})
        logger.info("seed %s: NFR %.4f -> NFR_c %.4f", seed, report["nfr"], report["nfr_compat"])
    summary = {k: spread([r[k] for r in per_seed]) for k in keys}
    result = {"seeds": list(seeds), "summary": summary, "per_seed": per_seed,
              "nfr_compat_below_nfr": sum(r["nfr_compat"] < r["nfr"] for r in per_seed),
              "nfr_compat_at_most_nfr": sum(r["nfr_compat"] <= r["nfr"] for r in per_seed),
              "seeds_without_regressions": sum(r["nfr"] == 0 for r in per_seed),
              "holds_beyond_spread": summary["delta_nfr"]["max"] < 0, "machine": machine_info(),
              "config": {k: v for k, v in dataclasses.asdict(make_config(seeds[0])).items()
                         if k not in ("train", "test", "output_dir", "seed")}}
    atomic_write_text(out / "seeds.json", json.dumps(result, indent=2))
    atomic_write_text(out / "seeds.md", seeds_markdown(result))
    return result


def _lm_eval_flips(cfg: UpdateConfig, models: dict, new_model) -> dict:
    """Per lm-eval task: scores of v1, v2 and v2 + compatibility adapter, and their flips against v1."""

    from ..compat.callback import evaluate_with_lm_eval, task_runs_from_output
    from ..compat.compare import compare_task

    def runs(model, tok):
        out = evaluate_with_lm_eval(model, tok, cfg.lm_eval_tasks, limit=cfg.lm_eval_limit,
                                    num_fewshot=cfg.lm_eval_num_fewshot, batch_size=cfg.batch_size,
                                    gen_kwargs=cfg.lm_eval_gen_kwargs, metadata=cfg.lm_eval_metadata,
                                    include_path=cfg.lm_eval_include_path)
        return task_runs_from_output(out)

    v1_runs = runs(*models["v1"])
    v2_runs = runs(*new_model)
    compat_runs = runs(*models["compat"])
    report = {}
    for task in sorted(v1_runs):
        for filt, entry in compare_task(v1_runs[task], v2_runs[task], compatible=compat_runs[task]).items():
            report[task if filt == "none" else f"{task},{filt}"] = \
                {k: v for k, v in entry.items() if not k.startswith("_")}
    return report
