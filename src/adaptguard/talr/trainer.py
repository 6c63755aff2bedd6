from __future__ import annotations

import copy
import logging
import math
import os
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import load_file, save_file
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from ..plugins import get_token_weighting
from ..trl_adapter import (
    SFTBookkeeping,
    add_fused_lm_head,
    lift_config,
    load_model,
    partitioning,
    prepare_frozen_model,
    refuse_partitioning,
)
from ..utils.checks import check_completions, check_tokenizer_fits
from ..utils.sharding import full_tensor, is_sharded, shard_like, sum_over_ranks
from .callbacks import TokenAnalysisCallback, WiseFTCallback
from .config import TALRConfig
from .losses import flow_sequence_weights, k3_kl, l2_to_init, sequence_mean_nll

logger = logging.getLogger(__name__)

FLOW_WEIGHTS_NAME = "adaptguard_flow_weights.safetensors"


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


class _FlowCollator:
    """Passes the per-row FLOW weight through the collator as a (B,) tensor `flow_weight`."""

    def __init__(self, base):
        self.base = base

    def __call__(self, examples):
        weights = [e.pop("flow_weight") for e in examples] if "flow_weight" in examples[0] else None
        batch = self.base(examples)
        if weights is not None:
            batch["flow_weight"] = torch.tensor(weights, dtype=torch.float32)
        return batch


