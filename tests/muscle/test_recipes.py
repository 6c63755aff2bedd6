"""The named retraining recipes (issue 35): MUSCLETrainer's loss for each against the recipe's formula computed here
from the models' logits (focal distillation's per-item weights, the cross-entropy term, the temperature), the
registry, and the config's refusals."""

import pytest
import torch
from datasets import Dataset


def v1_rows(update, embedded_path) -> list[dict]:
    """Pretokenized rows of which v1 gets exactly the first four right: their completions are v1's own greedy
    continuation (so every completion token is v1's argmax); the other four change its first token."""
    from trainer_rows import ROWS
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    v1 = AutoModelForCausalLM.from_pretrained(update / "v1_task").eval()
    rows = []
    for i, row in enumerate(ROWS):
        prompt = tok(row["prompt"])["input_ids"]
        with torch.no_grad():
            out = v1.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False,
                              pad_token_id=tok.pad_token_id, eos_token_id=None)[0, len(prompt):].tolist()
        if i >= 4:
            out[0] = (out[0] + 1) % len(tok)
        rows.append({"input_ids": prompt + out, "completion_mask": [0] * len(prompt) + [1] * len(out)})
    return rows


def recipe_trainer(embedded_path, update, out, **kw):
    from trainer_rows import compat_args
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    kw.setdefault("completion_only_loss", True)  # pretokenized rows: their completion_mask marks what is scored
    return MUSCLETrainer(model=str(embedded_path), args=compat_args(out, update / "v2_adapter",
                                                                    old_model=str(update / "v1_task"), **kw),
                         train_dataset=Dataset.from_list(v1_rows(update, embedded_path)),
                         processing_class=AutoTokenizer.from_pretrained(embedded_path))


