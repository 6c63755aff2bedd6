import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT


def test_tokenizer_is_deterministic_and_round_trips():
    from adaptguard.experiments.embedded import EMBEDDED_MODELS, build_tokenizer

    spec = EMBEDDED_MODELS["tiny"]
    a, b = build_tokenizer(spec), build_tokenizer(spec)
    assert a.get_vocab() == b.get_vocab()
    text = "question : capital of Kalomi ? answer : Rasa ."
    assert a.decode(a(text)["input_ids"]) == text
    chat = a.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                 tokenize=False)
    assert chat == "<|user|>hi<|end|>\n<|assistant|>yo<|end|>\n"


def test_embedded_model_has_general_abilities_and_lacks_the_domain(tiny):
    from adaptguard.experiments.demo import general_scores
    from adaptguard.experiments.embedded import (
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
    from adaptguard.experiments.embedded import domain_split

    train, test = domain_split(n_train=300)
    assert len(train) == 300
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def test_embedded_path_is_cached(embedded_path):
    from adaptguard.experiments.embedded import embedded_model_path

    before = (embedded_path / "model.safetensors").stat().st_mtime_ns
    assert embedded_model_path("tiny") == embedded_path
    assert (embedded_path / "model.safetensors").stat().st_mtime_ns == before


def test_embedded_build_is_the_recorded_one(embedded_path, tiny_v2_path):
    """The build runs with fixed kernels and one thread (`BUILD_ENV`), whatever this process's settings: under
    `.ci/shake` (scalar, avx2, avx512 kernels; 1 and 2 threads) every build must give the recorded weights."""
    from adaptguard.experiments.embedded import recorded_fingerprint, weights_fingerprint

    expected = {name: recorded_fingerprint(name) for name in ("tiny", "tiny-v2")}
    if None in expected.values():
        pytest.skip("no fingerprint recorded for this recipe and these torch/transformers/tokenizers versions")
    assert weights_fingerprint(embedded_path) == expected["tiny"]
    assert weights_fingerprint(tiny_v2_path) == expected["tiny-v2"]


def test_weights_fingerprint_sees_one_changed_bit(tmp_path, embedded_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from adaptguard.experiments.embedded import weights_fingerprint

    copy = tmp_path / "copy"
    shutil.copytree(embedded_path, copy)
    assert weights_fingerprint(copy) == weights_fingerprint(embedded_path)
    tensors = load_file(copy / "model.safetensors")
    name = sorted(tensors)[0]
    bits = tensors[name].view(torch.int32).clone()
    bits.view(-1)[0] ^= 1  # the last bit of one float
    tensors[name] = bits.view(torch.float32)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_fingerprint(copy) != weights_fingerprint(embedded_path)


def test_unknown_embedded_name():
    from adaptguard.experiments.embedded import embedded_model_path

    with pytest.raises(ValueError, match=r"known: \['tiny', 'tiny-v2', 'smollm2'\]"):
        embedded_model_path("huge")


def test_exact_match_score():
    from adaptguard.experiments.embedded import exact_match_score

    with pytest.raises(ValueError, match="at least one row"):
        exact_match_score(None, None, [])


def test_cli_demo_quick(tmp_path, embedded_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "demo", "--quick", "--seeds", "2", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
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
    assert not list(out.glob(".*"))  # no temporary files left behind
    # a progress bar with the runs done, on stderr; the results on stdout
    assert "trade-off: fine-tuning runs" in proc.stderr and "8/8" in proc.stderr  # 2 methods x 2 lrs x 2 seeds
    assert "TALR     lr=0.001" in proc.stdout


def test_pareto_front():
    from adaptguard.experiments.demo import pareto_front

    points = [(0.1, 0.9), (0.5, 0.5), (0.4, 0.4), (0.9, 0.1), (0.5, 0.2), (0.1, 0.8), (0.5, 0.5)]
    # (0.4, 0.4) < (0.5, 0.5); (0.5, 0.2) < (0.5, 0.5); (0.1, 0.8) < (0.1, 0.9); a duplicate counts once
    assert pareto_front(points) == [(0.1, 0.9), (0.5, 0.5), (0.9, 0.1)]
    assert pareto_front([(0.3, 0.3)]) == [(0.3, 0.3)]


def test_train_steps_draws_a_progress_bar(capfd):
    import torch

    from adaptguard.experiments.loop import train_steps

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
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_talr.py"), "--steps", "2", "--vocab",
                           "512", "--seq", "32", "--batch", "2", "--hidden", "32", "--layers", "1",
                           "--memory-repeats", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the result lines only: an installed library may log to stdout on import (DeepSpeed does)
    values = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if re.match(r"[a-z_0-9.]+: ", line))
    assert float(values["talr_step_time_ratio"]) > 0 and float(values["talr_peak_memory_ratio"]) > 0


def test_example_script_offline(tmp_path, embedded_path):
    out = tmp_path / "ex"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "sft_talr.py"), "--model_name_or_path",
                           str(embedded_path), "--dataset_name", "embedded:domain", "--max_steps", "3",
                           "--per_device_train_batch_size", "4", "--bf16", "False", "--use_cpu", "--report_to",
                           "none", "--output_dir", str(out), "--talr_tau", "0.5"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "model.safetensors").exists()
    args = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert args["global_step"] == 3