class TALRTrainer(SFTBookkeeping, SFTTrainer):
    r"""`SFTTrainer` with token-adaptive loss reweighting (TALR, Lin et al. §4.1) and the domain-SFT
    baselines (L2-to-init, k3-KL to the reference, FLOW, Wise-FT; LoRA through `peft_config`).

    Same constructor as `SFTTrainer`, plus an optional `ref_model` for `kl_beta > 0` without PEFT (by
    default a frozen copy of the initial model). The loss is

        L = (1/N) Σ_t [w_t s_seq ℓ_t + β KL_k3,t] + λ Σ (θ − θ₀)²

    with `w_t` from the weighting plugin (`args.weighting`), `s_seq` the FLOW weight (1 unless
    `flow=True`) and N = `num_items_in_batch` (global supervised-token count), so that gradient
    accumulation and DDP give the update of one big batch.
    """

    _tag_names = ["trl", "sft", "adaptguard", "talr"]
    _name = "TALR"
    loss_is_scaled_for_ga = True

    def __init__(self, model, args: SFTConfig | None = None, *pos_args, ref_model=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = TALRConfig(f"{str(name).rstrip('/').split('/')[-1]}-TALR")
        args = lift_config(args, TALRConfig)
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("TALRTrainer computes its own loss: do not pass compute_loss_func "
                             "(use `weighting=` or a weighting plugin instead).")
        if args.label_smoothing_factor > 0 and (args.weighting != "none" or args.kl_beta or args.l2_lambda or args.flow):
            raise ValueError(f"label_smoothing_factor > 0 spreads each token's loss over the whole vocabulary, while "
                             f"weighting={args.weighting!r} (and kl_beta, l2_lambda, flow) act on the label's "
                             "log-probability: label smoothing runs with weighting='none' and none of those (then "
                             "exactly as SFTTrainer)")
        if args.loss_type != "nll":  # "dft" became weighting="dft" in TALRConfig
            raise ValueError(f"loss_type={args.loss_type!r}: TALRTrainer takes 'nll' or 'dft' (as SFTTrainer does); "
                             "other token weightings are `weighting=`")
        self._weighting = get_token_weighting(args.weighting)
        check_completions(kwargs.get("train_dataset", pos_args[1] if len(pos_args) > 1 else None))
        if args.flow and (args.packing or args.padding_free):
            raise ValueError("flow=True weights whole sequences and cannot be combined with packing or padding_free.")
        super().__init__(model, args, *pos_args, **kwargs)
        check_tokenizer_fits(self.processing_class, self.model)
        if args.flow and not isinstance(self.train_dataset, Dataset):
            raise ValueError("flow=True needs a map-style `datasets.Dataset` train_dataset (weights are per row).")

        self._warned_empty = False
        self._flow_weights: torch.Tensor | None = None
        if args.flow:
            self.data_collator = _FlowCollator(self.data_collator)
        refuse_partitioning(self, [name for name, used in (("l2_lambda", args.l2_lambda > 0),
                                                           ("wise_ft_alpha", args.wise_ft_alpha is not None)) if used])
        unwrapped = self.accelerator.unwrap_model(self.model)
        trainable = [(n, p) for n, p in unwrapped.named_parameters() if p.requires_grad]
        # θ₀ by name, taken before the model is prepared (FSDP2 shards it in place) or a checkpoint is resumed
        self._init_params = {n: p.detach().clone() for n, p in trainable} if args.l2_lambda > 0 else None
        if args.wise_ft_alpha is not None:
            self.add_callback(WiseFTCallback(args.wise_ft_alpha, init_params=trainable))
        if args.token_analysis:
            self.add_callback(TokenAnalysisCallback(self))
        self.ref_model = None
        if args.kl_beta > 0 and not _is_peft(unwrapped):
            if partitioning(self) == "deepspeed-zero3" and not isinstance(ref_model, str):
                raise ValueError("kl_beta under DeepSpeed ZeRO-3: the model's parameters are already partitioned, so the "
                                 "KL reference cannot be copied from it; pass ref_model='<path or Hub id of the initial "
                                 "model>' (loaded partitioned, as TRL loads reference models)")
            self.ref_model = self._build_ref_model(ref_model if ref_model is not None else unwrapped)
        elif ref_model is not None:
            raise ValueError("ref_model is only used with kl_beta > 0 and a non-PEFT model "
                             "(under PEFT the reference is the model with its adapters disabled).")

    # ----------------------------------------------------------------------------------------- setup
    def _build_ref_model(self, source):
        if isinstance(source, str):
            ref = load_model(source, self.args)
        else:
            ref = copy.deepcopy(source)
            ref.__dict__.pop("forward", None)  # drop the policy's patched forward, patch the copy itself
        add_fused_lm_head(ref)
        return prepare_frozen_model(ref, self)

    def extra_signature_columns(self) -> list[str]:
        return ["flow_weight"] if self.args.flow else []  # the per-row FLOW weight reaches the collator

    # ------------------------------------------------------------------------------------------ FLOW
    @torch.no_grad()
    def score_rows(self, dataset: Dataset, limit: int | None = None):
        """Yield `(batch, fused outputs)` of the current model, in eval mode, over the first `limit` rows of
        a prepared (tokenized) dataset, `per_device_eval_batch_size` rows at a time.

        Every process must iterate it (collectively): the forward goes through the model as the Trainer
        wrapped it (DDP/FSDP/DeepSpeed), whose sharded parameters are gathered by all ranks together."""
        model = self.model_wrapped
        was_training = model.training
        model.eval()
        collate = getattr(self.data_collator, "base", self.data_collator)  # without the FLOW pass-through
        columns = [c for c in dataset.column_names if c in ("input_ids", "labels", "seq_lengths")]
        n = len(dataset) if limit is None else min(limit, len(dataset))
        bs = self.args.per_device_eval_batch_size
        try:
            for start in range(0, n, bs):
                rows = dataset.select_columns(columns)[start:min(start + bs, n)]
                batch = collate([dict(zip(rows, values)) for values in zip(*rows.values())])
                batch = {k: v.to(self.accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
                yield batch, model(**batch, use_cache=False, fused_lm_head=True)
        finally:
            model.train(was_training)

    def compute_flow_weights(self, dataset: Dataset) -> torch.Tensor:
        """Mean supervised NLL of every row under the current (initial) model → FLOW weights (N,)."""
        seq_nll = [sequence_mean_nll(-out.log_probs.float(), out.label_mask)[0].cpu()
                   for _, out in self.score_rows(dataset)]
        weights, tau = flow_sequence_weights(torch.cat(seq_nll), self.args.flow_tau)
        logger.info("FLOW: %d sequence weights, tau=%.4f, mean weight=%.4f", len(weights), tau, weights.mean())
        return weights

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if self.args.flow and self._flow_weights is None:
            checkpoint = resume_from_checkpoint
            if checkpoint is True:
                checkpoint = get_last_checkpoint(self.args.output_dir)
            saved = Path(checkpoint) / FLOW_WEIGHTS_NAME if checkpoint else None
            if saved is not None and saved.exists():
                self._flow_weights = load_file(saved)["flow_weights"]
            else:
                self._flow_weights = self.compute_flow_weights(self.train_dataset)
            if len(self._flow_weights) != len(self.train_dataset):
                raise ValueError(f"{saved}: {len(self._flow_weights)} FLOW weights for a train_dataset of "
                                 f"{len(self.train_dataset)} rows; was the checkpoint made on another dataset?")
            if "flow_weight" in self.train_dataset.column_names:
                self.train_dataset = self.train_dataset.remove_columns("flow_weight")
            self.train_dataset = self.train_dataset.add_column("flow_weight", self._flow_weights.tolist())
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def save_checkpoint_extras(self, folder: Path) -> None:
        if self._flow_weights is not None:  # a resumed run must not recompute them on a changed model
            tmp = folder / (FLOW_WEIGHTS_NAME + ".tmp")
            save_file({"flow_weights": self._flow_weights.contiguous()}, str(tmp))
            os.replace(tmp, folder / FLOW_WEIGHTS_NAME)

    # ------------------------------------------------------------------------------------------ loss
    def l2_distance_to_init(self) -> torch.Tensor:
        """`Σ (θ − θ₀)²` over the trainable parameters (0-d), the same value on every rank.

        Under FSDP2 a parameter is a sharded `DTensor` outside its module's forward and whole inside it (the root
        module keeps its parameters whole from the forward to the backward). A sharded one is compared with the
        same shard of θ₀ (sliced once; θ₀'s whole copy is then dropped) and these terms are all-reduced once; a
        whole one is the same on every rank and counted once. Each parameter's gradient is its own term, as
        without sharding (FSDP averages the whole parameters' identical gradients over the ranks)."""
        params = dict(self.accelerator.unwrap_model(self.model).named_parameters())
        sharded, whole = [], []
        for name, p0 in self._init_params.items():
            p = params[name]
            if is_sharded(p):
                if not is_sharded(p0):
                    p0 = self._init_params[name] = shard_like(p0, p)
                sharded.append((p.to_local(), p0.to_local()))
            else:
                whole.append((p, full_tensor(p0)))  # θ₀ gathered only if a sharded parameter is whole again
        l2 = torch.zeros((), device=self.accelerator.device)
        if whole:
            l2 = l2 + l2_to_init(*zip(*whole))
        if sharded:
            l2 = l2 + sum_over_ranks(l2_to_init(*zip(*sharded)))
        return l2

    @torch.no_grad()
    def _reference_log_probs(self, model, inputs) -> torch.Tensor:
        if self.ref_model is not None:
            return self.ref_model(**inputs, fused_lm_head=True).log_probs
        unwrapped = self.accelerator.unwrap_model(model)
        with unwrapped.disable_adapter():
            return unwrapped(**inputs, fused_lm_head=True).log_probs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.label_smoother is not None:  # weighting="none" alone (checked in __init__): SFTTrainer's own loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        args = self.args
        inputs["use_cache"] = False
        if self.aux_loss_enabled:
            inputs["output_router_logits"] = True
        flow_weight = inputs.pop("flow_weight", None)

        outputs = model(**inputs, fused_lm_head=True)
        token_nll = -outputs.log_probs  # (B, T−1), 0 off the mask
        mask = outputs.label_mask
        weights, stats = self._weighting(token_nll.detach(), mask, args)
        if weights.shape != token_nll.shape:
            raise ValueError(f"Weighting {args.weighting!r} returned weights of shape {tuple(weights.shape)}, "
                             f"expected {tuple(token_nll.shape)}")
        per_token = weights.detach().to(token_nll.dtype) * token_nll
        if flow_weight is not None and mode == "train":
            per_token = per_token * flow_weight.to(per_token)[:, None]
        kl = None
        if args.kl_beta > 0:
            kl = k3_kl(outputs.log_probs, self._reference_log_probs(model, inputs), mask)
            per_token = per_token + args.kl_beta * kl
        loss, steps = self.normalise_token_loss(per_token.sum(), mask.sum(), num_items_in_batch, mode)
        if mode == "train":
            if args.l2_lambda > 0:
                # Once per optimizer step, identical on every rank (DDP averages it back to itself)
                l2 = self.l2_distance_to_init()
                loss = loss + args.l2_lambda * l2 / steps
                self.log_metric(mode, "talr/l2", l2.item())
            if self.aux_loss_enabled:
                aux = self.router_aux_loss_coef * outputs.aux_loss
                loss = loss + (aux / steps if num_items_in_batch is not None else aux)
        self.check_finite(loss, mode)
        self._log_token_metrics(mode, inputs, outputs, weights, stats, kl)
        if return_outputs:
            with torch.no_grad():
                outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        return (loss, outputs) if return_outputs else loss

    def _log_token_metrics(self, mode, inputs, outputs, weights, stats, kl) -> None:
        gather = self.accelerator.gather_for_metrics
        mask = outputs.label_mask
        p_gt = (outputs.log_probs.detach() > math.log(0.2)) & mask
        at_floor = (weights <= self.args.talr_weight_floor) & mask
        sums = torch.stack([
            mask.sum().float(), outputs.entropy.detach().sum().float(), outputs.is_top1.sum().float(),
            weights.sum().float(), at_floor.sum().float(), p_gt.sum().float(),
            kl.detach().sum().float() if kl is not None else torch.zeros((), device=mask.device),
        ])
        n, entropy, top1, w_sum, floor, p_sum, kl_sum = gather(sums[None]).sum(0).tolist()
        if n == 0 and not self._warned_empty:
            logger.warning("A batch has no supervised (completion) token: its loss is 0. Check the dataset's "
                           "completion/assistant masks and max_length truncation.")
            self._warned_empty = True
        log = self.log_metric
        # SFTTrainer's own metrics, as its compute_loss logs them
        log(mode, "entropy", entropy / n if n else 0.0)
        log(mode, "mean_token_accuracy", top1 / n if n else 0.0)
        if n:
            log(mode, "talr/mean_weight", w_sum / n)
            log(mode, "talr/frac_at_floor", floor / n)
            log(mode, "talr/frac_p_gt_0.2", p_sum / n)
            if kl is not None:
                log(mode, "talr/kl", kl_sum / n)
        for key, value in stats.items():
            value = gather(value.detach().float().reshape(1)).nanmean()
            if torch.isfinite(value):
                log(mode, f"talr/{key}", value.item())
        self.count_tokens(inputs, mode)
        if self.aux_loss_enabled:
            log(mode, "aux_loss", gather(outputs.aux_loss).mean().item())
