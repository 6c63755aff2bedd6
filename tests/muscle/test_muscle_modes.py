"""MUSCLETrainer trains the three ways SFTTrainer does (issue 27): from v2's task adapter (`new_adapter`, or a
`PeftModel` as `model`), a fresh adapter from `peft_config` (LoRA, prompt tuning, prefix tuning) and full
fine-tuning. In each, the new teacher is v2 as it was before training: the loss equals the reference loss on
logits computed here independently, training moves only the student, and the teacher stays as it was."""

import pytest
import torch
from datasets import Dataset
from test_compat_trainer import reference_loss
from trainer_rows import ROWS, compat_args

MODES = ["new_adapter", "peft_model", "lora", "prompt_tuning", "prefix_tuning", "full"]


def peft_config_of(mode):
    from peft import LoraConfig, PrefixTuningConfig, PromptTuningConfig

    return {"lora": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
            "prompt_tuning": PromptTuningConfig(num_virtual_tokens=3, task_type="CAUSAL_LM"),
            "prefix_tuning": PrefixTuningConfig(num_virtual_tokens=3, task_type="CAUSAL_LM")}.get(mode)


def v2_reference(mode, embedded_path, tiny_v2_path, update):
    """v2 as it was before training, built here without the trainer: the base with v2's task adapter (adapter
    modes), else tiny-v2 itself (the update is v2; a fresh adapter or full fine-tuning trains on it)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if mode in ("new_adapter", "peft_model"):
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path), update / "v2_adapter")
    return AutoModelForCausalLM.from_pretrained(tiny_v2_path)


def build(mode, embedded_path, tiny_v2_path, update, out, **kw):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import MUSCLETrainer

    new_adapter = update / "v2_adapter" if mode == "new_adapter" else None
    if mode == "new_adapter":
        model = str(embedded_path)
    elif mode == "peft_model":  # as a user loads it: not trainable until MUSCLE trains it
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path), update / "v2_adapter")
    else:
        model = str(tiny_v2_path)
    args = compat_args(out, new_adapter, **kw)
    return MUSCLETrainer(model=model, args=args, old_model=str(update / "v1_task"), peft_config=peft_config_of(mode),
                         train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS[:4]),
                         processing_class=AutoTokenizer.from_pretrained(embedded_path))


def trainable(trainer):
    return {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("mode", MODES)
def test_loss_equals_the_reference_on_independent_logits(mode, embedded_path, tiny_v2_path, update, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = build(mode, embedded_path, tiny_v2_path, update, tmp_path, ce_weight=0.5)
    torch.manual_seed(0)
    with torch.no_grad():  # the student away from v2, as after some training
        for p in trainable(trainer).values():
            p.add_(0.05 * torch.randn_like(p))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch)).item()

    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        student = trainer.model(**inputs).logits[:, -length:]  # after a prompt-tuning adapter's virtual tokens
        old = AutoModelForCausalLM.from_pretrained(update / "v1_task")(**inputs).logits
        new = v2_reference(mode, embedded_path, tiny_v2_path, update)(**inputs).logits
    assert not torch.allclose(student, new, atol=1e-4)  # the student did move away from the teacher
    expected, _, labels = reference_loss(student, old, new, batch["labels"], ce_weight=0.5)
    assert loss == pytest.approx(expected, rel=1e-4)
    entropy = torch.distributions.Categorical(logits=student).entropy()[labels != -100].mean().item()
    assert trainer._metrics["train"]["entropy"][-1] == pytest.approx(entropy, rel=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_training_moves_the_student_and_keeps_v2(mode, embedded_path, tiny_v2_path, update, tmp_path):
    from adaptguard.muscle.trainer import NEW_TEACHER

    trainer = build(mode, embedded_path, tiny_v2_path, update, tmp_path, max_steps=2, learning_rate=1e-2,
                    per_device_train_batch_size=4)
    meant = set(trainable(trainer))
    assert meant
    if mode != "full":  # an adapter trains; the base stays
        assert all("lora_" in n or "prompt_encoder" in n for n in meant), sorted(meant)[:5]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    teacher = trainer.new_model if mode == "full" else None
    teacher_before = None if teacher is None else {n: p.detach().clone() for n, p in teacher.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and moved <= meant and NEW_TEACHER not in "".join(moved)
    if teacher is not None:
        assert all(torch.equal(teacher_before[n], p) for n, p in trainer.new_model.named_parameters())
    logged = set().union(*trainer.state.log_history)
    assert {"loss", "entropy", "mean_token_accuracy", "num_tokens", "compat/kl"} <= logged
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_one_way_at_a_time(embedded_path, update, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from adaptguard import MUSCLETrainer

    args = compat_args(tmp_path, update / "v2_adapter", old_model=str(update / "v1_task"))
    with pytest.raises(ValueError, match="new_adapter is v2's task adapter"):
        MUSCLETrainer(model=str(embedded_path), args=args, peft_config=peft_config_of("lora"),
                      train_dataset=Dataset.from_list(ROWS))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path), update / "v2_adapter")
    with pytest.raises(ValueError, match="already a PeftModel"):
        MUSCLETrainer(model=peft_model, args=compat_args(tmp_path, None, old_model=str(update / "v1_task")),
                      peft_config=peft_config_of("lora"), train_dataset=Dataset.from_list(ROWS))


@pytest.mark.parametrize("old", ["model", "cache"])
def test_bf16_mixed_precision_reaches_the_student_and_the_teachers(old, embedded_path, update, tmp_path):
    """`bf16=True` on fp32 weights is accelerate's autocast around the model's forward; the tiled loss runs the
    backbones through the forward redirection, so it must keep that autocast: every projection of the student, of
    v2 (the new teacher) and of v1 runs in bf16 during `train()`, as in SFTTrainer's step."""
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer
    from adaptguard.muscle.logit_cache import cache_logits_for_training

    tok = AutoTokenizer.from_pretrained(embedded_path)
    if old == "cache":
        from transformers import AutoModelForCausalLM

        cache_logits_for_training(AutoModelForCausalLM.from_pretrained(update / "v1_task"), tok,
                                  Dataset.from_list(ROWS), tmp_path / "cache", k=8)
    source = {"old_logits_cache": str(tmp_path / "cache")} if old == "cache" else {"old_model": str(update / "v1_task")}
    trainer = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / "out", update / "v2_adapter",
                                                                       bf16=True, max_steps=1, **source),
                            train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    seen = {}
    models = {"trained": trainer.model, **({"v1": trainer.old_model} if old == "model" else {})}
    for who, model in models.items():
        for name, module in model.named_modules():
            if name.endswith("q_proj.base_layer") or (name.endswith("q_proj") and who == "v1"):
                module.register_forward_hook(lambda m, i, o, key=(who, name): seen.setdefault(key, set()).add(o.dtype))
    trainer.train()
    assert next(trainer.model.parameters()).dtype == torch.float32  # fp32 weights: the autocast does the bf16
    assert seen and {who for who, _ in seen} == set(models)
    assert all(dtypes == {torch.bfloat16} for dtypes in seen.values()), seen
