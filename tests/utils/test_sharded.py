"""TALR and MUSCLE under FSDP2 and DeepSpeed, launched as users launch them: `accelerate launch --config_file
examples/accelerate_configs/<fsdp|deepspeed_zero2|deepspeed_zero3>.yaml`, two CPU processes on gloo. Each run
must give the update of one process on the whole batch, as the DDP tests check for data parallelism.

accelerate turns FSDP on only for an accelerator's process group (`AcceleratorState` lists MULTI_GPU, MULTI_XPU, …
but not MULTI_CPU), although FSDP2 itself (`fully_shard`, DTensors, gloo's all-gather and reduce-scatter) runs on
the CPU. The launched script therefore marks its gloo process group as a GPU one before the trainer is built
(`on_cpu`); nothing else differs from a GPU run. DeepSpeed gets a gloo group through `ddp_backend="gloo"`; its
test is skipped where `deepspeed` is not installed (it is not a dependency; see docs/talr.md)."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, cpu_args, launch_two_processes
from datasets import Dataset
from in_process import run_cli
from trainer_rows import ROWS, compat_args

FSDP_CONFIG = ROOT / "examples" / "accelerate_configs" / "fsdp.yaml"

COMMON = """
import json, sys
from pathlib import Path
import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType
from datasets import Dataset
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from transformers import AutoTokenizer
sys.path[:0] = [{tests!r}, {here!r}]  # the helpers at tests/, and this test file
from test_sharded import ROWS, build_talr, build_muscle

def on_cpu(args):
    if DEEPSPEED:  # accelerate hands DeepSpeed a gloo group when asked for one (and use_cpu is off)
        args.use_cpu, args.ddp_backend = False, "gloo"
        return args
    args.device  # sets up the (gloo) process group
    PartialState().distributed_type = DistributedType.MULTI_GPU  # so that accelerate applies the FSDP plugin
    return args

def finish(trainer, out, name, frozen):
    acc = trainer.accelerator
    expected = DistributedType.DEEPSPEED if DEEPSPEED else DistributedType.FSDP
    assert acc.distributed_type == expected and acc.num_processes == 2, acc.distributed_type
    is_shard = (lambda p: hasattr(p, "ds_id")) if DEEPSPEED else (lambda p: isinstance(p, DTensor))  # ZeRO-3 / FSDP2
    sharded = {{"model": is_shard(next(trainer.model.parameters())),
               "frozen": None if frozen is None else all(is_shard(p) for p in frozen.parameters())}}
    state = acc.get_state_dict(trainer.model_wrapped if DEEPSPEED else trainer.model)  # collective: every rank
    if acc.is_main_process:
        save_file({{n: p.detach().clone().contiguous() for n, p in state.items()}}, f"{{out}}/{{name}}.safetensors")
        Path(f"{{out}}/{{name}}.json").write_text(json.dumps({{"log": trainer.state.log_history, "sharded": sharded}}))
"""

TALR_SCRIPT = COMMON + """
path, out, variants = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
DEEPSPEED = len(sys.argv) > 4
for name, options in variants.items():
    # under ZeRO-3 the reference is loaded partitioned from its path, not copied from the (partitioned) model
    ref = path if DEEPSPEED and options.get("kl_beta") and not options.get("lora") else None
    trainer = build_talr(path, f"{{out}}/{{name}}", options, batch_size=4, prepare_args=on_cpu, ref_model=ref)
    trainer.train()
    finish(trainer, out, name, trainer.ref_model)
trainer.accelerator.wait_for_everyone()  # no rank destroys the group while the other still uses it
trainer.accelerator.end_training()
"""

MUSCLE_SCRIPT = COMMON + """
path, update, out, variants = sys.argv[1], Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
DEEPSPEED = len(sys.argv) > 5
for name, options in variants.items():
    trainer = build_muscle(path, update, f"{{out}}/{{name}}", options, batch_size=4, prepare_args=on_cpu)
    trainer.train()
    finish(trainer, out, name, trainer.old_model)
