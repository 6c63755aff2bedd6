"""`adaptguard update` from the user's own models (issue 54): v1 given as a PEFT adapter trained outside update (plain
TRL `SFTTrainer`) or as a full model, v2's own adapter given, used as they are; the plan printed first and
`--dry-run`; bad input (an adapter of another base, a full model where an adapter is expected, a missing path) one
line naming the field, nothing written. On the embedded toy and, marked `real`, on SmolLM2."""

import json
from pathlib import Path

import pytest
from in_process import run_cli  # the CLI's main in this process; its output as a process shows it

CONTROL_ONLY = [{"recipe": "control", "learning_rate": [2e-3], "epochs": [1]}]


def sft_adapter(base: str, rows: list[dict], out: Path, steps: int = 6) -> Path:
    """A LoRA adapter trained the way a user trains one: TRL's SFTTrainer, PEFT's LoraConfig, save_pretrained."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from adaptguard.trl_adapter import no_activation_checkpointing

    trainer = SFTTrainer(model=base, train_dataset=Dataset.from_list(rows),
                         args=SFTConfig(output_dir=str(out / "run"), max_steps=steps, learning_rate=3e-3,
                                        per_device_train_batch_size=8, bf16=False, use_cpu=True, report_to="none",
                                        save_strategy="no", max_length=64, **no_activation_checkpointing()),
                         peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainer.train()
    trainer.model.save_pretrained(out / "adapter")
    return out / "adapter"


def direct_answers(base: str, adapter: Path | None, rows: list[dict], max_new_tokens: int) -> list[str]:
    """v1's answers as a user gets them: the base with the adapter loaded by PEFT (or the full model), greedy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.utils.generation import generate_answers

    model = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return generate_answers(model.eval(), AutoTokenizer.from_pretrained(base), rows, max_new_tokens)


def stored(out: Path, split: str, model: str) -> dict:
    for done in (out / "steps").glob(f"score_{split}_*/done.json"):
        if json.loads(done.read_text())["model"] == model:
            return json.loads((done.parent / "scores.json").read_text())
    raise AssertionError(f"no stored {split} scores of {model}")


@pytest.fixture(scope="module")
def toy(tmp_path_factory, embedded_path):
    from adaptguard.update import tiny_preset

    root = tmp_path_factory.mktemp("own")
    cfg = tiny_preset(str(root / "unused"))
    train, test = cfg.train, cfg.test
    adapter = sft_adapter(cfg.old_base, train, root / "v1")
    return {"root": root, "old_base": cfg.old_base, "new_base": cfg.new_base, "train": train, "dev": test[:24],
            "test": test[24:48], "adapter": adapter}


def config(toy, out: Path, **kw):
    from adaptguard.update import UpdateConfig

    fields = dict(old_base=toy["old_base"], new_base=toy["new_base"], train=toy["train"][:32], dev=toy["dev"],
                  test=toy["test"], output_dir=str(out), candidates=CONTROL_ONLY, task_epochs=1, batch_size=16,
                  max_length=64, max_new_tokens=8, use_cpu=True)
    return UpdateConfig(**{**fields, **kw})


def test_v1_adapter_from_sftttrainer_is_used_unchanged(toy, tmp_path, capsys):
    from adaptguard.update import run_update

    out = tmp_path / "out"
    report = run_update(config(toy, out, old_model=str(toy["adapter"])))
    assert not (out / "v1_task_adapter").exists()  # v1 was not retrained
    want = direct_answers(toy["old_base"], toy["adapter"], toy["test"], 8)
    assert stored(out, "test", "v1")["pred"] == want
    printed = capsys.readouterr().out
    assert "update: the plan" in printed and f"your adapter {toy['adapter']} (used as is)" in printed
    assert printed.index("update: the plan") < printed.index("update: scoring")  # the plan comes first
    assert report["verdict"].startswith("ship the control")


def test_v1_as_a_full_model_and_v2_adapter_given(toy, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.update import run_update

    full = tmp_path / "v1-full"
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(toy["old_base"]), toy["adapter"])
    merged.merge_and_unload().save_pretrained(full)
    AutoTokenizer.from_pretrained(toy["old_base"]).save_pretrained(full)
    v2 = sft_adapter(toy["new_base"], toy["train"], tmp_path / "v2", steps=4)
    out = tmp_path / "out"
    run_update(config(toy, out, old_model=str(full), new_adapter=str(v2)))
    assert not (out / "v1_task_adapter").exists() and not (out / "v2_task_adapter").exists()
    assert stored(out, "test", "v1")["pred"] == direct_answers(str(full), None, toy["test"], 8)
    # v2 is the user's adapter on the new base, unchanged
    assert stored(out, "test", "v2")["pred"] == direct_answers(toy["new_base"], v2, toy["test"], 8)


