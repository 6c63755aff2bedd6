from __future__ import annotations

from contextlib import contextmanager
from functools import cached_property

import torch
from datasets import IterableDataset
from trl import SFTTrainer
from trl.models.utils import _ForwardRedirection

from ..plugins import get_muscle_mask
from ..trl_adapter import (
    SFTBookkeeping,
    lift_config,
    load_model,
    load_tokenizer,
    prepare_frozen_model,
    refuse_partitioning,
)
from ..utils.checks import check_completions, check_tokenizer_fits
from .config import MUSCLEConfig
from .heads import last_hidden_state, output_head
from .logit_cache import LogitCache, row_fingerprint
from .loss_paths import ExactLoss, MUSCLELoss, MUSCLELossOutput, TiledLoss, choose_loss

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
    _freeze_as_buffers(model, NEW_TEACHER)
    return model


def _freeze_as_buffers(model, adapter_name: str) -> None:
    """Turn the parameters of adapter `adapter_name` into non-persistent buffers: the frozen teacher copy then stays
    out of `named_parameters()` (the optimiser, a user's "did every adapter weight train?" check) and out of
    `state_dict()` (saved checkpoints), as SFTTrainer's model would have it, while PEFT still switches to it by name."""
    marker = f".{adapter_name}."
    for name, param in list(model.named_parameters()):
        if marker in f".{name}":
            owner, leaf = model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]
            del owner._parameters[leaf]
            owner.register_buffer(leaf, param.detach(), persistent=False)


def _add_teacher_copy(model) -> None:
    """Freeze a copy of a `PeftModel`'s active adapter beside it as `muscle_new_teacher`: the student trains the
    active adapter from its v2 values while the copy keeps them (any PEFT type; the base is shared)."""
    import copy

    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    name = model.active_adapter
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    model.add_adapter(NEW_TEACHER, config)
    set_peft_model_state_dict(model, get_peft_model_state_dict(model, adapter_name=name), adapter_name=NEW_TEACHER)
    _freeze_as_buffers(model, NEW_TEACHER)
    model.set_adapter(name)


def match_added_tokens(teacher, student) -> None:
    """Give `teacher` the rows `student` gained when SFTTrainer's `chat_template_path` added tokens (input embeddings
    and an untied LM head): the same values, so on the new tokens both teachers start where the student does. A
    teacher of the student's size is left as it is."""
    grown, size = student.get_input_embeddings().weight, teacher.get_input_embeddings().weight.shape[0]
    if grown.shape[0] <= size:
        return
    teacher.resize_token_embeddings(grown.shape[0], mean_resizing=False)
    pairs = [(teacher.get_input_embeddings(), student.get_input_embeddings())]
    if not teacher.config.get_text_config().tie_word_embeddings:
        pairs.append((teacher.get_output_embeddings(), student.get_output_embeddings()))
    with torch.no_grad():
        for mine, theirs in pairs:
            mine.weight[size:] = theirs.weight[size:].to(mine.weight)
            if getattr(mine, "bias", None) is not None:
                mine.bias[size:] = theirs.bias[size:].to(mine.bias)


