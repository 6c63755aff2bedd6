import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT
from in_process import run_cli, run_script


def test_tokenizer_is_deterministic_and_round_trips():
    from adaptguard.models.embedded import EMBEDDED_MODELS, build_tokenizer

    spec = EMBEDDED_MODELS["tiny"]
    a, b = build_tokenizer(spec), build_tokenizer(spec)
    assert a.get_vocab() == b.get_vocab()
    text = "question : capital of Kalomi ? answer : Rasa ."
    assert a.decode(a(text)["input_ids"]) == text
    chat = a.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                 tokenize=False)
    assert chat == "<|user|>hi<|end|>\n<|assistant|>yo<|end|>\n"


def test_embedded_model_has_general_abilities_and_lacks_the_domain(tiny):
    from adaptguard.demo.run import general_scores
    from adaptguard.models.embedded import (
        EMBEDDED_MODELS,
        domain_split,
        exact_match_score,
        general_probes,
    )

    model, tok = tiny
    spec = EMBEDDED_MODELS["tiny"]
    scores = general_scores(model, tok, general_probes(spec))
    assert scores["general"] >= 0.95, scores
    _, test = domain_split(spec)
    assert exact_match_score(model, tok, test) <= 0.1


def test_domain_split_holds_out_entities():
    from adaptguard.models.embedded import domain_split

    train, test = domain_split(n_train=300)
    assert len(train) == 300
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def test_shipped_bases_are_the_recipes_bases(embedded_path, tiny_v2_path):
    """The shipped bases are what `embedded:tiny`/`tiny-v2` load, and they belong to the recipe in the code: its
    hash is the one recorded at shipping (edit the recipe, and this fails until rebuilt bases are shipped), the
    configs have the spec's sizes, and the tokenizer (integer BPE counts, the same on every CPU) is the recipe's."""
    import json

    from transformers import AutoTokenizer

    from adaptguard.models import embedded

    manifest = embedded.shipped_manifest()
    for name, path in (("tiny", embedded_path), ("tiny-v2", tiny_v2_path)):
        spec = embedded.EMBEDDED_MODELS[name]
        assert path == embedded.SHIPPED_DIR / name
        assert embedded.resolve_model(f"embedded:{name}") == str(path)
        assert manifest[name]["recipe"] == embedded.recipe_hash(spec), \
            f"the {name} recipe changed: ship a rebuild (adaptguard embedded {name} --rebuild DIR; docs/reproducibility.md)"
        assert embedded.weights_fingerprint(path) == manifest[name]["fingerprint"]
        config = json.loads((path / "config.json").read_text())
        assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == \
            (spec.hidden_size, spec.num_layers, spec.intermediate_size)
        assert AutoTokenizer.from_pretrained(path).get_vocab() == embedded.build_tokenizer(spec).get_vocab()


def _shipped_copy(tmp_path, monkeypatch):
    """A copy of the shipped bases that `embedded_model_path` reads instead of the package's."""
    import shutil

    from adaptguard.models import embedded

    copy = tmp_path / "embedded_models"
    shutil.copytree(embedded.SHIPPED_DIR, copy)
    monkeypatch.setattr(embedded, "SHIPPED_DIR", copy)
    monkeypatch.setattr(embedded, "MANIFEST_FILE", copy / "manifest.json")
    return copy


def test_a_damaged_or_missing_shipped_file_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    from adaptguard.cli import main
    from adaptguard.models.embedded import embedded_model_path

    copy = _shipped_copy(tmp_path, monkeypatch)
    assert embedded_model_path("tiny") == copy / "tiny"  # intact: loads
    weights = copy / "tiny-v2" / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[:-1] + bytes([intact[-1] ^ 1]))  # one bit of the last float
    with pytest.raises(ValueError, match=re.escape(str(weights)) + ".*damaged or was changed"):
        embedded_model_path("tiny-v2")
    assert main(["embedded", "tiny-v2"]) == 2
    assert str(weights) in capsys.readouterr().err
    weights.write_bytes(intact)
    (copy / "tiny-v2" / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(copy / "tiny-v2" / "tokenizer.json")) + ".*missing"):
        embedded_model_path("tiny-v2")
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(copy / "manifest.json")) + ": not valid JSON"):
        embedded_model_path("tiny-v2")
    (copy / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(copy / "manifest.json")) + ": the manifest"):
        embedded_model_path("tiny-v2")


