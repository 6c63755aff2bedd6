from __future__ import annotations

import logging
from contextlib import contextmanager
from types import SimpleNamespace

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
from ..utils.labels import IGNORE_INDEX, shifted_labels
from .config import MUSCLEConfig
from .heads import backbone_outputs, last_hidden_state, output_head
from .logit_cache import LogitCache, row_fingerprint
from .losses import muscle_token_loss_chunked
from .masks import focal_item_weights
from .tiled import muscle_token_loss_tiled

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


def router_aux_loss(model, router_logits, attention_mask) -> torch.Tensor:
    """An MoE model's load-balancing loss from its router logits, as SFTTrainer's fused head computes it (Mixtral's
    `load_balancing_loss_func`, which every MoE family of transformers shares)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    config = model.config.get_text_config()
    return load_balancing_loss_func(router_logits, config.num_experts, config.num_experts_per_tok, attention_mask)


def is_prompt_learning(model) -> bool:
    """Whether `model` is a `PeftModel` whose adapter acts on the inputs (prompt / prefix tuning, prompt encoder)."""
    from peft import PeftModel

    return isinstance(model, PeftModel) and model.peft_config[model.active_adapter].is_prompt_learning


class MUSCLETrainer(SFTBookkeeping, SFTTrainer):
    r"""MUSCLE (paper 002 §4.1): train the new model (v2) so that the updated task model keeps the old one's right
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
        # unknown names fail before anything loads; focal's per-item weights read the mask's inputs
        self._mask = _SeenInputs(get_muscle_mask(args.mask)) if args.focal_beta > 0 else get_muscle_mask(args.mask)
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
        # Prompt-learning adapters act in PeftModel.forward, which the tiled loss (from the backbone) would skip
        self._exact = args.loss_implementation in ("auto", "exact") and self._exact_reason(unwrapped) is None
        if args.loss_implementation == "exact" and not self._exact:
            raise ValueError(f"loss_implementation='exact': {self._exact_reason(unwrapped)}; use 'auto' or 'tiled'")
        if args.loss_implementation == "auto" and not self._exact:
            logger.info(f"MUSCLE: {self._exact_reason(unwrapped)}, so the loss is computed on vocabulary tiles "
                        "(loss_implementation='tiled')")
        tiled_asked = args.loss_implementation == "tiled" or (args.loss_implementation != "logits" and not self._exact)
        self._tiled = tiled_asked and not self._exact and not is_prompt_learning(unwrapped)
        if tiled_asked and not self._tiled and not self._exact:
            logger.info("MUSCLE: a prompt-learning adapter acts before the backbone, so the loss is computed from "
                        "the models' logits (loss_implementation='logits')")
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

    def _exact_reason(self, unwrapped) -> str | None:
        """Why the exact loss from teacher vectors (`muscle.exact`) cannot serve this run (None when it can)."""
        from .exact import check_reducible

        if is_prompt_learning(unwrapped):
            return "a prompt-learning adapter acts before the backbone"
        if self.old_cache is not None and self.old_cache.kind != "vectors":
            return "old_logits_cache holds top-k log-probabilities (an exact cache: adaptguard cache-logits --kind vectors)"
        reason = check_reducible(output_head(unwrapped), unwrapped.get_output_embeddings().weight.requires_grad)
        if reason:
            return reason
        mask = getattr(self._mask, "mask", self._mask)
        if getattr(mask, "per_token", False):
            return None
        from .exact import _StudentNeeded, _TeachersOnly

        probe = torch.zeros(1, 1, dtype=torch.long)
        try:
            mask(_TeachersOnly(labels=probe, valid=probe.bool(), old_top1=probe, new_top1=probe,
                               old_label_logp=probe.float(), new_label_logp=probe.float()))
        except _StudentNeeded:
            return f"mask {self._mask.__name__!r} reads the student's answer across tokens"
        except Exception:  # noqa: BLE001 - a mask that needs real inputs: decided on the first batch
            return None
        return None

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
        refuse_partitioning(self, ["loss_implementation='tiled'"] if self._tiled else [])

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
        return self.cached_old_topk(model_inputs, labels), new_logits

    def cached_old_topk(self, model_inputs, labels):
        """The old model's top-k log-probabilities of the batch from the cache (rows found by fingerprint), as
        `TopKLogProbs`: the KL is computed from this sparse form, never as a dense (B, L, V) tensor."""
        mask = model_inputs["attention_mask"].bool()
        prints = [row_fingerprint(ids[m], lab[m]) for ids, lab, m in zip(model_inputs["input_ids"], labels, mask)]
        return self.old_cache.topk_batch(self.old_cache.rows_for(prints), labels)

    def _frozen_hidden(self, wrapped, model_inputs):
        """(last hidden states, head) of a frozen model, through its own wrapper, as TRL runs a teacher's backbone:
        FSDP/DeepSpeed gather its sharded parameters in the wrapper's forward, which calling the backbone directly
        would skip."""
        unwrapped = self.accelerator.unwrap_model(wrapped)
        return (self._forward_redirection(wrapped, unwrapped, last_hidden_state, unwrapped, model_inputs),
                output_head(unwrapped))

    @torch.no_grad()
    def teacher_hidden(self, model, model_inputs, labels):
        """(old, new) teachers for the tiled loss: new = (last hidden states, head) of v2 before training; old = the
        same of the old model, or its cached top-k (`TopKLogProbs`)."""
        if self.new_teacher == "copy":
            new = self._frozen_hidden(self.new_model, model_inputs)
        else:
            with self._as_new_teacher(model) as teacher:
                new = last_hidden_state(teacher, model_inputs), output_head(teacher)
        if self.old_cache is not None:
            return self.cached_old_topk(model_inputs, labels), new
        return self._frozen_hidden(self.old_model, model_inputs), new

    def _tiled_loss(self, model, inputs, labels, shifted):
        """Runs inside the wrapper's forward (`_ForwardRedirection`), so DDP prepares its gradient reduction."""
        old, (new_hidden, new_head) = self.teacher_hidden(model, inputs, labels)
        student = backbone_outputs(model, {**inputs, **({"output_router_logits": True} if self.aux_loss_enabled
                                                         else {})})
        out = muscle_token_loss_tiled(student.last_hidden_state, output_head(model), new_hidden, new_head, old,
                                      shifted, mask=self._mask, temperature=self.args.temperature,
                                      token_chunk=self.args.kl_chunk_size, vocab_chunk=self.args.vocab_chunk_size,
                                      compile=self.args.compile_loss)
        aux = router_aux_loss(model, student.router_logits, inputs.get("attention_mask")) \
            if self.aux_loss_enabled else None
        return out, aux

    def _exact_loss(self, model, inputs, labels, shifted):
        """The exact loss from teacher vectors (`muscle.exact`); runs inside the wrapper's forward, as `_tiled_loss`.
        Returns per-token (B, T) grids: the weighted loss (its sum is the step's loss, gradient inside), the KL mix,
        m, the student's argmax and entropy, and the cross-entropy's sum."""
        from .exact import exact_token_loss, kernel_token_loss, lse_kernel_reason, mask_weights, stack, teacher_vectors
        from .masks import old_right_items

        args = self.args
        valid = shifted != IGNORE_INDEX
        scored = valid.reshape(-1).nonzero()[:, 0]
        y = shifted.reshape(-1)[scored]
        head = output_head(model)
        at_scored = lambda h: h.reshape(-1, h.shape[-1])[scored]  # noqa: E731
        new_hidden, new_head = (self._frozen_hidden(self.new_model, inputs) if self.new_teacher == "copy"
                                else self._live_new_teacher(model, inputs))
        new = teacher_vectors(at_scored(new_hidden), new_head, head, y, args.temperature, args.kl_chunk_size)
        if self.old_cache is not None:
            old = self.cached_old_vectors(inputs, labels, head)
        else:
            old_hidden, old_head = self._frozen_hidden(self.old_model, inputs)
            old = teacher_vectors(at_scored(old_hidden), old_head, head, y, args.temperature, args.kl_chunk_size)
        student = backbone_outputs(model, {**inputs, **({"output_router_logits": True} if self.aux_loss_enabled
                                                         else {})})
        item = torch.full((len(y),), args.distill_weight * args.focal_alpha, device=y.device)
        if args.focal_beta > 0:  # w_i = α + β·1[v1 right on item i], from v1's argmax on every token of the row
            grid = torch.zeros(shifted.numel(), dtype=torch.long, device=y.device)
            grid[scored] = old.top1
            right = old_right_items(SimpleNamespace(old_top1=grid.view(shifted.shape), labels=shifted, valid=valid))
            rows = torch.div(scored, shifted.shape[1], rounding_mode="floor")
            item = args.distill_weight * (args.focal_alpha + args.focal_beta * right[rows].float())
        weights = mask_weights(getattr(self._mask, "mask", self._mask), shifted, scored, old, new, item)
        ce = torch.full_like(item, args.ce_weight) if args.ce_weight > 0 else None
        hidden = at_scored(student.last_hidden_state)
        kernel_reason = lse_kernel_reason(head, weights.reads_student)
        if args.lse_kernel == "cut_cross_entropy" and kernel_reason:
            raise ValueError(f"lse_kernel='cut_cross_entropy': {kernel_reason}; use lse_kernel='torch' or 'auto'")
        if args.lse_kernel == "cut_cross_entropy" or (args.lse_kernel == "auto" and hidden.is_cuda
                                                      and kernel_reason is None):
            all_weights = weights(torch.arange(len(y), device=y.device), None)
            loss, kl_mix, ce_part = kernel_token_loss(hidden, head, y, all_weights, stack([old, new]),
                                                      temperature=args.temperature, ce_weight=ce)
            out = SimpleNamespace(loss=loss, kl=kl_mix, ce=ce_part, weights=all_weights, student_top1=None,
                                  student_entropy=None)
        else:
            out = exact_token_loss(hidden, head, y, weights, cached=stack([old, new]), temperature=args.temperature,
                                   ce_weight=ce, token_chunk=args.kl_chunk_size)
        aux = router_aux_loss(model, student.router_logits, inputs.get("attention_mask")) \
            if self.aux_loss_enabled else None
        w = out.weights.sum(-1)
        m = torch.where(w > 0, out.weights[:, 0] / w.clamp(min=1e-30), (item == 0) * 0.0)

        def grid_of(values, dtype=torch.float32):
            if values is None:  # the kernel path: no student logits were built to read it from
                return None
            g = torch.zeros(shifted.numel(), dtype=dtype, device=y.device)
            g[scored] = values.to(dtype)
            return g.view(shifted.shape)

        # the KL mix without λ·w_i, as the other paths log it (0 where λ·w_i is 0: nothing distils there)
        kl = torch.where(item > 0, out.kl / item.clamp(min=1e-30), torch.zeros_like(out.kl))
        return (out.loss.sum(), grid_of(kl), grid_of(m), grid_of(out.student_top1, torch.long),
                grid_of(out.student_entropy), out.ce.sum()), aux

    def _live_new_teacher(self, model, inputs):
        with torch.no_grad(), self._as_new_teacher(model) as teacher:
            return last_hidden_state(teacher, inputs), output_head(teacher)

    def cached_old_vectors(self, model_inputs, labels, head):
        """The old model's teacher vectors of the batch's scored tokens from an exact cache (rows found by
        fingerprint), checked against the student's output layer and temperature."""
        self.old_cache.check_vectors(head, self.args.temperature)
        mask = model_inputs["attention_mask"].bool()
        prints = [row_fingerprint(ids[m], lab[m]) for ids, lab, m in zip(model_inputs["input_ids"], labels, mask)]
        return self.old_cache.vectors_batch(self.old_cache.rows_for(prints), labels)

    def _distillation_weights(self, per_token: torch.Tensor) -> torch.Tensor:
        """λ·w_i times each token's KL (B, T): w_i = α + β·1[v1 right on item i] (focal distillation)."""
        args = self.args
        if args.focal_beta > 0:
            weights = focal_item_weights(self._mask.inputs, args.focal_alpha, args.focal_beta)[:, None]
            return args.distill_weight * weights * per_token
        scale = args.distill_weight * args.focal_alpha
        return per_token if scale == 1 else scale * per_token

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        args = self.args
        inputs = {**inputs, "use_cache": False}
        labels = inputs.pop("labels")
        shifted = shifted_labels(labels)  # shift the labels, not the (large) logits
        valid = shifted != IGNORE_INDEX
        outputs = None
        if self._exact:
            unwrapped = self.accelerator.unwrap_model(model)
            with self.accelerator.autocast():
                (total, per_token, m, student_top1, entropy, ce_sum), aux = self._forward_redirection(
                    model, unwrapped, self._exact_loss, unwrapped, inputs, labels, shifted)
        elif self._tiled:
            unwrapped = self.accelerator.unwrap_model(model)
            # accelerate's mixed precision is an autocast around the model's forward, which the redirection
            # replaces and the backbones bypass: without this, bf16=True would train and distil in fp32
            with self.accelerator.autocast():
                out, aux = self._forward_redirection(model, unwrapped, self._tiled_loss, unwrapped, inputs, labels,
                                                     shifted)
            per_token, m, student_top1, entropy = out.kl, out.m, out.student_top1, out.student_entropy
            ce_sum = out.ce.sum()
        else:  # the (B, L, V) logits of all three models, then a chunked KL: for debugging, prompt learning
            old_logits, new_logits = self.teacher_logits(model, inputs, labels)
            outputs = model(**inputs, **({"output_router_logits": True} if self.aux_loss_enabled else {}))
            aux = outputs.aux_loss if self.aux_loss_enabled else None
            student = outputs.logits[:, -labels.shape[1]:]  # a prompt-learning adapter's virtual tokens dropped
            per_token, m = muscle_token_loss_chunked(student, old_logits, new_logits, shifted, mask=self._mask,
                                                     temperature=args.temperature, chunk_size=args.kl_chunk_size or 1024)
            with torch.no_grad():
                student_top1 = student.argmax(-1)
                entropy = torch.distributions.Categorical(logits=student.float()).entropy() * valid
            ce_sum = torch.nn.functional.cross_entropy(student.reshape(-1, student.shape[-1]).float(),
                                                       shifted.reshape(-1), ignore_index=IGNORE_INDEX,
                                                       reduction="sum") if args.ce_weight > 0 \
                else torch.zeros((), device=student.device)
        if not self._exact:  # the exact loss weighs its tokens and adds the cross-entropy itself
            total = self._distillation_weights(per_token).sum()
            if args.ce_weight > 0:
                total = total + args.ce_weight * ce_sum
        loss, steps = self.normalise_token_loss(total, valid.sum(), num_items_in_batch, mode)
        if aux is not None and mode == "train":
            # as SFTTrainer: a per-micro-batch mean, averaged over the accumulation steps when the Trainer leaves
            # the accumulation to the loss
            weighted = self.router_aux_loss_coef * aux
            loss = loss + (weighted / steps if num_items_in_batch is not None else weighted)
        self.check_finite(loss, mode)

        with torch.no_grad():
            read_student = student_top1 is not None  # not on the kernel path (no logits built)
            correct = (student_top1 == shifted) & valid if read_student else torch.zeros_like(valid)
            entropy = entropy if read_student else torch.zeros(1, device=valid.device)
            sums = torch.stack([valid.sum().float(), m.sum().float(), correct.sum().float(),
                                per_token.detach().sum().float(), ce_sum.detach().float(), entropy.sum().float()])
            gathered = self.accelerator.gather_for_metrics(sums[None]).sum(0).tolist()
            count, aligned_old, right, kl_sum, ce_total, entropy_sum = gathered
        if read_student:  # SFTTrainer's metrics, as its compute_loss logs them (0 for a batch without supervised tokens)
            self.log_metric(mode, "entropy", entropy_sum / count if count else 0.0)
            self.log_metric(mode, "mean_token_accuracy", right / count if count else 0.0)
        if count:
            self.log_metric(mode, "compat/frac_aligned_old", aligned_old / count)
            self.log_metric(mode, "compat/kl", kl_sum / count)
            if args.ce_weight > 0:
                self.log_metric(mode, "compat/ce", ce_total / count)
        self.count_tokens(inputs, mode)
        if aux is not None:
            self.log_metric(mode, "aux_loss", self.accelerator.gather_for_metrics(aux.detach()).mean().item())
        if return_outputs and outputs is None:
            # TRL's prediction_step asks for outputs only when compute_metrics or preprocess_logits_for_metrics need
            # the logits. The tiled loss builds none: the student's are computed here, in evaluation only, without
            # gradients (as SFTTrainer recomputes them next to its fused head); training never holds them
            with torch.no_grad():
                outputs = model(**inputs)
        return (loss, outputs) if return_outputs else loss


class _SeenInputs:
    """A mask that keeps the `MaskInputs` it was last called with, so the trainer reads v1's per-item correctness
    from the very statistics the loss computed (the tiled loss builds no logits to recompute them from)."""

    def __init__(self, mask):
        self.mask, self.__name__, self.inputs = mask, getattr(mask, "__name__", repr(mask)), None

    def __call__(self, inputs):
        self.inputs = inputs
        return self.mask(inputs)
