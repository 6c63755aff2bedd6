"""The one place where adaptguard's trainers touch TRL/transformers internals (private names and attributes
that are not part of their documented API), each with a comment saying what it is. TRL is pinned
`trl>=1.16,<1.17` in pyproject.toml; a TRL upgrade is checked by tests/talr/test_talr_trainer.py and
tests/muscle/test_compat_trainer.py.

`SFTBookkeeping` is the bookkeeping `SFTTrainer.compute_loss` does around its loss, for trainers that compute
their own loss: normalising a summed token loss for gradient accumulation and DDP, logging metrics and
counting training tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Private in TRL (trl/trainer/utils.py, undocumented): patches a model's forward so that
# `model(..., fused_lm_head=True)` returns per-token label log-probs, entropy, top-1 flags and the label mask
# without materialising (B, L, V) logits. TALR uses it for the policy (SFTTrainer applies it) and its reference.
from trl.trainer.utils import add_fused_lm_head  # noqa: F401  (re-exported for adaptguard.talr.trainer)


def load_model(name: str, args):
    """A model given by name or path, loaded as SFTTrainer loads its `model` string: TRL's `create_model_from_path`
    with `args.model_init_kwargs` (dtype strings such as "bfloat16" included), `args.trust_remote_code` unless those
    kwargs set it, and no `device_map` under DDP/DeepSpeed (TRL: "auto" fails there). Used for MUSCLE's v2 and old
    models and TALR's KL reference."""
    from trl.trainer.utils import create_model_from_path

    kwargs = dict(args.model_init_kwargs or {})
    kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
        kwargs["device_map"] = None
    return create_model_from_path(name, **kwargs)


def load_tokenizer(name: str, args):
    """The tokenizer of a model given by name or path, as SFTTrainer loads its processing class (revision and
    `trust_remote_code` from the arguments, so transformers never asks on stdin)."""
    from transformers import AutoTokenizer

    kwargs = args.model_init_kwargs or {}
    return AutoTokenizer.from_pretrained(name, revision=kwargs.get("revision"),
                                         trust_remote_code=kwargs.get("trust_remote_code", args.trust_remote_code))


def prepare_frozen_model(model, trainer):
    """Prepare a frozen model beside the trained one (TALR's KL reference, MUSCLE's old teacher) the way TRL prepares
    its reference and teacher models: under DeepSpeed ZeRO-3 and FSDP sharded like the student
    (`trl.models.prepare_deepspeed` / `prepare_fsdp`, the latter `fully_shard` for FSDP2), else on the device.
    `accelerator.prepare_model(evaluation_mode=True)` alone would keep a whole copy on every FSDP rank."""
    model.requires_grad_(False).eval()
    if trainer.is_deepspeed_enabled:
        from trl.models import prepare_deepspeed

        return prepare_deepspeed(model, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        from trl.models.utils import prepare_fsdp

        return prepare_fsdp(model, trainer.accelerator)
    return trainer.accelerator.prepare_model(model, evaluation_mode=True)


def partitioning(trainer) -> str | None:
    """How the trainer's accelerator partitions the parameters: "deepspeed-zero3", "fsdp1", "fsdp2", or None when
    every rank holds them whole (single process, DDP, ZeRO-1/2)."""
    if trainer.is_deepspeed_enabled:
        return "deepspeed-zero3" if trainer.accelerator.state.deepspeed_plugin.zero_stage == 3 else None
    if trainer.is_fsdp_enabled:
        return f"fsdp{trainer.accelerator.state.fsdp_plugin.fsdp_version}"
    return None


def refuse_partitioning(trainer, features: list[str]) -> None:
    """Refuse the config `features` in use (e.g. ["l2_lambda"]) when the parameters are partitioned in a way they do
    not handle: they read whole parameters or FSDP2's DTensor shards, not ZeRO-3's or FSDP1's flat partitions."""
    kind = partitioning(trainer)
    if features and kind in ("deepspeed-zero3", "fsdp1"):
        raise ValueError(f"{', '.join(features)}: not supported with {kind} (parameters partitioned into flat "
                         "shards); use FSDP2 (`fsdp_version: 2`, examples/accelerate_configs/fsdp.yaml) or DeepSpeed "
                         "ZeRO-1/2 (examples/accelerate_configs/deepspeed_zero2.yaml)")


def lift_config(args, config_class):
    """Accept a plain `SFTConfig`/`TrainingArguments` where a trainer takes its own config class (drop-in use): the
    same field values, the method's defaults for its own fields. An instance of `config_class` is returned as is."""
    import dataclasses

    if isinstance(args, config_class):
        return args
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and hasattr(args, f.name)}
    names = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in values.items() if k in names})


