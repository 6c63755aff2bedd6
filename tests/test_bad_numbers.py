"""Non-finite and mistyped numbers are bad input (issue 13): every config and CLI number refuses NaN/inf naming the
field, and `adaptguard update` validates its whole config before any training."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("field, value", [("l2_lambda", float("nan")), ("kl_beta", float("nan")),
                                          ("kl_beta", float("inf")), ("talr_tau", float("inf")),
                                          ("flow_tau", float("nan")), ("wise_ft_alpha", float("nan")),
                                          ("learning_rate", float("nan"))])
def test_talr_config_refuses_non_finite(tmp_path, field, value):
    from adaptguard import TALRConfig

    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        TALRConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{field: value})


@pytest.mark.parametrize("field", ["ce_weight", "temperature", "learning_rate"])
def test_muscle_config_refuses_non_finite(tmp_path, field):
    from adaptguard import MUSCLEConfig

    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        MUSCLEConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{field: float("nan")})


@pytest.mark.parametrize("args, message", [
    (["drift", "corrupt", "d.jsonl", "--r", "nan", "--out", "o.jsonl"], "--r: expected a finite number, got 'nan'"),
    (["drift", "bound", "--delta", "inf"], "--delta: expected a finite number, got 'inf'"),
    (["select", "--target", "t.jsonl", "--candidates", "c.jsonl", "--p", "x"], "--p: expected a number, got 'x'"),
])
def test_cli_numbers_refuse_nan_inf_and_text(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("field, value, message", [
    ("task_epochs", "three", "task_epochs must be float, got 'three'"),
    ("mask", "nope", "Unknown MUSCLE mask 'nope'; known masks:"),
    ("ce_weight", -1, "ce_weight must be ≥ 0"),
    ("batch_size", 0, "batch_size must be ≥ 1"),
])
def test_update_validates_the_config_before_any_work(tmp_path, field, value, message):
    config = tmp_path / "update.json"
    rows = [{"prompt": "q", "completion": " a"}]
    config.write_text(json.dumps({"old_base": str(tmp_path / "nope-v1"), "new_base": str(tmp_path / "nope-v2"),
                                  "train": rows, "test": rows, field: value}))
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "update", str(config), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_empty_completions_are_refused_before_training(tmp_path, embedded_path):
    """A training set whose completions are all empty would fit only EOS and report accuracy 0: refused up front,
    naming the dataset and the column, for TALRTrainer, MUSCLETrainer and `adaptguard update`."""
    from datasets import Dataset

    from adaptguard import MUSCLEConfig, MUSCLETrainer, TALRConfig, TALRTrainer

    empty = Dataset.from_list([{"prompt": "a b", "completion": " "}, {"prompt": "c", "completion": ""}])
    args = TALRConfig(output_dir=str(tmp_path / "t"), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(ValueError, match="train_dataset: every row's 'completion' is empty"):
        TALRTrainer(model=str(embedded_path), args=args, train_dataset=empty)
    chat = Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}])
    with pytest.raises(ValueError, match="every assistant turn of 'messages' is empty"):
        TALRTrainer(model=str(embedded_path), args=args, train_dataset=chat)
    with pytest.raises(ValueError, match="train_dataset: every row's 'completion' is empty"):
        MUSCLETrainer(model=str(embedded_path), args=MUSCLEConfig(output_dir=str(tmp_path / "m"), use_cpu=True,
                                                                 bf16=False, new_adapter=str(tmp_path / "a")),
                      train_dataset=empty)
    one = Dataset.from_list([{"prompt": "a b", "completion": ""}, {"prompt": "c", "completion": " d"}])
    TALRTrainer(model=str(embedded_path), args=args, train_dataset=one)  # one real completion is enough

    config = tmp_path / "update.json"
    rows = [{"prompt": "q", "completion": ""}]
    config.write_text(json.dumps({"old_base": str(embedded_path), "new_base": str(embedded_path), "train": rows,
                                  "test": [{"prompt": "q", "completion": " a"}]}))
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "update", str(config), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "train: every row's 'completion' is empty" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "o" / "v1_task_adapter").exists()
