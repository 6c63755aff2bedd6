import json
import logging
import math
import statistics
import warnings

import pytest
import torch
from conftest import ROOT, cpu_args, launch_two_processes
from datasets import Dataset
from trainer_rows import ROWS, assert_updates_agree

from adaptguard import TALRConfig, TALRTrainer


def first_batch(trainer):
    batch = next(iter(trainer.get_train_dataloader()))
    return {k: v for k, v in batch.items()}


def independent_token_nll(model, batch):
    """-log p(label) of every next-token label, from the full logits (no fused head)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    logp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    return -logp, mask


@pytest.mark.parametrize("tau", [None, 0.8])
def test_loss_matches_independent_formula(tiny, tmp_path, tau):
    model, tok = tiny
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, talr_tau=tau, per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    batch = first_batch(trainer)
    nll, mask = independent_token_nll(model, batch)
    if tau is None:
        seq_means = [nll[i][mask[i]].mean().item() for i in range(len(nll))]
        tau = statistics.median(seq_means)
    w = torch.where(mask, torch.exp(-nll / tau).clamp(min=0.01), torch.zeros_like(nll))
    expected = (w * nll).sum() / mask.sum()
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    logged = trainer._metrics["train"]
    assert logged["talr/tau"][-1] == pytest.approx(tau, rel=1e-4)
    assert logged["talr/mean_weight"][-1] == pytest.approx((w.sum() / mask.sum()).item(), rel=1e-4)
    assert logged["talr/frac_p_gt_0.2"][-1] == pytest.approx(((nll < -torch.log(torch.tensor(0.2))) & mask).sum().item()
                                                            / mask.sum().item())
    assert "entropy" in logged and "mean_token_accuracy" in logged and "num_tokens" in logged


def test_weighting_none_is_plain_sft(tiny, tmp_path):
    model, tok = tiny
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, weighting="none", per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    batch = first_batch(trainer)
    nll, mask = independent_token_nll(model, batch)
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    assert loss.item() == pytest.approx((nll[mask].sum() / mask.sum()).item(), rel=1e-4)


def train_once(model, tok, out, **kwargs):
    args = cpu_args(out, max_steps=1, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant",
                    talr_tau=1.0, **kwargs)
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def assert_same_update(a, b, init):
    moved = max((a[n] - init[n]).abs().max().item() for n in a)
    assert moved > 1e-4  # the step did something
    assert_updates_agree(a, b, init)


def test_gradient_accumulation_gives_the_big_batch_update(embedded_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    init = {n: p.detach().clone() for n, p in AutoModelForCausalLM.from_pretrained(embedded_path).named_parameters()}
    big = train_once(AutoModelForCausalLM.from_pretrained(embedded_path), tok, tmp_path / "a",
                     per_device_train_batch_size=8)
    accum = train_once(AutoModelForCausalLM.from_pretrained(embedded_path), tok, tmp_path / "b",
                       per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert_same_update(big, accum, init)


# One `accelerate launch` of two processes for both tests below (a launch costs three Python processes' imports):
# first the update that must equal the big batch's, then token analysis on a fresh model.
DDP_SCRIPT = """
import json, sys, torch, torch.distributed as dist
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, {tests!r})
from conftest import cpu_args
from trainer_rows import ROWS
from adaptguard import TALRTrainer
path, out = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)

# 1. one SGD step on 4 rows per rank: the update of one step on all 8 rows
args = cpu_args(out + "/ddp", max_steps=1, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant", talr_tau=1.0,
                per_device_train_batch_size=4)
trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=Dataset.from_list(ROWS),
                      processing_class=tok)
trainer.train()
assert trainer.accelerator.num_processes == 2, trainer.accelerator.num_processes
if trainer.accelerator.is_main_process:
    from safetensors.torch import save_file
    save_file({{n: p.detach().contiguous() for n, p in trainer.model.named_parameters()}}, out + "/ddp/params.safetensors")
trainer.accelerator.wait_for_everyone()

# 2. token analysis: every rank scores the analysed rows
model = AutoModelForCausalLM.from_pretrained(path)
scored = []
def collective(module, args):  # as under FSDP/ZeRO-3: an eval forward needs every rank (else all_reduce hangs)
    if not module.training:
        dist.all_reduce(torch.ones(1))
        scored.append(1)
model.register_forward_pre_hook(collective)
args = cpu_args(out + "/ta", num_train_epochs=2, per_device_train_batch_size=4, token_analysis=True,
                token_analysis_examples=[0], token_analysis_max_examples=4, per_device_eval_batch_size=2)
trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
trainer.train()
# one file per rank: two processes printing to one pipe can interleave their lines
rank = trainer.accelerator.process_index
open(f"{{out}}/ta/rank{{rank}}.json", "w").write(json.dumps({{"rank": rank, "eval_forwards": len(scored)}}))
# no rank destroys the process group while the other may still be in a collective or writing the report (a rank
# leaving early once aborted the other in a CI run: "terminate called without an active exception")
trainer.accelerator.wait_for_everyone()
trainer.accelerator.end_training()
"""


@pytest.fixture(scope="module")
def ddp_runs(embedded_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("talr_ddp")
    (out / "ddp").mkdir()
    script = out / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests")))
    launch_two_processes(script, embedded_path, out)
    return out


def test_two_processes_give_the_big_batch_update(embedded_path, ddp_runs, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ddp = load_file(ddp_runs / "ddp" / "params.safetensors")
    tok = AutoTokenizer.from_pretrained(embedded_path)
    init = {n: p.detach().clone() for n, p in AutoModelForCausalLM.from_pretrained(embedded_path).named_parameters()}
    single = train_once(AutoModelForCausalLM.from_pretrained(embedded_path), tok, tmp_path / "single",
                        per_device_train_batch_size=8)
    assert_same_update(single, {n: ddp[n] for n in single}, init)


def test_token_analysis_runs_on_every_rank(ddp_runs):
    """Under 2 processes every rank scores the analysed rows (a forward that needs all ranks completes: no hang)
    and only the main process writes the report."""
    out = ddp_runs / "ta"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    # before training and after each of 2 epochs, 4 rows in batches of 2: 3 x 2 forwards on each rank
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["eval_forwards"] == 6 for r in ranks), ranks
    report = json.loads((out / "token_analysis" / "token_analysis.json").read_text())
    assert [e["epoch"] for e in report["epochs"]] == [0.0, 1.0, 2.0] and report["epochs"][0]["n_tokens"] > 0


def test_l2_adds_lambda_times_squared_distance(tiny, tmp_path):
    model, tok = tiny
    data = Dataset.from_list(ROWS)
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, l2_lambda=0.3, per_device_train_batch_size=8),
                          train_dataset=data, processing_class=tok)
    batch = first_batch(trainer)
    trainer.model.train()
    base_loss = trainer.compute_loss(trainer.model, dict(batch)).item()  # θ = θ₀: no penalty
    torch.manual_seed(1)
    deltas = {}
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if n.endswith("mlp.down_proj.weight"):
                deltas[n] = 0.01 * torch.randn_like(p)
                p.add_(deltas[n])
    with_l2 = trainer.compute_loss(trainer.model, dict(batch)).item()
    trainer.args.l2_lambda = 0.0
    without = trainer.compute_loss(trainer.model, dict(batch)).item()
    assert base_loss != with_l2
    assert with_l2 - without == pytest.approx(0.3 * sum((d ** 2).sum().item() for d in deltas.values()), rel=1e-3)


def test_kl_k3_to_frozen_initial_copy(embedded_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, kl_beta=0.5, weighting="none",
                                                     per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(1.05)
    batch = first_batch(trainer)
    trainer.model.train()
    with_kl = trainer.compute_loss(trainer.model, dict(batch)).item()
    trainer.args.kl_beta = 0.0
    without = trainer.compute_loss(trainer.model, dict(batch)).item()
    policy_nll, mask = independent_token_nll(trainer.model, batch)
    ref_nll, _ = independent_token_nll(AutoModelForCausalLM.from_pretrained(embedded_path), batch)
    log_r = (policy_nll - ref_nll)[mask]  # log(π_ref/π_θ)
    k3 = (log_r.exp() - log_r - 1).sum() / mask.sum()
    assert k3.item() > 1e-4
    assert with_kl - without == pytest.approx(0.5 * k3.item(), rel=1e-3)


def test_kl_under_peft_uses_base_with_adapters_disabled(embedded_path, tmp_path):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, kl_beta=0.2, weighting="none",
                                                     per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok,
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert trainer.ref_model is None  # no second copy under PEFT
    batch = first_batch(trainer)
    trainer.model.train()
    at_init = trainer.compute_loss(trainer.model, dict(batch)).item()
    trainer.args.kl_beta = 0.0
    assert at_init == pytest.approx(trainer.compute_loss(trainer.model, dict(batch)).item(), rel=1e-6)  # KL = 0
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    trainer.args.kl_beta = 0.2
    with_kl = trainer.compute_loss(trainer.model, dict(batch)).item()
    trainer.args.kl_beta = 0.0
    without = trainer.compute_loss(trainer.model, dict(batch)).item()
    policy_nll, mask = independent_token_nll(trainer.model, batch)
    ref_nll, _ = independent_token_nll(AutoModelForCausalLM.from_pretrained(embedded_path), batch)
    log_r = (policy_nll - ref_nll)[mask]
    k3 = (log_r.exp() - log_r - 1).sum() / mask.sum()
    assert k3.item() > 1e-4
    assert with_kl - without == pytest.approx(0.2 * k3.item(), rel=1e-3)


def test_flow_weights_computed_once_saved_and_restored(embedded_path, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.talr.trainer import FLOW_WEIGHTS_NAME

    tok = AutoTokenizer.from_pretrained(embedded_path)
    model = AutoModelForCausalLM.from_pretrained(embedded_path)
    args = cpu_args(tmp_path, flow=True, weighting="none", max_steps=2, save_strategy="steps", save_steps=1,
                    shuffle_dataset=False)
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    # independent: per-row mean NLL under the initial model, τ = median, w = exp(−ℓ̄/τ)
    fresh = AutoModelForCausalLM.from_pretrained(embedded_path)
    means = []
    for row in trainer.train_dataset:
        batch = trainer.data_collator([{k: row[k] for k in ("input_ids", "labels")}])
        nll, mask = independent_token_nll(fresh, batch)
        means.append(nll[mask].mean().item())
    tau = statistics.median(means)
    expected = torch.exp(-torch.tensor(means) / tau)
    trainer.train()
    torch.testing.assert_close(trainer._flow_weights.double(), expected.double(), rtol=1e-4, atol=1e-6)
    saved = load_file(tmp_path / "checkpoint-1" / FLOW_WEIGHTS_NAME)["flow_weights"]
    torch.testing.assert_close(saved, trainer._flow_weights)

    # The weighted loss: one batch, by hand
    batch = first_batch(trainer)
    assert "flow_weight" in batch
    nll, mask = independent_token_nll(trainer.model, batch)
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch)).item()
    hand = ((nll * mask).sum(-1) * batch["flow_weight"]).sum() / mask.sum()
    assert loss == pytest.approx(hand.item(), rel=1e-4)

    # Resume: weights come from the checkpoint, not from the (now trained) model
    resumed = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                          args=cpu_args(tmp_path, flow=True, weighting="none", max_steps=2, save_strategy="steps",
                                        save_steps=1, shuffle_dataset=False),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    resumed.compute_flow_weights = lambda dataset: pytest.fail("recomputed instead of loading the checkpoint")
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    torch.testing.assert_close(resumed._flow_weights, saved)


def test_wise_ft_checkpoint_interpolates(embedded_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                          args=cpu_args(tmp_path, wise_ft_alpha=0.25, max_steps=3, learning_rate=1e-3),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    trainer.train()
    init = AutoModelForCausalLM.from_pretrained(embedded_path).state_dict()
    final = trainer.model.state_dict()
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "wise-ft").state_dict()
    assert json.loads((tmp_path / "wise-ft" / "wise_ft.json").read_text())["alpha"] == 0.25
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(init[name], final[name])
    for n in init:
        torch.testing.assert_close(saved[n], 0.75 * init[n] + 0.25 * final[n], rtol=1e-5, atol=1e-6, msg=n)
    # the trained model itself is untouched
    assert torch.equal(trainer.model.state_dict()[name], final[name])
    assert list((tmp_path / "wise-ft").glob("*.safetensors"))


def test_wise_ft_lora_is_exact_on_merged_weights(embedded_path, tmp_path):
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                          args=cpu_args(tmp_path, wise_ft_alpha=0.5, max_steps=3, learning_rate=5e-2),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok,
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainer.train()
    base = AutoModelForCausalLM.from_pretrained(embedded_path)
    w0 = base.state_dict()["model.layers.0.self_attn.q_proj.weight"].clone()
    ft = trainer.model.merge_and_unload().state_dict()["model.layers.0.self_attn.q_proj.weight"]
    wise = PeftModel.from_pretrained(base, tmp_path / "wise-ft").merge_and_unload()
    got = wise.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert (ft - w0).abs().max() > 1e-4
    torch.testing.assert_close(got, 0.5 * w0 + 0.5 * ft, rtol=1e-5, atol=1e-6)


def test_resume_from_checkpoint_matches_uninterrupted(embedded_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_path)

    def make(out):
        return TALRTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                           args=cpu_args(out, max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-3,
                                         per_device_train_batch_size=2),
                           train_dataset=Dataset.from_list(ROWS), processing_class=tok)

    straight = make(tmp_path / "a")
    straight.train()
    resumed = make(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    for (n, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_lora_packing_conversational_and_evaluate(tiny, tmp_path):
    from peft import LoraConfig

    model, tok = tiny
    chats = [{"messages": [{"role": "user", "content": r["prompt"]},
                           {"role": "assistant", "content": r["completion"].strip()}]} for r in ROWS]
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, max_steps=2, packing=True, max_length=64,
                                                     eval_strategy="no", assistant_only_loss=True),
                          train_dataset=Dataset.from_list(chats), eval_dataset=Dataset.from_list(chats),
                          processing_class=tok,
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainer.train()
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    assert "eval_talr/tau" in metrics and "eval_mean_token_accuracy" in metrics
    logged = [h for h in trainer.state.log_history if "talr/tau" in h]
    assert logged and all(0 < h["talr/mean_weight"] <= 1 for h in logged)


def test_empty_completion_mask_gives_zero_loss_and_one_warning(tiny, tmp_path, caplog):
    model, tok = tiny
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    batch = first_batch(trainer)
    batch["labels"] = torch.full_like(batch["labels"], -100)
    trainer.model.train()
    with caplog.at_level(logging.WARNING, logger="adaptguard.talr.trainer"):
        for _ in range(2):
            loss = trainer.compute_loss(trainer.model, dict(batch))
            assert loss.item() == 0.0
            loss.backward()
    assert sum("no supervised" in r.message for r in caplog.records) == 1
    assert all(torch.isfinite(p.grad).all() for p in trainer.model.parameters() if p.grad is not None)


def test_nan_loss_names_the_step(tiny, tmp_path):
    model, tok = tiny
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, per_device_train_batch_size=8),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    with torch.no_grad():
        trainer.model.get_output_embeddings().weight.fill_(float("nan"))
    trainer.state.global_step = 7
    trainer.model.train()
    with pytest.raises(FloatingPointError, match="global step 7"):
        trainer.compute_loss(trainer.model, dict(first_batch(trainer)))


@pytest.mark.parametrize("field, value, message", [
    ("talr_weight_floor", 0.0, "weight_floor"),
    ("talr_weight_floor", 1.5, "weight_floor"),
    ("talr_tau", -1.0, "talr_tau"),
    ("wise_ft_alpha", 2.0, "wise_ft_alpha"),
    ("l2_lambda", -1.0, "l2_lambda"),
])
def test_bad_config_values(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        TALRConfig(output_dir=str(tmp_path), bf16=False, **{field: value})


def test_plain_sft_config_is_accepted(tiny, tmp_path):
    from trl import SFTConfig

    model, tok = tiny
    args = SFTConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to="none", max_steps=1)
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    assert isinstance(trainer.args, TALRConfig) and trainer.args.weighting == "talr" and trainer.args.max_steps == 1


def test_sft_config_loss_type_dft_is_trls_dft(embedded_path, tmp_path):
    """`SFTConfig(loss_type="dft")` keeps its meaning with TALRTrainer (issue 27): the `dft` weighting, whose loss
    and gradient on a batch equal SFTTrainer's DFT on the same model and batch, and an independent formula."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from adaptguard.trl_adapter import no_activation_checkpointing

    tok = AutoTokenizer.from_pretrained(embedded_path)
    losses, grads = {}, {}
    for name, cls in (("ours", TALRTrainer), ("trl", SFTTrainer)):
        model = AutoModelForCausalLM.from_pretrained(embedded_path)
        args = SFTConfig(output_dir=str(tmp_path / name), bf16=False, use_cpu=True, report_to="none", seed=0,
                         per_device_train_batch_size=8, loss_type="dft", **no_activation_checkpointing())
        trainer = cls(model=model, args=args, train_dataset=Dataset.from_list(ROWS), processing_class=tok)
        batch = first_batch(trainer)
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        losses[name], grads[name] = loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}
        if name == "ours":
            assert trainer.args.weighting == "dft" and trainer.args.loss_type == "nll"
            nll, mask = independent_token_nll(model, batch)
            assert loss.item() == pytest.approx(((-nll).exp() * nll)[mask].sum().item() / mask.sum().item(), rel=1e-4)
    assert losses["ours"] == pytest.approx(losses["trl"], rel=1e-5)
    for n in grads["ours"]:
        torch.testing.assert_close(grads["ours"][n], grads["trl"][n], rtol=1e-4, atol=1e-7, msg=n)
    with pytest.raises(ValueError, match="loss_type='dft' selects weighting='dft'.*weighting='none'"):
        TALRConfig(output_dir=str(tmp_path), bf16=False, loss_type="dft", weighting="none")


