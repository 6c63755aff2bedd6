from __future__ import annotations

import logging
import warnings

import torch
from trl import SFTTrainer
from trl.models.utils import _ForwardRedirection

from ..plugins import get_muscle_mask
from ..trl_adapter import SFTBookkeeping, load_model, load_tokenizer, prepare_frozen_model, refuse_partitioning
from ..utils.checks import check_completions, check_tokenizer_fits
from ..utils.labels import IGNORE_INDEX, shifted_labels
from ..utils.sharding import full_tensor
from .config import MUSCLEConfig
from .logit_cache import LogitCache, row_fingerprint
from .losses import muscle_token_loss_chunked
from .tiled import LMHead, muscle_token_loss_tiled

logger = logging.getLogger(__name__)

NEW_TEACHER = "muscle_new_teacher"


def check_same_vocabulary(old_tokenizer, new_tokenizer, where: str = "") -> None:
    """Refuse an update whose tokenizers differ: the KL compares next-token distributions index by index."""
    old_vocab, new_vocab = old_tokenizer.get_vocab(), new_tokenizer.get_vocab()
    if len(old_vocab) != len(new_vocab):
        raise ValueError(f"{where}the old and new tokenizers have different vocabulary sizes "
                         f"({len(old_vocab)} vs {len(new_vocab)}): MUSCLE needs a shared vocabulary")
    if old_vocab != new_vocab:
        diff = sorted(set(old_vocab.items()) ^ set(new_vocab.items()), key=str)[:3]
        raise ValueError(f"{where}the old and new tokenizers map tokens differently (e.g. {diff}): MUSCLE needs a "
                         "shared vocabulary")


def _load_lora(base, adapter: str):
    from peft import PeftConfig, PeftModel

    try:
        config = PeftConfig.from_pretrained(adapter)
    except Exception as err:  # noqa: BLE001 - PEFT raises several kinds for a missing adapter
        raise ValueError(f"new_adapter {adapter!r}: no PEFT adapter found there ({err})") from err
    if str(getattr(config.peft_type, "value", config.peft_type)).upper() != "LORA":
        raise ValueError(f"new_adapter {adapter!r} is a {config.peft_type} adapter; MUSCLE initialises the "
                         "compatibility adapter from a LoRA task adapter")
    model = PeftModel.from_pretrained(base, adapter, adapter_name="default", is_trainable=True)
    model.load_adapter(adapter, adapter_name=NEW_TEACHER, is_trainable=False)
    return model


def last_hidden_state(model, inputs: dict) -> torch.Tensor:
    """(B, L, H) hidden states after the final norm, from the model's backbone (the LM head is not run). A
    `PeftModel` keeps its LoRA layers inside the backbone, so the active adapter applies."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.base_model.model
    return model.base_model(**inputs).last_hidden_state


def output_head(model) -> LMHead:
    """The model's LM head as an `LMHead`: its weight and bias, and the config's logit soft-capping and scale (read
    as TRL's DistillationTrainer reads them). TRL's SFTTrainer refuses a PEFT adapter on the LM head, so the
    weight is the head's own."""
    layer = model.get_output_embeddings()
    # Under FSDP2 a head outside its model's forward is a sharded DTensor: gathered once here (an all-gather; its
    # backward reduce-scatters), as TRL's DistillationTrainer does. Inside the forward it is already whole.
    weight, bias = full_tensor(layer.weight), getattr(layer, "bias", None)
    bias = None if bias is None else full_tensor(bias)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None) or getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    return LMHead(weight, bias, getattr(config, "final_logit_softcapping", None), 1.0 if scale is None else float(scale))