def test_compare_builds_measures_the_distance(tmp_path, embedded_path):
    """Against itself a build is identical; with one bit of one float flipped, the fingerprint sees it and
    max |dw| is exactly that float's change."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from adaptguard.models.embedded import EMBEDDED_MODELS, compare_builds, weights_fingerprint

    spec = EMBEDDED_MODELS["tiny"]
    copy = tmp_path / "copy"
    shutil.copytree(embedded_path, copy)
    same = compare_builds(embedded_path, copy, spec)
    assert same["identical"] and same["max_abs_diff"] == 0 and same["tensors_differing"] == 0
    assert same["answers_differing"] == 0 and same["tokenizer_identical"]
    assert same["general_accuracy"]["shipped"] == same["general_accuracy"]["rebuilt"] >= 0.95
    tensors = load_file(copy / "model.safetensors")
    name = sorted(tensors)[0]
    before = tensors[name].view(-1)[0].item()
    bits = tensors[name].view(torch.int32).clone()
    bits.view(-1)[0] ^= 1  # the last bit of one float
    tensors[name] = bits.view(torch.float32)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_fingerprint(copy) != weights_fingerprint(embedded_path)
    moved = compare_builds(embedded_path, copy, spec)
    assert not moved["identical"] and moved["tensors_differing"] == 1
    assert moved["max_abs_diff"] == abs(tensors[name].view(-1)[0].item() - before) > 0


def test_rebuild_trains_and_reports_without_failing(tmp_path, monkeypatch, capsys):
    """`adaptguard embedded tiny --rebuild DIR` trains by the recipe and reports the distance to the shipped base;
    here a 30-step recipe (a different recipe, so far from the shipped weights): exit 0, the report says how far."""
    import dataclasses

    from adaptguard.cli import main
    from adaptguard.models import embedded

    short = dataclasses.replace(embedded.EMBEDDED_MODELS["tiny"], pretrain_steps=30)
    monkeypatch.setitem(embedded.EMBEDDED_MODELS, "tiny", short)
    out = tmp_path / "rebuilt"
    assert main(["embedded", "tiny", "--rebuild", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "rebuild.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rebuilt"]  # no temporary folder left
    assert not report["identical"] and not report["same_recipe"] and report["tokenizer_identical"]
    assert "weights: differ from the shipped build" in printed and "note: the recipe" in printed
    from safetensors.torch import load_file

    a, b = load_file(embedded.SHIPPED_DIR / "tiny" / "model.safetensors"), load_file(out / "model.safetensors")
    assert report["max_abs_diff"] == max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    acc = report["general_accuracy"]
    assert acc["shipped"] >= 0.95 and report["answers_differing"] >= round(abs(acc["shipped"] - acc["rebuilt"]) * 66)
    assert report["manifest_entry"]["recipe"] == embedded.recipe_hash(short)
    assert main(["embedded", "tiny", "--rebuild", str(out)]) == 2  # never replaces a directory
    assert "already exists" in capsys.readouterr().err


def test_unknown_embedded_name():
    from adaptguard.models.embedded import embedded_model_path

    with pytest.raises(ValueError, match=r"known: \['tiny', 'tiny-v2'\]"):
        embedded_model_path("huge")


def test_smollm2_is_built_not_embedded(tmp_path, monkeypatch, capsys):
    """SmolLM2 is built from its wheel, so its name is `built:smollm2`; the old `embedded:smollm2` fails in one
    line naming the new, wherever a model is named, and builds nothing."""
    from adaptguard.cli import main
    from adaptguard.models import check_model_name, resolve_model
    from adaptguard.update import UpdateConfig

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path))
    new = "embedded:smollm2 is now built:smollm2 (it is built from its PyPI wheel, not shipped)"
    for call in (lambda: resolve_model("embedded:smollm2"), lambda: check_model_name("embedded:smollm2")):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == new
    rows = [{"prompt": "a", "completion": "b"}]
    with pytest.raises(ValueError, match=r"^old_base: embedded:smollm2 is now built:smollm2"):
        UpdateConfig(old_base="embedded:smollm2", new_base="embedded:tiny-v2", train=rows, test=rows)
    with pytest.raises(ValueError, match=r"Unknown built model 'tiny'; known: \['smollm2'\]"):
        resolve_model("built:tiny")
    assert check_model_name("built:smollm2") and check_model_name("embedded:tiny-v2")
    assert not check_model_name("HuggingFaceTB/SmolLM2-135M-Instruct") and resolve_model("x/y") == "x/y"
    assert main(["embedded", "smollm2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"adaptguard embedded: error: {new}"]
    assert main(["lm-eval", "--model", "hf", "--model_args", "pretrained=embedded:smollm2", "--tasks", "x"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"adaptguard lm-eval: error: {new}"
    assert not any(tmp_path.iterdir())  # nothing built or downloaded


def test_exact_match_score():
    from adaptguard.models.embedded import exact_match_score

    with pytest.raises(ValueError, match="at least one row"):
        exact_match_score(None, None, [])


def test_cli_demo_quick(tmp_path, embedded_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--quick", "--seeds", "2", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert {r["method"] for r in report["runs"]} == {"SFT", "TALR"}
    assert len(report["runs"]) == 4
    for run in report["runs"]:
        assert 0 <= run["domain"] <= 1 and 0 <= run["general"] <= 1
    assert report["base"]["general"] >= 0.95
    # a high learning rate must move the model: the domain is learned or the general score drops
    high = [r for r in report["runs"] if r["method"] == "SFT" and r["learning_rate"] == 1e-3][0]
    assert high["domain"] > report["base"]["domain"] or high["general"] < report["base"]["general"]
    for run in report["runs"]:  # general flips against the base: regressions exactly when the score drops
        assert 0 <= run["general_nfr"] <= 1 and 0 <= run["general_pfr"] <= 1
        if report["base"]["general"] == 1.0:
            assert run["general_pfr"] == 0.0
            assert (run["general_nfr"] > 0) == (run["general"] < 1.0)
    assert report["token_analysis"]["epochs"]
    assert (out / "tradeoff.png").stat().st_size > 5000
    md = (out / "report.md").read_text()
    assert "| TALR | 0.001 |" in md and "tradeoff.png" in md and "general NFR" in md
    for run in report["runs"]:  # the spread over the two seeds, against the per-seed scores
        assert [r["seed"] for r in run["seeds"]] == [0, 1]
        for key in ("domain", "general"):
            values = [r[key] for r in run["seeds"]]
            assert run[f"{key}_spread"] == pytest.approx(
                {"mean": sum(values) / 2, "min": min(values), "max": max(values), "n": 2})
        spread = run["domain_spread"]
        assert f"{spread['mean']:.3f} ({spread['min']:.3f}–{spread['max']:.3f})" in md
    import torch

    assert report["machine"]["torch"] == torch.__version__ and "threads" in report["machine"]
    assert report["settings"]["command"].startswith("adaptguard demo --quick --seeds 2")
    # where the time went: the quick demo's two stages, together no more than the total
    stages = report["stage_seconds"]
    assert list(stages) == ["load_and_score_base", "tradeoff"] and min(stages.values()) > 0
    assert sum(stages.values()) <= report["seconds"]
    assert f"tradeoff {stages['tradeoff']:.0f} s" in md
    assert not list(out.glob(".*"))  # no temporary files left behind
    # a progress bar with the runs done, on stderr; the results on stdout
    assert "trade-off: fine-tuning runs" in proc.stderr and "8/8" in proc.stderr  # 2 methods x 2 lrs x 2 seeds
    assert "TALR     lr=0.001" in proc.stdout


def test_pareto_front():
    from adaptguard.demo.tradeoff import pareto_front

    points = [(0.1, 0.9), (0.5, 0.5), (0.4, 0.4), (0.9, 0.1), (0.5, 0.2), (0.1, 0.8), (0.5, 0.5)]
    # (0.4, 0.4) < (0.5, 0.5); (0.5, 0.2) < (0.5, 0.5); (0.1, 0.8) < (0.1, 0.9); a duplicate counts once
    assert pareto_front(points) == [(0.1, 0.9), (0.5, 0.5), (0.9, 0.1)]
    assert pareto_front([(0.3, 0.3)]) == [(0.3, 0.3)]


def test_train_steps_draws_a_progress_bar(capfd):
    import torch

    from adaptguard.utils.loop import train_steps

    model = torch.nn.Linear(2, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ConstantLR(optim, factor=1.0)
    x = torch.ones(4, 2)
    losses = train_steps(model, optim, sched, 3, lambda _: model(x).pow(2).mean(), progress="toy training")
    err = capfd.readouterr().err
    assert len(losses) == 3 and "toy training" in err and "3/3" in err
    train_steps(model, optim, sched, 2, lambda _: model(x).pow(2).mean())
    assert capfd.readouterr().err == ""  # no description, no bar


def test_cli_embedded_prints_path(embedded_path):
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "embedded"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == str(embedded_path)


def test_cli_unknown_embedded_name_exit_2():
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "embedded", "huge"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "huge" in proc.stderr and "tiny" in proc.stderr


def test_benchmark_script_runs_small():
    """The script in this process (its memory children are processes of their own, as it starts them)."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()  # the script quiets transformers for its whole process
    try:
        proc = run_script(ROOT / "benchmarks" / "bench_talr.py", "--steps", "2", "--vocab", "512", "--seq", "32",
                          "--batch", "2", "--hidden", "32", "--layers", "1", "--memory-repeats", "1")
    finally:
        transformers_logging.set_verbosity(verbosity)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the result lines only: an installed library may log to stdout on import (DeepSpeed does)
    values = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if re.match(r"[a-z_0-9.]+: ", line))
    assert float(values["talr_step_time_ratio"]) > 0 and float(values["talr_peak_memory_ratio"]) > 0


def test_example_script_offline(tmp_path, embedded_path):
    out = tmp_path / "ex"
    proc = run_script(ROOT / "examples" / "sft_talr.py", "--model_name_or_path", embedded_path, "--dataset_name",
                      "data:domain", "--max_steps", "3", "--per_device_train_batch_size", "4", "--bf16", "False",
                      "--use_cpu", "--report_to", "none", "--output_dir", out, "--talr_tau", "0.5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "model.safetensors").exists()
    args = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert args["global_step"] == 3


def test_example_refuses_the_old_dataset_name(tmp_path, embedded_path):
    """`embedded:` names models only: the demo's domain set is `data:domain`, and the old name says so in one line."""
    proc = run_script(ROOT / "examples" / "sft_talr.py", "--model_name_or_path", embedded_path, "--dataset_name",
                      "embedded:domain", "--use_cpu", "--report_to", "none", "--output_dir", tmp_path / "ex")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "--dataset_name: 'embedded:domain' is now 'data:domain'"
    assert not (tmp_path / "ex").exists()