def hardware_defaults(config) -> None:
    """Defaults that TRL's configs set for a GPU, decided by the hardware where they would fail or warn on a CPU.

    `bf16`: TRL turns it on unless told otherwise (`bf16=None` becomes `not fp16` in trl/trainer/base_config.py),
    which transformers refuses on a machine without bf16 support; an explicit choice is left alone, an unset one
    is decided as TRL would on a bf16 GPU. `dataloader_pin_memory` (True by default): with no accelerator there is
    no device memory to pin, and torch's DataLoader warns on every run; it is switched off there."""
    import torch

    if config.bf16 is None and not config.fp16:
        from transformers.utils import is_torch_bf16_gpu_available

        config.bf16 = bool(is_torch_bf16_gpu_available()) and not config.use_cpu
    accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    if config.use_cpu or not accelerator:  # (torch.accelerator: torch ≥ 2.6)
        config.dataloader_pin_memory = False


def no_activation_checkpointing() -> dict:
    """Training-argument keywords that switch activation (gradient) checkpointing off. transformers ≥ 5.23 renamed
    `gradient_checkpointing` to `activation_checkpointing` and warns on the old name, which TRL's configs still
    set (to True); passing the new name where it exists keeps the small experiments' output free of that warning."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing": False} if "activation_checkpointing" in names else {"gradient_checkpointing": False}


class SFTBookkeeping:
    """Mixin for an `SFTTrainer` subclass whose `compute_loss` returns `sum of per-token losses / N`."""

    def normalise_token_loss(self, total: torch.Tensor, num_tokens: torch.Tensor | int,
                             num_items_in_batch: torch.Tensor | int | None, mode: str) -> tuple[torch.Tensor, int]:
        """`total / N` scaled so that gradient accumulation and DDP give the update of one big batch; returns
        the loss and the accumulation step count (for terms added once per optimizer step).

        N is `num_items_in_batch` (the global supervised-token count of the optimizer step, which the Trainer
        passes because `loss_is_scaled_for_ga = True`), else the batch's `num_tokens`."""
        n = num_tokens if num_items_in_batch is None else num_items_in_batch
        loss = total / torch.as_tensor(n, device=total.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            # DDP averages gradients over processes, but N already counts every process's tokens
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        # `current_gradient_accumulation_steps`: set by Trainer._inner_training_loop (not documented)
        steps = getattr(self, "current_gradient_accumulation_steps", 1) if mode == "train" else 1
        if mode == "train" and num_items_in_batch is None:
            loss = loss / steps  # `loss_is_scaled_for_ga`: the Trainer leaves this division to us
        return loss, steps

    def extra_signature_columns(self) -> list[str]:
        """Dataset columns to keep besides the model's forward arguments (override in a trainer)."""
        return []

    def _set_signature_columns_if_needed(self):
        # transformers' private hook that decides which dataset columns `remove_unused_columns` keeps
        # (`_signature_columns`): extend it with the trainer's extra columns.
        super()._set_signature_columns_if_needed()
        extra = [c for c in self.extra_signature_columns() if c not in self._signature_columns]
        self._signature_columns = [*self._signature_columns, *extra]

    def save_checkpoint_extras(self, folder: Path) -> None:
        """Write a trainer's own files into a checkpoint folder (override in a trainer)."""

    def _save_checkpoint(self, model, trial):
        # transformers' private checkpoint writer: let the trainer add its files to the finished folder
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            self.save_checkpoint_extras(Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}")

    def check_finite(self, loss: torch.Tensor, mode: str) -> None:
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"Non-finite {mode} {self._name} loss ({loss.item()}) at global step {self.state.global_step}: "
                "check the learning rate, the data (empty or corrupted rows) and the precision (bf16/fp16)."
            )

    def log_metric(self, mode: str, key: str, value: float) -> None:
        """Append to the metrics SFTTrainer averages and logs at each logging step.
        `_metrics` is SFTTrainer's private {mode: {key: [values]}} store (trl/trainer/sft_trainer.py)."""
        self._metrics[mode][key].append(value)

    def count_tokens(self, inputs: dict, mode: str) -> None:
        """SFTTrainer's `num_tokens` metric: training tokens seen so far, summed over processes.
        `_total_train_tokens` and `_tp_size` are SFTTrainer's private counter and tensor-parallel size."""
        if mode == "train":
            if "attention_mask" in inputs:
                local = inputs["attention_mask"].sum()
            else:
                local = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
            self._total_train_tokens += self.accelerator.gather_for_metrics(local).sum().item() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
