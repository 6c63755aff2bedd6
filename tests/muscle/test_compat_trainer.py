
from pathlib import Path

import pytest
import torch
from conftest import ROOT, launch_two_processes, make_adapter
from datasets import Dataset
from in_process import run_cli, run_script
from trainer_rows import ROWS, assert_updates_agree, compat_args


def make_trainer(embedded_path, update, out, **kw):
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    return MUSCLETrainer(model=str(embedded_path), args=compat_args(out, update / "v2_adapter",
                                                                    old_model=str(update / "v1_task"), **kw),
                         train_dataset=Dataset.from_list(ROWS), processing_class=AutoTokenizer.from_pretrained(embedded_path))


@pytest.mark.parametrize("implementation", ["tiled", "logits"])
def test_loss_matches_reference_implementation(embedded_path, update, tmp_path, implementation):
    """The trainer's loss, from hidden states on tiles (default) or from full logits, equals the reference loss
    on the three models' logits computed here independently."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = make_trainer(embedded_path, update, tmp_path, temperature=2.0, ce_weight=0.5,
                           loss_implementation=implementation, vocab_chunk_size=7)
    loss, batch = first_batch_loss_of_a_moved_student(trainer)
    model_inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        student = trainer.model(**model_inputs).logits
        old = AutoModelForCausalLM.from_pretrained(update / "v1_task")(**model_inputs).logits
        new = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path),
                                        update / "v2_adapter")(**model_inputs).logits
    expected, m, labels = reference_loss(student, old, new, batch["labels"], ce_weight=0.5)
    assert loss == pytest.approx(expected, rel=1e-4)
    aligned_old = m.sum().item() / (labels != -100).sum().item()
    assert trainer._metrics["train"]["compat/frac_aligned_old"][-1] == pytest.approx(aligned_old)


def first_batch_loss_of_a_moved_student(trainer) -> tuple[float, dict]:
    """(loss, batch) of the trainer's first batch, the student's LoRA moved off its initial (= new teacher) weights,
    as after some training."""
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n and ".default." in n:
                p.add_(0.2 * torch.randn_like(p))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    return trainer.compute_loss(trainer.model, dict(batch)).item(), batch


def reference_loss(student, old, new, labels, ce_weight: float):
    """MUSCLE's loss (eq. 2, student_wrong mask, T = 2, + ce_weight × CE) from the three models' (B, L, V) logits
    by the reference formula: (loss, mask (B, L), shifted labels (B, L)). Checks both teachers are used."""
    from adaptguard.muscle.losses import muscle_token_loss
    from adaptguard.muscle.masks import student_wrong

    labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
    per_token, m = muscle_token_loss(student, old, new, labels, student_wrong, temperature=2.0)
    n = (labels != -100).sum()
    ce = torch.nn.functional.cross_entropy(student.reshape(-1, student.shape[-1]), labels.reshape(-1),
                                           ignore_index=-100, reduction="sum") / n
    assert 0 < m.sum() < n  # both teachers are used on this batch
    return (per_token.sum() / n + ce_weight * ce).item(), m, labels


def test_tiled_and_logits_losses_give_the_same_gradients(embedded_path, update, tmp_path):
    """The default tiled loss and the full-logits loss: the same value, the same gradient on every trainable parameter and
    the same evaluation loss (LoRA on the LM head is refused by TRL's SFTTrainer itself; the tiled function's LoRA-head
    case is in test_muscle_tiled). The mask is student_wrong: LL_L compares the old and new label log-probabilities,
    which on this toy update are equal to within 1e-6 on some tokens, so float noise between the two implementations
    could flip it."""
    adapter = update / "v2_adapter"
    grads, losses, evals = [], [], []
    for implementation in ("tiled", "logits"):
        from transformers import AutoTokenizer

        from adaptguard import MUSCLETrainer

        trainer = MUSCLETrainer(model=str(embedded_path), args=compat_args(
            tmp_path / implementation, adapter, old_model=str(update / "v1_task"), ce_weight=0.3,
            loss_implementation=implementation, vocab_chunk_size=5, kl_chunk_size=7),
            train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS[:4]),
            processing_class=AutoTokenizer.from_pretrained(embedded_path))
        torch.manual_seed(0)
        with torch.no_grad():  # the student away from the new teacher, as after some training
            for n, p in trainer.model.named_parameters():
                if "lora_B" in n and ".default." in n:
                    p.add_(0.2 * torch.randn_like(p))
        trainer.model.train()
        batch = next(iter(trainer.get_train_dataloader()))
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        evals.append(trainer.evaluate()["eval_loss"])  # the tiled path returns no logits: evaluation still runs
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and evals[0] == pytest.approx(evals[1], rel=1e-5)
    assert set(grads[0]) == set(grads[1]) and grads[0]
    for n in grads[1]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6, msg=n)


def test_training_moves_only_the_student_adapter(embedded_path, update, tmp_path):
    from adaptguard.muscle.trainer import NEW_TEACHER

    trainer = make_trainer(embedded_path, update, tmp_path, max_steps=3, learning_rate=1e-2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    teacher_before = {n: b.clone() for n, b in trainer.model.named_buffers() if NEW_TEACHER in n}
    assert teacher_before and all(torch.equal(b, before[n.replace(NEW_TEACHER, "default")])
                                  for n, b in teacher_before.items())  # a copy of v2's task adapter
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert moved and all(".default." in n for n in moved)
    # the frozen teacher copy: buffers, outside the optimiser and the user's parameters, unchanged by training
    assert not any(NEW_TEACHER in n for n in before)
    teacher = {n: b for n, b in trainer.model.named_buffers() if NEW_TEACHER in n}
    assert set(teacher) == set(teacher_before) and all(torch.equal(teacher_before[n], b) for n, b in teacher.items())
    # one copy of the v2 base: exactly one set of base weights in the student model
    base_weights = [n for n in after if n.endswith("embed_tokens.weight")]
    assert len(base_weights) == 1
    assert any("compat/frac_aligned_old" in h for h in trainer.state.log_history)


def one_sgd_step(embedded_path, update, out, **kw):
    trainer = make_trainer(embedded_path, update, out, max_steps=1, optim="sgd", learning_rate=1.0,
                           lr_scheduler_type="constant", **kw)
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".default." in n}


def test_gradient_accumulation_gives_the_big_batch_update(embedded_path, update, tmp_path):
    big = one_sgd_step(embedded_path, update, tmp_path / "a", per_device_train_batch_size=8)
    acc = one_sgd_step(embedded_path, update, tmp_path / "b", per_device_train_batch_size=2,
                       gradient_accumulation_steps=4)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # the student starts from the v2 task adapter
    start = dict(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path),
                                           update / "v2_adapter").named_parameters())
    moved = max((big[n] - start[n]).abs().max().item() for n in big if n in start)
    assert moved > 1e-5
    assert_updates_agree(big, acc, {n: start[n] for n in big})


DDP_SCRIPT = """
import sys, torch
sys.path[:0] = [{tests!r}, {here!r}]  # the helpers at tests/, and this test file
from test_compat_trainer import make_trainer
from pathlib import Path
from safetensors.torch import save_file
trainer = make_trainer(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], max_steps=1, optim="sgd",
                       learning_rate=1.0, lr_scheduler_type="constant", per_device_train_batch_size=4)