class MUSCLETrainer(SFTBookkeeping, SFTTrainer):
    r"""MUSCLE (Echterhoff et al. §4.1): train the new model (v2) so that the updated task model keeps the old one's right
    answers. Trains the three ways SFTTrainer does; the new teacher is v2 as it was before training:

    - **from v2's task adapter** (the paper's way): `args.new_adapter` (a LoRA adapter on the base `model`), or a
      `PeftModel` passed as `model`. The student trains that adapter; a frozen copy (`muscle_new_teacher`) on the
      same base is the new teacher, reached by switching adapters, so v2 is in memory once;
    - **a fresh adapter** from `peft_config` (LoRA, prompt / prefix tuning, prompt encoder), when v2 has no task
      adapter (e.g. the update is v2 itself, such as a quantized model): the new teacher is v2 with the adapter
      disabled;
    - **full fine-tuning** (no adapter): the new teacher is a frozen copy of v2 (twice v2's memory).

    The old teacher: `old_model=` (a model, path or Hub id), or `args.old_model` (+ `args.old_adapter`), or a top-k
    logit cache of it (`args.old_logits_cache`, from `adaptguard cache-logits`), so v1 need not be in memory.
    Otherwise the constructor is SFTTrainer's.
    """

    _tag_names = ["trl", "sft", "adaptguard", "muscle"]
    _name = "MUSCLE"
    loss_is_scaled_for_ga = True

    def __init__(self, model, args: MUSCLEConfig | None = None, *pos_args, old_model=None,
                 old_processing_class=None, **kwargs):
        from peft import PeftModel

        if args is None:  # as SFTTrainer: "<model name>-MUSCLE"
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = MUSCLEConfig(f"{str(name).rstrip('/').split('/')[-1]}-MUSCLE")
        args = lift_config(args, MUSCLEConfig)  # a plain SFTConfig: MUSCLE's defaults added
        # SFTConfig's loss settings that a distillation loss cannot honour: what to use instead
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("MUSCLETrainer computes its own loss (the distillation of eq. 2): do not pass "
                             "compute_loss_func (use MUSCLEConfig.mask or a mask plugin)")
        if args.label_smoothing_factor > 0 or args.loss_type != "nll":
            raise ValueError("MUSCLETrainer's loss distils the old and new models' distributions: label_smoothing_factor "
                             "and loss_type do not apply (the label term is ce_weight)")
        self.mask = get_muscle_mask(args.mask)  # an unknown name fails before anything loads
        check_completions(kwargs.get("train_dataset", pos_args[1] if len(pos_args) > 1 else None))
        if isinstance(model, str):
            model = load_model(model, args)
        peft_given = kwargs.get("peft_config") is not None
        if args.new_adapter is not None and (peft_given or isinstance(model, PeftModel)):
            raise ValueError("MUSCLEConfig.new_adapter is v2's task adapter: pass the base model as `model` and no "
                             "peft_config (or drop new_adapter and pass the PeftModel, or peft_config for a fresh "
                             "adapter)")
        if peft_given and isinstance(model, PeftModel):
            raise ValueError("model is already a PeftModel (its adapter is v2's task adapter, which MUSCLE trains); "
                             "do not pass peft_config too")
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
            cache_vocab = model.get_output_embeddings().weight.shape[0]
            self.old_cache.check(processing_class, cache_vocab)
        else:
            old_model = self._load_old_model(old_model, args, old_processing_class, processing_class)
            old_vocab = old_model.get_output_embeddings().weight.shape[0]
            new_vocab = model.get_output_embeddings().weight.shape[0]
            if old_vocab != new_vocab:
                raise ValueError(f"the old model has {old_vocab} output logits and the new one {new_vocab}: MUSCLE "
                                 "needs a shared vocabulary")

        # The new teacher: "adapter" (a frozen copy of v2's task adapter), "base" (v2 under a fresh adapter, which
        # is disabled for it) or "copy" (a frozen copy of the whole v2, for full fine-tuning)
        new_model = None
        if args.new_adapter is not None:
            model, self.new_teacher = _load_lora(model, args.new_adapter), "adapter"
        elif isinstance(model, PeftModel):
            _add_teacher_copy(model)
            self.new_teacher = "adapter"
        elif peft_given:
            self.new_teacher = "base"
        else:
            import copy

            # before SFTTrainer patches the model's forward or switches on gradient checkpointing
            new_model, self.new_teacher = copy.deepcopy(model), "copy"
        super().__init__(model, args, *pos_args, **kwargs)
        # SFTTrainer's `chat_template_path` may have added tokens and grown the student's embeddings
        for teacher in (new_model, old_model if self.old_cache is None else None):
            if teacher is not None:
                match_added_tokens(teacher, self.model)
        if self.old_cache is not None and self.model.get_output_embeddings().weight.shape[0] != cache_vocab:
            raise ValueError("chat_template_path added tokens that old_logits_cache has no logits for: cache the "
                             "old model's logits with the same chat template (adaptguard cache-logits)")
        self._forward_redirection = _ForwardRedirection()
        unwrapped = self.accelerator.unwrap_model(self.model)
        self._student_adapter = unwrapped.active_adapter if isinstance(unwrapped, PeftModel) else None
        # the loss, chosen once (`loss_paths.choose_loss`: a refusal or a fallback says why), built at the first batch
        self._loss_class = choose_loss(args.loss_implementation, unwrapped, self.mask, self.old_cache)
        self._check_partitioning()
        self.new_model = None if new_model is None else prepare_frozen_model(new_model, self)
        if self.old_cache is not None:
            self.old_model = None
            if self.train_dataset is not None and not isinstance(self.train_dataset, IterableDataset):
                # every training row must be cached: fail before training (a stream is checked batch by batch)
                rows = self.train_dataset.select_columns(["input_ids", "labels"])
                self.old_cache.rows_for([row_fingerprint(r["input_ids"], r["labels"]) for r in rows])
        else:
            self.old_model = prepare_frozen_model(old_model, self)

    def _save(self, output_dir: str | None = None, state_dict=None):
        # the frozen teacher copy is the trainer's, not the user's: a saved model holds the student's adapter only
        unwrapped = self.accelerator.unwrap_model(self.model)
        teacher = getattr(unwrapped, "peft_config", {}).pop(NEW_TEACHER, None)
        try:
            super()._save(output_dir, state_dict)
        finally:
            if teacher is not None:
                unwrapped.peft_config[NEW_TEACHER] = teacher

    @staticmethod
    def _load_old_model(old_model, args, old_processing_class, processing_class):
        from peft import PeftModel

        if old_model is None:
            if args.old_model is None:
                raise ValueError("give the old (v1) task model: MUSCLETrainer(old_model=...), MUSCLEConfig.old_model "
                                 "or MUSCLEConfig.old_logits_cache")
            old_model = args.old_model
        if isinstance(old_model, str):
            name = old_model
            old_model = load_model(name, args)
            if args.old_adapter is not None:
                old_model = PeftModel.from_pretrained(old_model, args.old_adapter).merge_and_unload()
            old_processing_class = old_processing_class or load_tokenizer(name, args)
        if old_processing_class is not None:
            check_same_vocabulary(old_processing_class, processing_class)
        return old_model

    def _check_partitioning(self) -> None:
        # The tiled loss reads the LM heads' weights outside their modules' forward: whole, or FSDP2 DTensors
        refuse_partitioning(self, ["loss_implementation='tiled'"] if self._loss_class is TiledLoss else [])

    @property
    def _exact(self) -> bool:
        """Whether the exact loss serves this run (`choose_loss`)."""
        return self._loss_class is ExactLoss

    @cached_property
    def _loss(self) -> MUSCLELoss:
        """The run's loss, built at its first batch, the model then on its device (the exact loss picks its
        log-sum-exp kernel from it)."""
        return self._loss_class(self)

    @contextmanager
    def _as_new_teacher(self, model):
        """The module that computes v2 as it was before training: the frozen adapter copy switched on, the
        student's adapter disabled, or the frozen copy of v2."""
        if self.new_teacher == "copy":
            yield self.new_model
            return
        peft_model = self.accelerator.unwrap_model(model)
        if self.new_teacher == "base":
            with peft_model.disable_adapter():
                yield peft_model
            return
        peft_model.set_adapter(NEW_TEACHER, inference_mode=True)
        try:
            yield peft_model
        finally:
            peft_model.set_adapter(self._student_adapter)  # the student again, trainable

    @torch.no_grad()
    def teacher_logits(self, model, model_inputs, labels):
        """(old, new) teachers: new = (B, L, V) logits of v2 before training; old = the old model's logits, or its
        cached top-k (`TopKLogProbs`)."""
        length = model_inputs["input_ids"].shape[1]
        with self._as_new_teacher(model) as teacher:
            new_logits = teacher(**model_inputs).logits[:, -length:]  # a prompt-learning adapter's virtual tokens
        if self.old_cache is None:
            return self.old_model(**model_inputs).logits, new_logits
        return self.cached_old(model_inputs, labels), new_logits

    @torch.no_grad()
    def teacher_hidden(self, model, model_inputs, labels):
        """(old, new) teachers for the tiled and exact losses: new = (last hidden states, head) of v2 before training;
        old = the same of the old model, or its cache's rows (`cached_old`)."""
        new = self._frozen_hidden(self.new_model, model_inputs) if self.new_teacher == "copy" \
            else self._live_new_teacher(model, model_inputs)
        if self.old_cache is not None:
            return self.cached_old(model_inputs, labels), new
        return self._frozen_hidden(self.old_model, model_inputs), new

    def cached_old(self, model_inputs, labels):
        """The old model on the batch from its cache (rows found by fingerprint): top-k log-probabilities
        (`TopKLogProbs`, (B, L, k): the KL is computed from this sparse form, never as a dense (B, L, V) tensor), or
        an exact cache's teacher vectors at the scored tokens (`exact.TeacherVectors`)."""
        mask = model_inputs["attention_mask"].bool()
        prints = [row_fingerprint(ids[m], lab[m]) for ids, lab, m in zip(model_inputs["input_ids"], labels, mask)]
        rows = self.old_cache.rows_for(prints)
        if self.old_cache.kind == "vectors":
            return self.old_cache.vectors_batch(rows, labels)
        return self.old_cache.topk_batch(rows, labels)

    def in_forward(self, wrapped, fn, *args):
        """`fn(unwrapped model, *args)` run inside `wrapped`'s forward (`_ForwardRedirection`), as TRL runs a
        model's backbone: DDP prepares its gradient reduction there, FSDP/DeepSpeed gather sharded parameters."""
        unwrapped = self.accelerator.unwrap_model(wrapped)
        return self._forward_redirection(wrapped, unwrapped, fn, unwrapped, *args)

    def _frozen_hidden(self, wrapped, model_inputs):
        """(last hidden states, head) of a frozen model, through its own wrapper (`in_forward`): calling the
        backbone directly would skip the gathering of its sharded parameters."""
        return self.in_forward(wrapped, last_hidden_state, model_inputs), \
            output_head(self.accelerator.unwrap_model(wrapped))

    def _live_new_teacher(self, model, inputs):
        """(last hidden states, head) of v2 before training, from the student's own model (`_as_new_teacher`)."""
        with torch.no_grad(), self._as_new_teacher(model) as teacher:
            return last_hidden_state(teacher, inputs), output_head(teacher)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        inputs = {**inputs, "use_cache": False}
        labels = inputs.pop("labels")
        out = self._loss(model, inputs, labels)
        loss, steps = self.normalise_token_loss(out.loss, out.tokens, num_items_in_batch, mode)
        if out.aux is not None and mode == "train":
            # as SFTTrainer: a per-micro-batch mean, averaged over the accumulation steps when the Trainer leaves
            # the accumulation to the loss
            weighted = self.router_aux_loss_coef * out.aux
            loss = loss + (weighted / steps if num_items_in_batch is not None else weighted)
        self.check_finite(loss, mode)
        self._log_loss(out, mode)
        self.count_tokens(inputs, mode)
        outputs = out.outputs
        if return_outputs and outputs is None:
            # TRL's prediction_step asks for outputs only when compute_metrics or preprocess_logits_for_metrics need
            # the logits. The tiled and exact losses build none: the student's are computed here, in evaluation
            # only, without gradients (as SFTTrainer recomputes them next to its fused head); training never holds
            # them
            with torch.no_grad():
                outputs = model(**inputs)
        return (loss, outputs) if return_outputs else loss

    def _log_loss(self, out: MUSCLELossOutput, mode: str) -> None:
        """The step's metrics from the loss's sums (`MUSCLELossOutput`), summed over the processes."""
        read_student = out.correct is not None  # not on the kernel path: no logits built
        zero = torch.zeros((), device=out.tokens.device)
        with torch.no_grad():
            sums = torch.stack([t.float() for t in (out.tokens, out.aligned_old, out.correct if read_student else zero,
                                                    out.kl, out.ce, out.entropy if read_student else zero)])
            count, aligned_old, right, kl_sum, ce_total, entropy_sum = \
                self.accelerator.gather_for_metrics(sums[None]).sum(0).tolist()
        if read_student:  # SFTTrainer's metrics, as its compute_loss logs them (0 for a batch without supervised tokens)
            self.log_metric(mode, "entropy", entropy_sum / count if count else 0.0)
            self.log_metric(mode, "mean_token_accuracy", right / count if count else 0.0)
        if count:
            self.log_metric(mode, "compat/frac_aligned_old", aligned_old / count)
            self.log_metric(mode, "compat/kl", kl_sum / count)
            if self.args.ce_weight > 0:
                self.log_metric(mode, "compat/ce", ce_total / count)
        if out.aux is not None:
            self.log_metric(mode, "aux_loss", self.accelerator.gather_for_metrics(out.aux.detach()).mean().item())