def test_streaming_dataset_trains(tiny, tmp_path):
    """A `datasets.IterableDataset` (streaming) trains as with SFTTrainer: no length is asked of it (issue 27)."""
    model, tok = tiny
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, max_steps=2),
                          train_dataset=Dataset.from_list(ROWS).to_iterable_dataset(), processing_class=tok)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_token_analysis_records_curriculum(tiny, tmp_path):
    model, tok = tiny
    args = cpu_args(tmp_path, token_analysis=True, token_analysis_examples=[0, 2], num_train_epochs=3,
                    learning_rate=3e-3, per_device_train_batch_size=4)
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(ROWS * 4), processing_class=tok)
    trainer.train()
    report = json.loads((tmp_path / "token_analysis" / "token_analysis.json").read_text())
    epochs = report["epochs"]
    assert [e["epoch"] for e in epochs] == [0.0, 1.0, 2.0, 3.0]
    fracs = [e["frac_p_gt_0.2"] for e in epochs]
    assert fracs[-1] > fracs[0]  # the curriculum signal rises with training
    assert sum(epochs[0]["histogram"]["counts"]) == epochs[0]["n_tokens"]
    assert (tmp_path / "token_analysis" / "heatmap_epoch3.png").stat().st_size > 1000
    logged = [h["token_analysis/frac_p_gt_0.2"] for h in trainer.state.log_history
              if "token_analysis/frac_p_gt_0.2" in h]
    assert logged == fracs

    # the probabilities drawn: p(token t | tokens < t) of the trained model on the completion, NaN on the prompt
    from adaptguard.talr.callbacks import TokenAnalysisCallback

    analysed = TokenAnalysisCallback(trainer).token_probabilities()
    assert len(analysed) == len(ROWS) * 4
    for i in (0, 2):
        row = trainer.train_dataset[i]
        ids, probs = analysed[i]
        assert ids == row["input_ids"]
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.tensor([ids])).logits[0]
        expected = torch.full((len(ids),), float("nan"))
        for t in range(1, len(ids)):
            if row["labels"][t] != -100:  # a supervised token
                expected[t] = logits[t - 1].softmax(-1)[ids[t]]
        assert torch.equal(probs.isnan(), expected.isnan()) and 0 < (~probs.isnan()).sum() < len(ids)
        torch.testing.assert_close(probs[~probs.isnan()], expected[~expected.isnan()], atol=1e-5, rtol=1e-4)