trainer.train()
assert trainer.accelerator.num_processes == 2
if trainer.accelerator.is_main_process:
    save_file({{n: p.detach().contiguous() for n, p in trainer.model.named_parameters() if ".default." in n}},
              sys.argv[3] + "/params.safetensors")
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()  # destroys the process group: no rank exits while the other still talks to it
"""


def test_two_processes_give_the_big_batch_update(embedded_path, update, tmp_path):
    from safetensors.torch import load_file

    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests"), here=str(Path(__file__).resolve().parent)))
    out = tmp_path / "ddp"
    out.mkdir()
    launch_two_processes(script, embedded_path, update, out)
    ddp = load_file(out / "params.safetensors")
    single = one_sgd_step(embedded_path, update, tmp_path / "single", per_device_train_batch_size=8)
    for n in single:
        torch.testing.assert_close(ddp[n], single[n], rtol=1e-4, atol=1e-7, msg=n)


def test_bad_input_fails_before_training(embedded_path, update, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from adaptguard import MUSCLETrainer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    data = Dataset.from_list(ROWS)
    with pytest.raises(ValueError, match="known masks"):
        make_trainer(embedded_path, update, tmp_path, mask="nope")
    with pytest.raises(ValueError, match="no PEFT adapter"):
        MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, tmp_path / "missing",
                                                                 old_model=str(update / "v1_task")),
                      train_dataset=data, processing_class=tok)
    make_adapter(embedded_path, tmp_path / "ia3", seed=3, kind="ia3")
    with pytest.raises(ValueError, match="LoRA"):
        MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, tmp_path / "ia3",
                                                                 old_model=str(update / "v1_task")),
                      train_dataset=data, processing_class=tok)
    vocab = dict(tok.get_vocab())
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {t: (i + 1) % len(vocab) for t, i in vocab.items()}, unk_token="<|pad|>")), pad_token="<|pad|>")
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="map tokens differently"):
        MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, update / "v2_adapter"),
                      old_model=AutoModelForCausalLM.from_pretrained(update / "v1_task"), old_processing_class=other,
                      train_dataset=data, processing_class=tok)
    with pytest.raises(ValueError, match="old \\(v1\\) task model"):
        MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, update / "v2_adapter"),
                      train_dataset=data, processing_class=tok)
    with pytest.raises(ValueError, match="temperature"):
        compat_args(tmp_path, update / "v2_adapter", temperature=0.0)


def test_cache_with_full_vocabulary_equals_online_teacher(embedded_path, update, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import MUSCLETrainer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    vocab = AutoModelForCausalLM.from_pretrained(embedded_path).config.vocab_size
    cache = tmp_path / "cache"
    ROWS_FILE = tmp_path / "rows.jsonl"
    import json

    ROWS_FILE.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = run_cli("cache-logits", "--old-model", update / "v1_task", "--tokenizer", embedded_path, "--dataset",
                   ROWS_FILE, "--out", cache, "--top-k", vocab)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((cache / "cache.json").read_text())["rows"] == len(ROWS)

    online = make_trainer(embedded_path, update, tmp_path / "online", ce_weight=0.3)
    cached = MUSCLETrainer(model=str(embedded_path),
                           args=compat_args(tmp_path / "cached", update / "v2_adapter", old_logits_cache=str(cache),
                                            ce_weight=0.3),
                           train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    assert cached.old_model is None  # v1 is not in memory
    batch = next(iter(online.get_train_dataloader()))
    for t in (online, cached):
        t.model.train()
    a = online.compute_loss(online.model, dict(batch)).item()
    b = cached.compute_loss(cached.model, dict(batch)).item()
    assert a > 0 and b == pytest.approx(a, rel=1e-5)


def test_topk_cache_approximates_and_fingerprints_are_checked(embedded_path, update, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import MUSCLETrainer
    from adaptguard.muscle.logit_cache import cache_logits_for_training

    tok = AutoTokenizer.from_pretrained(embedded_path)
    old = AutoModelForCausalLM.from_pretrained(update / "v1_task")
    online = make_trainer(embedded_path, update, tmp_path / "online")
    batch = next(iter(online.get_train_dataloader()))
    exact = online.compute_loss(online.model, dict(batch)).item()
    errors = []
    for k in (8, 128):
        cache = cache_logits_for_training(old, tok, Dataset.from_list(ROWS), tmp_path / f"c{k}", k=k)
        cached = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / f"cached{k}", update / "v2_adapter",
                                                                          old_logits_cache=str(cache)),
                               train_dataset=Dataset.from_list(ROWS), processing_class=tok)
        errors.append(abs(cached.compute_loss(cached.model, dict(batch)).item() - exact))
    assert errors[1] < errors[0]  # the top-k approximation tightens as k grows (k = V is exact: test above)
    other_rows = [{"prompt": r["prompt"] + " extra", "completion": r["completion"]} for r in ROWS]
    with pytest.raises(ValueError, match="not in the cache"):
        MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / "x", update / "v2_adapter",
                                                                 old_logits_cache=str(cache)),
                      train_dataset=Dataset.from_list(other_rows), processing_class=tok)
    with pytest.raises(ValueError, match="not an adaptguard logit cache"):
        compat_args(tmp_path / "y", update / "v2_adapter", old_logits_cache=str(tmp_path)) and \
            MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / "y", update / "v2_adapter",
                                                                     old_logits_cache=str(tmp_path)),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)


def test_example_script(embedded_path, update, tmp_path):
    out = tmp_path / "ex"
    proc = run_script(ROOT / "examples" / "muscle_update.py", "--model_name_or_path", embedded_path, "--new_adapter",
                      update / "v2_adapter", "--old_model", update / "v1_task", "--dataset_name", "data:domain",
                      "--max_steps", "2", "--per_device_train_batch_size", "4", "--bf16", "False", "--use_cpu",
                      "--report_to", "none", "--output_dir", out, "--mask", "old_likelier_token")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["peft_type"] == "LORA"
    assert not (out / "muscle_new_teacher").exists()


def test_streaming_dataset_trains_the_student_only(embedded_path, update, tmp_path):
    """A `datasets.IterableDataset` (streaming) trains MUSCLE as it trains SFTTrainer (issue 27): finite losses,
    the student adapter moves, the new teacher's copy and the base do not."""
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    trainer = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, update / "v2_adapter", max_steps=2,
                                                                       old_model=str(update / "v1_task")),
                            train_dataset=Dataset.from_list(ROWS).to_iterable_dataset(),
                            processing_class=AutoTokenizer.from_pretrained(embedded_path))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all(".default." in n for n in moved)


