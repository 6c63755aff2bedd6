"""The steps every `adaptguard update` shares: the rows (`load_rows`), the config's bases and the user's models
(`resolved`, `check_user_models`), the task adapters of v1 and v2 (`task_adapters`: the user's, or trained from
train and stored), the models they make (`v1_task_model`, `load_new_base`), where a candidate adapter starts
(`adapter_start`) and the training arguments every trainer gets (`training_kwargs`). `pick.Pick` runs them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from ..models.embedded import resolve_model
from ..models.loading import load_causal_lm
from ..utils.files import finished_dir
from ..utils.generation import answer_text, prompt_key
from ..utils.lora import default_lora_targets
from .config import UpdateConfig

logger = logging.getLogger(__name__)


def _rows(spec, split: str) -> list[dict]:
    if isinstance(spec, list):
        return spec
    from ..utils.data import load_any_dataset

    return list(load_any_dataset(spec, split))


def training_kwargs(cfg: UpdateConfig, **specific) -> dict:
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
        args = TALRConfig(**training_kwargs(cfg, output_dir=str(tmp / "run"), weighting="none",
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
    """The new base as the update ships it: another model, or the old one quantized (read back from the run's copy
    when `store_new_base` made one)."""
    stored = new_base_copy(cfg)
    if stored is not None and (stored[0] / "done.json").exists():
        return load_causal_lm(str(stored[0]), use_cpu=cfg.use_cpu, prequantized=True)
    return load_causal_lm(cfg.new_base_path, cfg.new_quantization, use_cpu=cfg.use_cpu)


def new_base_copy(cfg: UpdateConfig) -> tuple[Path, dict] | None:
    """(folder, settings) of the run's copy of its quantized new base, for bitsandbytes (4- and 8-bit weights saved
    as safetensors, read back bit for bit); None for a base that is not quantized or another library's (quantized
    at each load, as transformers loads it)."""
    quantization = cfg.new_quantization
    if quantization is None or quantization["library"] != "bitsandbytes":
        return None
    from ..utils.store import digest

    key = {"base": cfg.new_base_path, "quantization": quantization}
    return Path(cfg.output_dir) / "steps" / f"v2_base_{digest(key)}", key


def store_new_base(cfg: UpdateConfig) -> None:
    """Quantize the new base once per run and keep it: every training and scoring then loads it instead of
    quantizing the base again (on a CPU, 4 s each time for SmolLM2-135M; a run loads it about ten times)."""
    from ..utils.store import Store

    stored = new_base_copy(cfg)
    if stored is not None:
        folder, key = stored
        Store(folder.parent).get(folder.name, key, lambda tmp: load_causal_lm(
            cfg.new_base_path, cfg.new_quantization, use_cpu=cfg.use_cpu).save_pretrained(tmp))


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


def v2_task_model(cfg: UpdateConfig, v2_adapter: Path | None):
    """v2 as the update ships it: the new base with its task adapter, or the new base alone."""
    from peft import PeftModel

    base = load_new_base(cfg)
    return base if v2_adapter is None else PeftModel.from_pretrained(base, v2_adapter)


def resolved(cfg: UpdateConfig) -> UpdateConfig:
    """`cfg` with `embedded:`/`built:` names replaced by local paths (built on first use), the user's models checked."""
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