def test_compute_loss_func_route_agrees_with_trainer(embedded_path, tmp_path):
    """SPEC: TALR is also usable as `SFTTrainer(compute_loss_func=...)`; both routes give one loss."""
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from adaptguard.talr.losses import talr_loss_func

    tok = AutoTokenizer.from_pretrained(embedded_path)
    talr = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                       args=cpu_args(tmp_path / "a", per_device_train_batch_size=8),
                       train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        sft = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(embedded_path),
                         args=SFTConfig(output_dir=str(tmp_path / "b"), bf16=False, use_cpu=True, report_to="none",
                                        per_device_train_batch_size=8),
                         train_dataset=Dataset.from_list(ROWS), processing_class=tok,
                         compute_loss_func=talr_loss_func())
    batch = first_batch(talr)
    talr.model.train()
    sft.model.train()
    n = (batch["labels"][:, 1:] != -100).sum()
    a = talr.compute_loss(talr.model, dict(batch), num_items_in_batch=n)
    b = sft.compute_loss(sft.model, dict(batch), num_items_in_batch=n)
    assert a.item() == pytest.approx(b.item(), rel=1e-4)


def test_readme_quickstart_runs_as_written_on_this_machine(embedded_path, tmp_path):
    """README's quickstart sets neither bf16 nor use_cpu: on a machine without bf16 (this CPU) TRL's default bf16=True
    made transformers refuse to start; the config now decides an unset bf16 by the hardware."""
    from transformers.utils import is_torch_bf16_gpu_available

    args = TALRConfig(output_dir=str(tmp_path / "quick"), learning_rate=5e-6, max_steps=1, report_to="none")
    assert args.bf16 == is_torch_bf16_gpu_available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TALRTrainer(model=str(embedded_path), args=args, train_dataset=Dataset.from_list(ROWS)).train()
    # nothing pinned where no accelerator is (torch warned on every run)
    assert args.dataloader_pin_memory == torch.accelerator.is_available()
    assert not [w for w in caught if "pin_memory" in str(w.message)]
    assert TALRConfig(output_dir=str(tmp_path / "x"), bf16=False).bf16 is False  # an explicit choice is kept