trainer.accelerator.wait_for_everyone()  # no rank destroys the group while the other still uses it
trainer.accelerator.end_training()
"""

KL_REFUSED_SCRIPT = COMMON + """
DEEPSPEED = True
try:
    build_talr(sys.argv[1], sys.argv[2], {{"kl_beta": 0.5}}, batch_size=4, prepare_args=on_cpu)
except ValueError as err:
    assert "ref_model='<path or Hub id" in str(err), err
else:
    raise AssertionError("kl_beta under ZeRO-3 without a reference path was accepted")
PartialState().destroy_process_group()  # a gloo group left at exit aborts the process ("terminate called ...")
"""

# Every TALRTrainer method of the issue: TALR (full), L2-to-init, KL to a frozen copy and to the PEFT base, FLOW,
# Wise-FT and LoRA. Two SGD steps: at θ₀ the L2 and KL gradients vanish, so the second step is where they act
# (λ = 1 and lr 0.5 make the L2 step undo the first step's move; wrongly scaled, it would not).
TALR_VARIANTS = {
    "talr": {}, "l2": {"l2_lambda": 1.0}, "kl": {"kl_beta": 0.5}, "kl_lora": {"kl_beta": 0.5, "lora": True},
    "flow": {"flow": True}, "wise_ft": {"wise_ft_alpha": 0.5}, "lora": {"lora": True},
}


def build_talr(path, out, options, batch_size, prepare_args=lambda args: args, **kwargs):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import TALRTrainer

    options = dict(options)
    # init_lora_weights=False: B ≠ 0, so the KL to the adapter-free base is not 0 from the start
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False) \
        if options.pop("lora", False) else None
    torch.manual_seed(0)
    args = prepare_args(cpu_args(out, max_steps=2, optim="sgd", learning_rate=0.5, lr_scheduler_type="constant",
                                 talr_tau=1.0, per_device_train_batch_size=batch_size, **options))
    return TALRTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=Dataset.from_list(ROWS),
                       processing_class=AutoTokenizer.from_pretrained(path), peft_config=peft, **kwargs)


def build_muscle(path, update, out, options, batch_size, prepare_args=lambda args: args):
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    options = dict(options)
    if "old_logits_cache" not in options:
        options["old_model"] = str(update / "v1_task")
    args = prepare_args(compat_args(out, update / "v2_adapter", max_steps=1, optim="sgd", learning_rate=1.0,
                                    lr_scheduler_type="constant", per_device_train_batch_size=batch_size, **options))
    return MUSCLETrainer(model=str(path), args=args, train_dataset=Dataset.from_list(ROWS),
                         processing_class=AutoTokenizer.from_pretrained(path))


def launch(tmp_path, script, *argv, config=FSDP_CONFIG):
    file = tmp_path / "launched.py"
    file.write_text(script.format(tests=str(ROOT / "tests"), here=str(Path(__file__).resolve().parent)))
    launch_two_processes(file, *argv, config=config)


def logged(history, key):
    return [h[key] for h in history if key in h]


def assert_talr_runs_equal_one_process(embedded_path, tmp_path, out, variants, partitioned: bool):
    """Each launched run (files in `out`) against one process on the whole batch."""
    from safetensors.torch import load_file

    for name, options in variants.items():
        trainer = build_talr(embedded_path, tmp_path / "single" / name, options, batch_size=8)
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        sharded = load_file(out / f"{name}.safetensors")
        report = json.loads((out / f"{name}.json").read_text())
        assert report["sharded"]["model"] is partitioned, name  # the student really was sharded (or not, ZeRO-2)
        moved = 0.0
        for n, p in trainer.model.named_parameters():
            if n in start:
                moved = max(moved, (p - start[n]).abs().max().item())
                # atol: 2 ulp of a weight near 1 (norm weights); the runs differ only in the order of the sums
                torch.testing.assert_close(sharded[n] - start[n], p.detach() - start[n], rtol=1e-3, atol=2.5e-7,
                                           msg=lambda m, name=name, n=n: f"{name}: {n}: {m}")
        assert moved > 1e-4, name  # FLOW's small sequence weights move least (7e-4)
        history = trainer.state.log_history
        assert logged(report["log"], "loss") == pytest.approx(logged(history, "loss"), rel=1e-4), name
        if "kl_beta" in options:
            assert logged(report["log"], "talr/kl") == pytest.approx(logged(history, "talr/kl"), rel=1e-3, abs=1e-9)
            # a frozen copy is sharded like the student; under PEFT the reference is the base (no copy)
            assert report["sharded"]["frozen"] is (None if options.get("lora") else partitioned), name
        if "l2_lambda" in options:
            l2 = logged(report["log"], "talr/l2")
            assert l2[0] == 0.0 and l2[1] > 0 and l2 == pytest.approx(logged(history, "talr/l2"), rel=1e-4)


def test_talr_methods_under_fsdp2_give_the_big_batch_update(embedded_path, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "fsdp"
    launch(tmp_path, TALR_SCRIPT, embedded_path, out, json.dumps(TALR_VARIANTS))
    init = dict(AutoModelForCausalLM.from_pretrained(embedded_path).named_parameters())
    assert_talr_runs_equal_one_process(embedded_path, tmp_path, out, TALR_VARIANTS, partitioned=True)
    # Wise-FT from the sharded model: a whole checkpoint, loadable, equal to the one-process checkpoint
    wise = AutoModelForCausalLM.from_pretrained(out / "wise_ft" / "wise-ft")
    single = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "single" / "wise_ft" / "wise-ft").named_parameters())
    for n, p in wise.named_parameters():
        torch.testing.assert_close(p, single[n], rtol=1e-4, atol=1e-7, msg=n)
    trained = load_file(out / "wise_ft.safetensors")
    n = "model.layers.0.mlp.down_proj.weight"
    torch.testing.assert_close(dict(wise.named_parameters())[n], 0.5 * init[n] + 0.5 * trained[n], rtol=1e-5, atol=1e-7)


def test_muscle_under_fsdp2_gives_the_big_batch_update(embedded_path, update, tmp_path):
    from safetensors.torch import load_file

    cache = tmp_path / "cache"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = run_cli("cache-logits", "--old-model", update / "v1_task", "--tokenizer", embedded_path, "--dataset", rows,
                   "--out", cache, "--top-k", "16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    variants = {"tiled": {}, "logits": {"loss_implementation": "logits"}, "cached": {"old_logits_cache": str(cache)}}
    out = tmp_path / "fsdp"
    launch(tmp_path, MUSCLE_SCRIPT, embedded_path, update, out, json.dumps(variants))
    for name, options in variants.items():
        trainer = build_muscle(embedded_path, update, tmp_path / "single" / name, options, batch_size=8)
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".default." in n}
        trainer.train()
        report = json.loads((out / f"{name}.json").read_text())
        assert report["sharded"]["model"] and report["sharded"]["frozen"] is (None if name == "cached" else True)
        sharded = load_file(out / f"{name}.safetensors")
        moved = 0.0
        for n, p in trainer.model.named_parameters():
            if ".default." in n:
                moved = max(moved, (p - start[n]).abs().max().item())
                torch.testing.assert_close(sharded[n], p.detach(), rtol=1e-4, atol=1e-7,
                                           msg=lambda m, name=name, n=n: f"{name}: {n}: {m}")
        assert moved > 1e-3, name
        history = trainer.state.log_history
        assert logged(report["log"], "compat/kl") == pytest.approx(logged(history, "compat/kl"), rel=1e-4), name


@pytest.mark.parametrize("stage", [2, 3])
def test_talr_and_muscle_under_deepspeed_give_the_big_batch_update(embedded_path, update, tmp_path, stage):
    """DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU processes (gloo), with the shipped configs. ZeRO-2 partitions optimizer
    states and gradients only, so every method runs; ZeRO-3 partitions the parameters too: TALR, KL (the reference
    loaded partitioned from its path, or the PEFT base) and MUSCLE's full-logits path run, L2, Wise-FT and the tiled
    MUSCLE loss are refused (test_partitionings_the_baselines_cannot_read_are_refused). DeepSpeed is an optional
    dependency (an sdist): skipped where it is not installed."""
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file

    config = ROOT / "examples" / "accelerate_configs" / f"deepspeed_zero{stage}.yaml"
    talr = TALR_VARIANTS if stage == 2 else {k: v for k, v in TALR_VARIANTS.items() if k in ("talr", "kl", "kl_lora")}
    out = tmp_path / "ds"
    launch(tmp_path, TALR_SCRIPT, embedded_path, out, json.dumps(talr), "deepspeed", config=config)
    assert_talr_runs_equal_one_process(embedded_path, tmp_path, out, talr, partitioned=stage == 3)

    if stage == 3:  # the partitioned model cannot be copied into a reference: a clear error, before training
        launch(tmp_path, KL_REFUSED_SCRIPT, embedded_path, tmp_path / "refused", config=config)
    muscle = {"logits": {"loss_implementation": "logits"}} if stage == 3 else {"tiled": {}}
    launch(tmp_path, MUSCLE_SCRIPT, embedded_path, update, out, json.dumps(muscle), "deepspeed", config=config)
    for name, options in muscle.items():
        trainer = build_muscle(embedded_path, update, tmp_path / "single" / name, options, batch_size=8)
        trainer.train()
        sharded = load_file(out / f"{name}.safetensors")
        for n, p in trainer.model.named_parameters():
            if ".default." in n:
                torch.testing.assert_close(sharded[n], p.detach(), rtol=1e-4, atol=1e-7, msg=n)


def test_l2_refuses_initial_weights_it_does_not_have(tmp_path):
    """Under FSDP's cpu_ram_efficient_loading the ranks but the first load the model on the meta device: L2 then has
    no θ₀ to shard, and says which setting to change rather than training against garbage."""
    from adaptguard.utils.sharding import shard_like

    with pytest.raises(ValueError, match="fsdp_cpu_ram_efficient_loading: false"):
        shard_like(torch.empty(4, 2, device="meta"), torch.zeros(4, 2))


def test_wise_ft_checkpoint_keeps_tied_weights_tied(embedded_path, tmp_path):
    """The Wise-FT checkpoint is built from the whole state dict (as under FSDP): an LM head tied to the embeddings
    must come out as the interpolated embeddings, not the fine-tuned ones."""
    from transformers import AutoModelForCausalLM

    trainer = build_talr(embedded_path, tmp_path / "run", {"wise_ft_alpha": 0.25}, batch_size=8)
    assert trainer.model.config.tie_word_embeddings
    trainer.train()
    wise = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "wise-ft")
    init = AutoModelForCausalLM.from_pretrained(embedded_path).get_input_embeddings().weight
    tuned = trainer.model.get_input_embeddings().weight.detach()
    expected = 0.75 * init + 0.25 * tuned
    assert (tuned - init).abs().max() > 1e-4
    torch.testing.assert_close(wise.get_input_embeddings().weight, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(wise.get_output_embeddings().weight, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("deepspeed_stage, fsdp_version, refused", [
    (3, None, "deepspeed-zero3"), (2, None, None), (None, 1, "fsdp1"), (None, 2, None), (None, None, None)])
def test_partitionings_the_baselines_cannot_read_are_refused(deepspeed_stage, fsdp_version, refused):
    """ZeRO-3 and FSDP1 partition parameters into flat shards that L2, Wise-FT and the tiled MUSCLE loss cannot read
    (DeepSpeed does not run here, so the check is tested on the accelerator state it reads)."""
    from types import SimpleNamespace

    from adaptguard.trl_adapter import partitioning, refuse_partitioning

    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=deepspeed_stage),
                            fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version))
    trainer = SimpleNamespace(is_deepspeed_enabled=deepspeed_stage is not None, is_fsdp_enabled=fsdp_version is not None,
                              accelerator=SimpleNamespace(state=state))
    assert partitioning(trainer) == (refused if refused else (f"fsdp{fsdp_version}" if fsdp_version else None))
    refuse_partitioning(trainer, [])  # nothing in use: nothing to refuse
    if refused:
        with pytest.raises(ValueError, match=rf"l2_lambda, wise_ft_alpha: not supported with {refused}.*FSDP2"):
            refuse_partitioning(trainer, ["l2_lambda", "wise_ft_alpha"])
    else:
        refuse_partitioning(trainer, ["l2_lambda", "wise_ft_alpha"])