@pytest.mark.parametrize("case, message", [
    ("other_base", "old_model: the adapter {adapter} was trained on"),
    ("full_as_adapter", "new_adapter: {full} is a full model"),
    ("missing", "old_model: {missing}: no such file or directory"),
])
def test_bad_user_models_are_one_line_and_write_nothing(toy, tmp_path, case, message):
    out = tmp_path / "out"
    fields = {"old_base": toy["old_base"], "new_base": toy["new_base"], "train": toy["train"][:8],
              "dev": toy["dev"][:4], "test": toy["test"][:4], "output_dir": str(out), "candidates": CONTROL_ONLY}
    names = {"adapter": toy["adapter"], "full": toy["new_base"], "missing": tmp_path / "nope"}
    if case == "other_base":  # v1's adapter, but old_base names the new model
        fields.update(old_base=toy["new_base"], old_model=str(toy["adapter"]))
    elif case == "full_as_adapter":
        fields["new_adapter"] = toy["new_base"]
    else:
        fields["old_model"] = str(tmp_path / "nope")
    cfg = tmp_path / "update.json"
    cfg.write_text(json.dumps(fields))
    proc = run_cli("update", cfg)
    assert proc.returncode == 2 and message.format(**names) in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_dry_run_prints_the_plan_and_writes_nothing(toy, tmp_path, capsys):
    out = tmp_path / "out"
    fields = {"old_base": toy["old_base"], "new_base": toy["new_base"], "train": toy["train"][:32],
              "dev": toy["dev"], "test": toy["test"], "output_dir": str(out), "old_model": str(toy["adapter"]),
              "candidates": [{"recipe": "control", "learning_rate": [1e-3, 2e-3], "epochs": [1, 2]},
                             {"recipe": "kd", "learning_rate": [1e-3, 2e-3], "epochs": [1, 2]}],
              "batch_size": 16, "use_cpu": True, "max_length": 64}
    cfg = tmp_path / "update.json"
    cfg.write_text(json.dumps(fields))
    from adaptguard.cli.main import main

    capsys.readouterr()
    # the CLI's entry point in this process (its flags parsed as on the command line), not a second start-up
    assert main(["update", str(cfg), "--dry-run", "--seeds", "3", "--dev-seeds", "2"]) == 0
    stdout = capsys.readouterr().out
    # 4 runs (2 recipes × 2 lr; the 1-epoch adapter is the 2-epoch run's checkpoint) × 2 dev seeds, then the pick
    # and the control on the one test seed that is not a dev seed; 8 settings × 2 seeds + v1, v2 scored on dev
    assert "trainings: 10 (8 settings of 4 runs × 2 dev seed(s)" in stdout
    assert "4 steps each" in stdout  # 32 rows / 16 per batch × 2 epochs
    assert "scorings: 18 on dev" in stdout and "time: about" in stdout
    assert not out.exists()


@pytest.mark.real
def test_smollm2_v1_adapter_trained_with_sfttrainer_is_used_unchanged(tmp_path):
    from conftest import built_smollm2_or_skip

    from adaptguard.update import UpdateConfig, run_update

    base = str(built_smollm2_or_skip())
    pairs = (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("wet", "dry"), ("old", "young"),
             ("happy", "sad"), ("light", "dark"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
             ("rich", "poor"))
    rows = [{"prompt": f"Q: What is the opposite of {a}?\nA:", "completion": f" {b}"} for a, b in pairs]
    adapter = sft_adapter(base, rows[:6], tmp_path / "v1", steps=3)
    out = tmp_path / "out"
    cfg = UpdateConfig(old_base="built:smollm2", new_base="built:smollm2", old_model=str(adapter),
                       train=rows[:6], dev=rows[6:9], test=rows[9:], output_dir=str(out), candidates=[
                           {"recipe": "control", "learning_rate": [1e-3], "epochs": [1]}], batch_size=6,
                       max_length=32, max_new_tokens=4, task_epochs=1, use_cpu=True)
    run_update(cfg)
    assert not (out / "v1_task_adapter").exists()
    assert stored(out, "test", "v1")["pred"] == direct_answers(base, adapter, rows[9:], 4)