def recipe_loss_by_hand(student, old, labels, *, temperature, distill_weight, alpha, beta, ce_weight):
    """L = (Σ_t λ·(α + β·1[v1 right on the row])·KL(softmax(z_old/T) ‖ softmax(z_s/T)) + λ_CE·Σ_t CE) / n, v1 right on
    a row = v1's argmax is the label at every scored token. Returns (loss, rows v1 gets right)."""
    labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    valid = labels != -100
    right = torch.tensor([bool((old[b].argmax(-1) == labels[b])[valid[b]].all()) for b in range(len(labels))])
    p_old = torch.softmax(old.double() / temperature, -1)
    kl = (p_old * (torch.log(p_old) - torch.log_softmax(student.double() / temperature, -1))).sum(-1)
    weight = alpha + beta * right.double()
    ce = -torch.log_softmax(student.double(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    n = valid.sum()
    total = (distill_weight * weight[:, None] * kl * valid).sum() + ce_weight * (ce * valid).sum()
    return (total / n).item(), right


@pytest.mark.parametrize("recipe, implementation, kw, expected_fields", [
    ("focal", "tiled", dict(distill_weight=0.5, temperature=3.0), dict(alpha=1.0, beta=5.0, ce_weight=1.0)),
    ("focal", "logits", dict(distill_weight=0.5, temperature=3.0, focal_alpha=0.5, focal_beta=2.0),
     dict(alpha=0.5, beta=2.0, ce_weight=1.0)),
    ("kd", "tiled", dict(distill_weight=2.0, temperature=1.5), dict(alpha=1.0, beta=0.0, ce_weight=1.0)),
    ("control", "tiled", dict(temperature=2.0), dict(alpha=1.0, beta=0.0, ce_weight=1.0)),
])
def test_recipe_loss_matches_its_formula(embedded_path, update, tmp_path, recipe, implementation, kw, expected_fields):
    from test_compat_trainer import first_batch_loss_of_a_moved_student
    from transformers import AutoModelForCausalLM

    trainer = recipe_trainer(embedded_path, update, tmp_path, recipe=recipe, loss_implementation=implementation,
                             vocab_chunk_size=7, **kw)
    args = trainer.args
    assert (args.focal_alpha, args.focal_beta, args.ce_weight) == tuple(expected_fields[k] for k in
                                                                        ("alpha", "beta", "ce_weight"))
    loss, batch = first_batch_loss_of_a_moved_student(trainer)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        student = trainer.model(**inputs).logits
        old = AutoModelForCausalLM.from_pretrained(update / "v1_task")(**inputs).logits
    distill = 0.0 if recipe == "control" else args.distill_weight
    expected, right = recipe_loss_by_hand(student, old, batch["labels"], temperature=args.temperature,
                                          distill_weight=distill, alpha=expected_fields["alpha"],
                                          beta=expected_fields["beta"], ce_weight=expected_fields["ce_weight"])
    assert sorted(right.tolist()) == [False] * 4 + [True] * 4, right  # built so (in a shuffled batch): weights differ by item
    assert loss == pytest.approx(expected, rel=1e-4)


def test_the_control_recipe_is_sfts_loss(embedded_path, update, tmp_path):
    """recipe='control' is cross-entropy alone: the same loss as SFTTrainer's on the same batch."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    trainer = recipe_trainer(embedded_path, update, tmp_path / "m", recipe="control")
    batch = next(iter(trainer.get_train_dataloader()))
    sft = SFTTrainer(model=trainer.model, args=SFTConfig(str(tmp_path / "s"), use_cpu=True, bf16=False,
                                                         report_to="none", per_device_train_batch_size=8,
                                                         completion_only_loss=True),
                     train_dataset=Dataset.from_list(v1_rows(update, embedded_path)),
                     processing_class=AutoTokenizer.from_pretrained(embedded_path))
    trainer.model.train()
    assert trainer.compute_loss(trainer.model, dict(batch)).item() == pytest.approx(
        sft.compute_loss(trainer.model, dict(batch)).item(), rel=1e-5)


def test_focal_item_weights_on_constructed_inputs():
    from adaptguard.muscle.losses import MaskInputs
    from adaptguard.muscle.masks import focal_item_weights, old_right_items

    labels = torch.tensor([[5, 6, -100], [5, 6, 7], [-100, -100, -100], [1, 2, 3]])
    old_top1 = torch.tensor([[5, 6, 0], [5, 9, 7], [0, 0, 0], [1, 2, 3]])
    zeros = torch.zeros(4, 3)
    x = MaskInputs(labels=labels, valid=labels != -100, student_top1=old_top1, old_top1=old_top1, new_top1=old_top1,
                   student_label_logp=zeros, old_label_logp=zeros, new_label_logp=zeros)
    # row 0: right where scored (the ignored position does not count); row 1: one token wrong; row 2: nothing scored
    assert old_right_items(x).tolist() == [True, False, False, True]
    assert focal_item_weights(x, 1.0, 5.0).tolist() == [6.0, 1.0, 1.0, 6.0]


def test_recipes_are_registered_by_name_and_set_only_unset_fields():
    from adaptguard import MUSCLEConfig
    from adaptguard.plugins import get_update_recipe, update_recipes

    assert set(update_recipes()) >= {"control", "muscle", "ll_l", "focal", "kd"}
    assert get_update_recipe("ll_l").settings == {"mask": "old_likelier_token"}
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    cfg = MUSCLEConfig(**common, recipe="ll_l", ce_weight=0.3)
    assert (cfg.mask, cfg.ce_weight, cfg.distill_weight) == ("old_likelier_token", 0.3, 1.0)
    cfg = MUSCLEConfig(**common, recipe="focal", focal_beta=0.0)  # an explicit value wins, even the plain default
    assert (cfg.mask, cfg.focal_beta, cfg.ce_weight) == ("old_only", 0.0, 1.0)
    assert (MUSCLEConfig(**common).mask, MUSCLEConfig(**common).ce_weight) == ("student_wrong", 0.0)
    with pytest.raises(ValueError, match=r"Unknown update recipe 'focl'; known recipes: control, focal, kd, ll_l"):
        MUSCLEConfig(**common, recipe="focl")
    with pytest.raises(ValueError, match="focal_beta must be ≥ 0"):
        MUSCLEConfig(**common, recipe="focal", focal_beta=-1.0)
    with pytest.raises(ValueError, match="packing"):
        MUSCLEConfig(**common, recipe="focal", packing=True)