CUSTOM_CODE = """from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


class CustomLlamaTokenizer(PreTrainedTokenizerFast):
    pass


class CustomLlamaConfig(LlamaConfig):
    model_type = "custom_llama"


class CustomLlamaForCausalLM(LlamaForCausalLM):
    config_class = CustomLlamaConfig
"""


def test_model_init_kwargs_trust_remote_code_reaches_every_loader(embedded_path, update, tmp_path):
    """Models given by path load as SFTTrainer loads them (issue 27): `model_init_kwargs={"trust_remote_code": True}`
    reaches the v2 model, its tokenizer and the old model, here a checkpoint whose classes live in its own code
    file; without it the load is refused (transformers never asks on stdin)."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    custom = tmp_path / "custom"
    shutil.copytree(embedded_path, custom)
    (custom / "custom_llama.py").write_text(CUSTOM_CODE)
    config = json.loads((custom / "config.json").read_text())
    config.update(model_type="custom_llama", architectures=["CustomLlamaForCausalLM"],
                  auto_map={"AutoConfig": "custom_llama.CustomLlamaConfig",
                            "AutoModelForCausalLM": "custom_llama.CustomLlamaForCausalLM"})
    (custom / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((custom / "tokenizer_config.json").read_text())
    tokenizer_config.update(tokenizer_class="CustomLlamaTokenizer",
                            auto_map={"AutoTokenizer": [None, "custom_llama.CustomLlamaTokenizer"]})
    (custom / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    rows = Dataset.from_list(ROWS)

    def build(**kw):
        return MUSCLETrainer(model=str(custom), args=compat_args(tmp_path / "out", update / "v2_adapter",
                                                                 old_model=str(custom), **kw), train_dataset=rows)

    with pytest.raises(ValueError, match="trust_remote_code"):
        build()
    trainer = build(model_init_kwargs={"trust_remote_code": True, "dtype": "float32"})
    assert type(trainer.model.base_model.model).__name__ == "CustomLlamaForCausalLM"
    assert type(trainer.accelerator.unwrap_model(trainer.old_model)).__name__ == "CustomLlamaForCausalLM"
    assert type(trainer.processing_class).__name__ == "CustomLlamaTokenizer"
    assert trainer.processing_class.get_vocab() == AutoTokenizer.from_pretrained(embedded_path).get_vocab()
    trainer.model.train()
    assert torch.isfinite(trainer.compute_loss(trainer.model, dict(next(iter(trainer.get_train_dataloader())))))


def test_compute_metrics_gets_the_students_logits_with_the_tiled_loss(embedded_path, update, tmp_path):
    """`compute_metrics` works with the tiled loss as with SFTTrainer (issue 27): evaluation hands it the student's
    logits (here through `preprocess_logits_for_metrics`), and they change neither the loss nor training memory."""
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    def next_token_accuracy(prediction):
        labels = prediction.label_ids[:, 1:]
        return {"next_token_acc": float((prediction.predictions[:, :-1] == labels)[labels != -100].mean())}

    trainer = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path, update / "v2_adapter",
                                                                       old_model=str(update / "v1_task"),
                                                                       per_device_eval_batch_size=8),
                            train_dataset=Dataset.from_list(ROWS), eval_dataset=Dataset.from_list(ROWS),
                            processing_class=AutoTokenizer.from_pretrained(embedded_path),
                            compute_metrics=next_token_accuracy,
                            preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))
    with_metrics = trainer.evaluate()
    batch = next(iter(trainer.get_eval_dataloader()))
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    valid = labels != -100
    expected = ((logits.argmax(-1)[:, :-1] == labels) & valid).sum().item() / valid.sum().item()
    assert with_metrics["eval_next_token_acc"] == pytest.approx(expected)
    trainer.compute_metrics = trainer.preprocess_logits_for_metrics = None
    assert trainer.evaluate()["eval_loss"] == pytest.approx(with_metrics["eval_loss"], rel=1e-6)


def test_cut_cross_entropy_kernel_path_gives_the_torch_path_loss_and_gradients(embedded_path, update, tmp_path,
                                                                                monkeypatch):
    """lse_kernel='cut_cross_entropy' (its reference implementation on this CPU, torch.compile off) and 'torch': the
    same loss and the same gradient on every trainable parameter; a mask that reads the student is refused with the
    reason."""
    pytest.importorskip("cut_cross_entropy")
    import cut_cross_entropy.torch_compile as reference_impl

    monkeypatch.setattr(reference_impl, "torch_compile_linear_cross_entropy_apply",
                        reference_impl.torch_compile_linear_cross_entropy_apply.__wrapped__)
    results = []
    for kernel in ("torch", "cut_cross_entropy"):
        trainer = make_trainer(embedded_path, update, tmp_path / kernel, temperature=2.0, ce_weight=0.5,
                               mask="old_likelier_token", loss_implementation="exact", lse_kernel=kernel)
        torch.manual_seed(0)
        loss, batch = first_batch_loss_of_a_moved_student(trainer)
        trainer.compute_loss(trainer.model, dict(batch)).backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((loss, grads, trainer._metrics["train"]))
    (loss_t, grads_t, metrics_t), (loss_k, grads_k, metrics_k) = results
    assert loss_k == pytest.approx(loss_t, rel=1e-5)
    assert set(grads_k) == set(grads_t) and grads_t
    for n in grads_t:
        torch.testing.assert_close(grads_k[n], grads_t[n], rtol=1e-4, atol=1e-6, msg=n)
    assert metrics_k["compat/kl"][-1] == pytest.approx(metrics_t["compat/kl"][-1], rel=1e-5)
    assert "mean_token_accuracy" in metrics_t and "mean_token_accuracy" not in metrics_k  # no logits to read it from
    trainer = make_trainer(embedded_path, update, tmp_path / "refused", mask="student_wrong",
                           loss_implementation="exact", lse_kernel="cut_cross_entropy")
    with pytest.raises(ValueError, match="lse_kernel='cut_cross_entropy': the mask reads the student's answer"):
        first_batch_loss_of_a_moved_student(trainer)