class MUSCLETrainer(SFTBookkeeping, SFTTrainer):
    r"""MUSCLE (paper 002 §4.1): train a compatibility LoRA adapter on the new base model so that the updated
    task model keeps the old one's right answers.

    - `model`: the new base model (v2), a Hub id, path or `PreTrainedModel` (not a `PeftModel`);
    - `args.new_adapter`: the v2 task LoRA adapter. The student (adapter `default`) starts from it; a frozen
      copy (`muscle_new_teacher`) on the same base is the new teacher, reached by switching adapters, so v2
      is in memory once;
    - the old teacher: `old_model=` (a model), or `args.old_model` (+ `args.old_adapter`), or a top-k logit
      cache of it (`args.old_logits_cache`, from `adaptguard cache-logits`), so v1 need not be in memory.

    Same constructor as `SFTTrainer` otherwise (no `peft_config`: the adapter comes from `new_adapter`).
    """

    _tag_names = ["trl", "sft", "adaptguard", "muscle"]
    _name = "MUSCLE"
    loss_is_scaled_for_ga = True

    def __init__(self, model, args: MUSCLEConfig | None = None, *pos_args, old_model=None,
                 old_processing_class=None, **kwargs):
        from peft import PeftModel

        if not isinstance(args, MUSCLEConfig):
            raise TypeError("MUSCLETrainer needs a MUSCLEConfig (with new_adapter)")
        if kwargs.get("peft_config") is not None:
            raise ValueError("MUSCLETrainer builds its adapter from args.new_adapter; do not pass peft_config")
        if args.new_adapter is None:
            raise ValueError("MUSCLEConfig.new_adapter is required: the v2 task LoRA adapter to start from")
        self._mask = get_muscle_mask(args.mask)  # unknown names fail before anything loads
        check_completions(kwargs.get("train_dataset", pos_args[1] if len(pos_args) > 1 else None))
        if isinstance(model, PeftModel):
            raise ValueError("pass the new base model, not a PeftModel: the adapters come from args.new_adapter")
        if isinstance(model, str):
            model = load_model(model, args)
        processing_class = kwargs.get("processing_class")
        if processing_class is None:
            processing_class = load_tokenizer(model.config._name_or_path, args)
            kwargs["processing_class"] = processing_class
        check_tokenizer_fits(processing_class, model)

        self.old_cache = None
        if args.old_logits_cache is not None:
            if old_model is not None or args.old_model is not None:
                raise ValueError("give the old model either as a model (old_model) or as old_logits_cache, not both")
            self.old_cache = LogitCache(args.old_logits_cache)
            self.old_cache.check(processing_class, model.get_output_embeddings().weight.shape[0])
            super().__init__(_load_lora(model, args.new_adapter), args, *pos_args, **kwargs)
            self._forward_redirection = _ForwardRedirection()
            self._check_partitioning()
            self.old_model = None
            if self.train_dataset is not None:  # every training row must be cached: fail before training
                rows = self.train_dataset.select_columns(["input_ids", "labels"])
                self.old_cache.rows_for([row_fingerprint(r["input_ids"], r["labels"]) for r in rows])
            return
        if old_model is None:
            if args.old_model is None:
                raise ValueError("give the old (v1) task model: MUSCLETrainer(old_model=...), MUSCLEConfig.old_model "
                                 "or MUSCLEConfig.old_logits_cache")
            old_model = load_model(args.old_model, args)
            if args.old_adapter is not None:
                old_model = PeftModel.from_pretrained(old_model, args.old_adapter).merge_and_unload()
            old_processing_class = old_processing_class or load_tokenizer(args.old_model, args)
        if old_processing_class is not None:
            check_same_vocabulary(old_processing_class, processing_class)
        old_vocab = old_model.get_output_embeddings().weight.shape[0]
        new_vocab = model.get_output_embeddings().weight.shape[0]
        if old_vocab != new_vocab:
            raise ValueError(f"the old model has {old_vocab} output logits and the new one {new_vocab}: MUSCLE needs "
                             "a shared vocabulary")

        super().__init__(_load_lora(model, args.new_adapter), args, *pos_args, **kwargs)
        self._forward_redirection = _ForwardRedirection()
        self._check_partitioning()
        self.old_model = prepare_frozen_model(old_model, self)

    def _check_partitioning(self) -> None:
        # The tiled loss reads the LM heads' weights outside their modules' forward: whole, or FSDP2 DTensors
        refuse_partitioning(self, ["loss_implementation='tiled'"] if self.args.loss_implementation == "tiled" else [])

    @torch.no_grad()
    def teacher_logits(self, model, model_inputs, labels):
        """(old, new) teachers: new = (B, L, V) logits of the frozen v2 adapter on the student's base; old = the
        old model's logits, or its cached top-k (`TopKLogProbs`)."""
        peft_model = self.accelerator.unwrap_model(model)
        peft_model.set_adapter(NEW_TEACHER, inference_mode=True)
        try:
            new_logits = peft_model(**model_inputs).logits
        finally:
            peft_model.set_adapter("default")  # the student again, trainable
        if self.old_cache is None:
            return self.old_model(**model_inputs).logits, new_logits
        return self.cached_old_topk(model_inputs, labels), new_logits

    def cached_old_topk(self, model_inputs, labels):
        """The old model's top-k log-probabilities of the batch from the cache (rows found by fingerprint), as
        `TopKLogProbs`: the KL is computed from this sparse form, never as a dense (B, L, V) tensor."""
        mask = model_inputs["attention_mask"].bool()
        prints = [row_fingerprint(ids[m], lab[m]) for ids, lab, m in zip(model_inputs["input_ids"], labels, mask)]
        return self.old_cache.topk_batch(self.old_cache.rows_for(prints), labels)

    @torch.no_grad()
    def teacher_hidden(self, peft_model, model_inputs, labels):
        """(old, new) teachers for the tiled loss: new = (last hidden states, head) of the frozen v2 adapter; old =
        the same of the old model, or its cached top-k (`TopKLogProbs`)."""
        peft_model.set_adapter(NEW_TEACHER, inference_mode=True)
        try:
            new = last_hidden_state(peft_model, model_inputs), output_head(peft_model)
        finally:
            peft_model.set_adapter("default")  # the student again, trainable
        if self.old_cache is not None:
            return self.cached_old_topk(model_inputs, labels), new
        old_model = self.accelerator.unwrap_model(self.old_model)
        # Through the old model's own wrapper, as TRL runs a teacher's backbone: FSDP/DeepSpeed gather its sharded
        # parameters in the wrapper's forward, which calling the backbone directly would skip
        old_hidden = self._forward_redirection(self.old_model, old_model, last_hidden_state, old_model, model_inputs)
        return (old_hidden, output_head(old_model)), new

    def _tiled_loss(self, peft_model, inputs, labels, shifted):
        """Runs inside the wrapper's forward (`_ForwardRedirection`), so DDP prepares its gradient reduction."""
        old, (new_hidden, new_head) = self.teacher_hidden(peft_model, inputs, labels)
        out = muscle_token_loss_tiled(last_hidden_state(peft_model, inputs), output_head(peft_model), new_hidden,
                                      new_head, old, shifted, mask=self._mask, temperature=self.args.temperature,
                                      token_chunk=self.args.kl_chunk_size, vocab_chunk=self.args.vocab_chunk_size)
        return out.kl, out.ce, out.m, out.student_top1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        args = self.args
        inputs = {**inputs, "use_cache": False}
        labels = inputs.pop("labels")
        shifted = shifted_labels(labels)  # shift the labels, not the (large) logits
        valid = shifted != IGNORE_INDEX
        outputs = None
        if args.loss_implementation == "tiled":
            per_token, ce, m, student_top1 = self._forward_redirection(
                model, self.accelerator.unwrap_model(model), self._tiled_loss, self.accelerator.unwrap_model(model),
                inputs, labels, shifted)
            ce_sum = ce.sum()
        else:  # the (B, L, V) logits of all three models, then a chunked KL: for debugging
            old_logits, new_logits = self.teacher_logits(model, inputs, labels)
            outputs = model(**inputs)
            student = outputs.logits
            per_token, m = muscle_token_loss_chunked(student, old_logits, new_logits, shifted, mask=self._mask,
                                                     temperature=args.temperature, chunk_size=args.kl_chunk_size)
            student_top1 = student.detach().argmax(-1)
            ce_sum = torch.nn.functional.cross_entropy(student.reshape(-1, student.shape[-1]).float(),
                                                       shifted.reshape(-1), ignore_index=IGNORE_INDEX,
                                                       reduction="sum") if args.ce_weight > 0 \
                else torch.zeros((), device=student.device)
        total = per_token.sum()
        if args.ce_weight > 0:
            total = total + args.ce_weight * ce_sum
        loss, _ = self.normalise_token_loss(total, valid.sum(), num_items_in_batch, mode)
        self.check_finite(loss, mode)

        with torch.no_grad():
            correct = (student_top1 == shifted) & valid
            sums = torch.stack([valid.sum().float(), m.sum().float(), correct.sum().float(),
                                per_token.detach().sum().float(), ce_sum.detach().float()])
            count, aligned_old, right, kl_sum, ce_total = self.accelerator.gather_for_metrics(sums[None]).sum(0).tolist()
        if count:
            self.log_metric(mode, "compat/frac_aligned_old", aligned_old / count)
            self.log_metric(mode, "mean_token_accuracy", right / count)
            self.log_metric(mode, "compat/kl", kl_sum / count)
            if args.ce_weight > 0:
                self.log_metric(mode, "compat/ce", ce_total / count)
        self.count_tokens(inputs, mode)
        if return_outputs and outputs is None:
            # TRL's prediction_step asks for outputs only when compute_metrics or preprocess_logits_for_metrics need
            # the logits. The tiled loss builds none: the student's are computed here, in evaluation only, without
            # gradients (as SFTTrainer recomputes them next to its fused head); training never holds them
            with torch.no_grad():
                outputs = model(**inputs)
        return (loss, outputs) if return_outputs else loss


class CompatTrainer(MUSCLETrainer):
    """Deprecated alias of `MUSCLETrainer` (kept for one release)."""

    def __init__(self, *args, **kwargs):
        warnings.warn("CompatTrainer is deprecated; use MUSCLETrainer", FutureWarning, stacklevel=2)
        super().__init__(*args, **kwargs)
