import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import run_cli


def test_update_pipeline_on_embedded_bases(tmp_path, tiny_v2_path):
    """One full `run_update` (tiny → tiny-v2, with two lm-eval tasks): its report's numbers against an independent
    recount from the saved adapters — each model's answers regenerated and the flips counted by hand."""
    from lm_eval_runs import write_tasks
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.update import run_update, tiny_preset
    from adaptguard.utils.generation import generate_answers

    cfg = tiny_preset(str(tmp_path / "out"))
    cfg.task_epochs, cfg.compat_epochs = 2, 1  # the mechanics, quickly: no rate is asserted
    # the two lm-eval tasks' files (the suite's `lm_runs` fixture writes the same, then fine-tunes and evaluates a
    # model this test does not read)
    cfg.lm_eval_tasks, cfg.lm_eval_include_path = ["t_piqa", "t_gsm"], [str(write_tasks(tmp_path / "lm"))]
    cfg.lm_eval_gen_kwargs = {"max_gen_toks": 12}
    report = run_update(cfg)
    out = tmp_path / "out"
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    # v1 was read once into the exact cache of teacher vectors, which the MUSCLE run trained from (issue 64)
    (cache,) = (out / "steps").glob("v1_vectors_*/cache/cache.json")
    assert json.loads(cache.read_text())["kind"] == "vectors" and json.loads(cache.read_text())["dtype"] == "float32"

    def answers(base, adapter, merge):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / adapter)
        model = model.merge_and_unload() if merge else model
        return generate_answers(model.eval(), AutoTokenizer.from_pretrained(base), cfg.test, cfg.max_new_tokens)

    gold = [r["completion"].strip() for r in cfg.test]
    right = {name: [a == g for a, g in zip(answers(base, adapter, merge), gold)]
             for name, base, adapter, merge in (("v1", cfg.old_base, "v1_task_adapter", True),
                                                 ("v2", cfg.new_base, "v2_task_adapter", False),
                                                 ("compat", cfg.new_base, "compat_adapter", False),
                                                 ("control", cfg.new_base, "control_adapter", False))}
    n = len(gold)
    assert report["n_test"] == n == 252
    assert report["old_acc"] == sum(right["v1"]) / n
    assert report["new_acc"] == sum(right["v2"]) / n
    assert report["compat_acc"] == sum(right["compat"]) / n
    assert report["control_acc"] == sum(right["control"]) / n
    lost = {}
    for new, suffix in (("v2", ""), ("compat", "_compat"), ("control", "_control")):
        lost[new] = [o and not w for o, w in zip(right["v1"], right[new])]
        gained = sum(w and not o for o, w in zip(right["v1"], right[new]))
        assert report[f"nfr{suffix}"] == sum(lost[new]) / n and report[f"pfr{suffix}"] == gained / n, new
    # the primary comparison, compat vs control, item by item
    assert report["nfr_compat_minus_control"] == pytest.approx((sum(lost["compat"]) - sum(lost["control"])) / n)
    lo, hi = report["nfr_compat_minus_control_ci"]
    assert lo <= report["nfr_compat_minus_control"] <= hi
    only_compat = sum(c and not k for c, k in zip(lost["compat"], lost["control"]))
    only_control = sum(k and not c for c, k in zip(lost["compat"], lost["control"]))
    from scipy.stats import binomtest

    expected_p = 1.0 if only_compat + only_control == 0 else binomtest(only_compat, only_compat + only_control).pvalue
    assert report["mcnemar_p_compat_vs_control"] == pytest.approx(expected_p)
    assert (out / "flips.png").stat().st_size > 5000
    assert "| M_v1 acc |" in (out / "report.md").read_text()

    piqa = report["lm_eval"]["t_piqa"]  # lm-eval flips of the same three models on a multiple-choice task
    assert piqa["n"] == 18 and piqa["compatible"]["n"] == 18
    assert "t_gsm,strict-match" in report["lm_eval"]
    assert "## lm-eval tasks" in (out / "report.md").read_text()


def test_paraphrase_split_holds_out_prompts():
    from adaptguard.update import paraphrase_split

    train, test = paraphrase_split()
    assert len(train) == 108 and len(test) == 252
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    other_train, _ = paraphrase_split(seed=1)
    assert {r["prompt"] for r in other_train} != {r["prompt"] for r in train}


def answer_log_probs(model, tok, rows) -> list[float]:
    """Per row: log p(completion + EOS | prompt), the answer's whole probability (unpadded, one row at a time).
    Above log ½ it is the greedy answer: every token's probability then exceeds ½, so greedy decoding emits it."""
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for r in rows:
            prompt = tok(r["prompt"])["input_ids"]
            ids = tok(r["prompt"] + r["completion"])["input_ids"] + [tok.eos_token_id]
            assert ids[:len(prompt)] == prompt  # the completion's tokens follow the prompt's unchanged
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
            out.append(sum(logp[i - 1, ids[i]].item() for i in range(len(prompt), len(ids))))
    return out


def test_old_only_mask_moves_the_student_to_v1s_answers(tmp_path, embedded_path):
    """MUSCLE's mechanism on a constructed case: the v1 and v2 task adapters learn *different* answers to the same
    12 prompts (v1 the capital, v2 the next country's capital). Distilled from v1 alone (`old_only`), the
    compatibility adapter, which starts as v2's adapter, must answer as v1 does; from v2 alone (`new_only`, the
    control, trained on the same rows whose labels are v1's answers), nothing pulls it: its teacher is its own start.

    Asserted on log-probabilities of whole answers, with margins no CPU's rounding crosses (issue 79; measured on an
    AMD EPYC, native AVX2 and `ATEN_CPU_CAPABILITY=default`, 1 and 2 threads, numpy's dispatch on and off: the kernel
    sets differ by ≤ 0.012 nat): each task model's own answer and the moved student's v1 answer have log p > log ½ on
    every item (weakest −0.17 and −0.03 against −0.69), and the moved student prefers v1's answer to v2's by > 2 nats
    on every item (weakest 4.6; v2 the other way, weakest 2.8). The control is asserted at its start, not after
    training: its loss and gradient are rounding (≤ 3e-7, against old_only's 0.57 and 1.6), and Adam's first step
    turns rounding into an lr-sized step on every weight (lr·g/(|g|+ε) with |g| ≈ ε), so where a trained control
    ends is the kernels' rounding (v2's answers on 12/12 items natively, 2/12 under scalar kernels), not the mask."""
    import math

    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from adaptguard import MUSCLEConfig, MUSCLETrainer
    from adaptguard.models.embedded import EMBEDDED_MODELS, world_facts
    from adaptguard.update import UpdateConfig
    from adaptguard.update.steps import _train_task_adapter
    from adaptguard.utils.generation import generate_answers

    base = str(embedded_path)
    tok = AutoTokenizer.from_pretrained(base)
    facts = world_facts(EMBEDDED_MODELS["tiny"])[:12]
    v1_rows = [{"prompt": f"question : capital of {c} ? answer :", "completion": f" {city} ."} for c, city in facts]
    v2_rows = [{"prompt": r["prompt"], "completion": f" {facts[(i + 1) % 12][1]} ."} for i, r in enumerate(v1_rows)]
    cfg = UpdateConfig(old_base=base, new_base=base, train=[], test=[], task_learning_rate=5e-3, task_epochs=30,
                       batch_size=12, max_length=64, use_cpu=True)
    v1_adapter = _train_task_adapter(cfg, base, v1_rows, tmp_path / "v1", tok)
    v2_adapter = _train_task_adapter(cfg, base, v2_rows, tmp_path / "v2", tok)
    v1 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), v1_adapter).merge_and_unload()
    v2 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), v2_adapter)
    half = math.log(0.5)

    def preference_for_v1(model):  # per item: log p(v1's answer) − log p(v2's answer), in nats
        return [a - b for a, b in zip(answer_log_probs(model, tok, v1_rows), answer_log_probs(model, tok, v2_rows))]

    # the premise: each task model learned its own answers (probability > ½ each: its greedy answers, 12/12)
    assert min(answer_log_probs(v1, tok, v1_rows)) > half and min(answer_log_probs(v2, tok, v2_rows)) > half
    assert generate_answers(v1, tok, v1_rows, 8) == [r["completion"].strip() for r in v1_rows]
    assert generate_answers(v2, tok, v1_rows, 8) == [r["completion"].strip() for r in v2_rows]
    assert max(preference_for_v1(v2)) < -2  # v2 prefers its own answer by > 2 nats on every item

    def compat(mask, **steps):
        args = MUSCLEConfig(output_dir=str(tmp_path / mask), new_adapter=str(v2_adapter), mask=mask,
                            learning_rate=5e-3, per_device_train_batch_size=12, max_length=64, bf16=False,
                            gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
                            disable_tqdm=True, seed=0, logging_steps=1, **steps)
        trainer = MUSCLETrainer(model=base, args=args, old_model=v1, old_processing_class=tok,
                                train_dataset=Dataset.from_list(v1_rows), processing_class=tok)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        return trainer.model, [h for h in trainer.state.log_history if "loss" in h]

    moved, moved_log = compat("old_only", num_train_epochs=15)
    assert len(moved_log) == 15 and all(h["compat/frac_aligned_old"] == 1 for h in moved_log)  # every token: v1
    # the pull: v1's answer is the moved student's greedy answer on every item, > 2 nats above v2's (from < −2)
    assert min(answer_log_probs(moved, tok, v1_rows)) > half and min(preference_for_v1(moved)) > 2
    assert generate_answers(moved, tok, v1_rows, 8) == [r["completion"].strip() for r in v1_rows]
    # the control: mask 0 on every token, and at the start (student = v2 = its teacher) neither loss nor gradient,
    # though the rows' labels are v1's answers — against old_only's at the same start
    _, kept_log = compat("new_only", max_steps=1)
    (kept_start,), moved_start = kept_log, moved_log[0]
    assert kept_start["compat/frac_aligned_old"] == 0
    assert moved_start["loss"] > 0.1 and moved_start["grad_norm"] > 0.5
    assert abs(kept_start["loss"]) < 1e-4 * moved_start["loss"]
    assert kept_start["grad_norm"] < 1e-4 * moved_start["grad_norm"]


def test_cli_seed_sweep_reports_the_spread_of_the_per_seed_runs(tmp_path, embedded_path, capsys):
    """`adaptguard update CONFIG --seeds 2`: one full run per seed, and a summary that equals the spread
    recomputed from the per-seed report.json files (mechanics only: one epoch each, rates not asserted)."""
    rows = [{"prompt": f"question : opposite of {a} ? answer :", "completion": f" {b} ."}
            for a, b in (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"))]
    config = tmp_path / "update.json"
    config.write_text(json.dumps({"old_base": str(embedded_path), "new_base": str(embedded_path), "train": rows,
                                  "test": rows, "task_epochs": 1, "compat_epochs": 1, "batch_size": 4,
                                  "max_length": 64, "max_new_tokens": 4, "use_cpu": True}))
    out = tmp_path / "sweep"
    proc = run_cli("update", config, "--seeds", "2", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 seeds, mean (min-max)" in proc.stdout
    result = json.loads((out / "seeds.json").read_text())
    per_seed = [json.loads((out / f"seed-{s}" / "report.json").read_text()) for s in (0, 1)]
    assert [r["config"]["seed"] for r in per_seed] == [0, 1]
    for key in ("old_acc", "new_acc", "compat_acc", "nfr", "nfr_compat", "delta_nfr", "pfr", "pfr_compat"):
        values = [r[key] for r in per_seed]
        assert result["summary"][key] == pytest.approx(
            {"mean": sum(values) / 2, "min": min(values), "max": max(values), "n": 2}), key
    below = sum(r["nfr_compat"] < r["nfr"] for r in per_seed)
    assert result["nfr_compat_below_nfr"] == below
    assert result["holds_beyond_spread"] == all(r["nfr_compat"] < r["nfr"] for r in per_seed)
    assert result["nfr_compat_at_most_nfr"] == sum(r["nfr_compat"] <= r["nfr"] for r in per_seed)
    assert result["seeds_without_regressions"] == sum(r["nfr"] == 0 for r in per_seed)
    md = (out / "seeds.md").read_text()
    assert "| seed | M_v1 acc |" in md and "Measured on" in md and result["machine"]["cpu"] in md
    # the refusal comes before any model is built: the CLI's entry point in this process (no second start-up)
    from adaptguard.cli.main import main

    capsys.readouterr()
    assert main(["update", str(config), "--seeds", "0"]) == 2
    assert "--seeds: expected a positive integer, got 0" in capsys.readouterr().err


def test_config_file_errors(tmp_path, capsys):
    from adaptguard.update import UpdateConfig

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        UpdateConfig.from_file(bad)
    bad.write_text(json.dumps({"old_base": "a", "new_base": "b", "train": [], "test": [], "lr": 1}))
    with pytest.raises(ValueError, match="unknown fields \\['lr'\\]"):
        UpdateConfig.from_file(bad)
    bad.write_text(json.dumps({"old_base": "a"}))
    with pytest.raises(ValueError, match="missing required fields \\['new_base', 'test', 'train'\\]"):
        UpdateConfig.from_file(bad)
    from adaptguard.cli.main import main

    assert main(["update", str(tmp_path / "none.json")]) == 2  # the CLI's entry point, in this process
    assert "no such config file" in capsys.readouterr().err


def test_vocabulary_mismatch_is_refused_before_training(tmp_path, embedded_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from adaptguard.update import UpdateConfig, run_update

    other = tmp_path / "other_base"
    shutil.copytree(embedded_path, other)
    for f in other.glob("tokenizer*"):
        f.unlink()
    vocab = {f"w{i}": i for i in range(640)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w0")),
                            pad_token="w1", eos_token="w2").save_pretrained(other)
    rows = [{"prompt": "a", "completion": " b"}]
    cfg = UpdateConfig(old_base=str(embedded_path), new_base=str(other), train=rows, test=rows,
                       output_dir=str(tmp_path / "out"), use_cpu=True)
    with pytest.raises(ValueError, match="old_base/new_base: the old and new tokenizers (map tokens|have different)"):
        run_update(cfg)
    assert not (tmp_path / "out" / "v1_task_adapter").exists()


def test_load_any_dataset(tmp_path):
    from datasets import Dataset, DatasetDict

    from adaptguard.utils.data import load_any_dataset

    rows = [{"prompt": "a", "completion": " b"}, {"prompt": "c", "completion": " d"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(load_any_dataset(str(tmp_path / "rows.jsonl"))) == rows
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(
        str(tmp_path / "dd"))
    assert len(load_any_dataset(str(tmp_path / "dd"), "test")) == 1
    with pytest.raises(ValueError, match="no split 'dev'"):
        load_any_dataset(str(tmp_path / "dd"), "dev")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a dataset saved"):
        load_any_dataset(str(tmp_path / "plain"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="unsupported dataset file type"):
        load_any_dataset(str(tmp_path / "x.txt"))


def test_example_config_is_valid():
    from conftest import ROOT

    from adaptguard.update import UpdateConfig

    cfg = UpdateConfig.from_file(ROOT / "examples" / "update_config.json")
    assert cfg.lora_r == 128 and cfg.temperature == 2.0 and cfg.lm_eval_tasks == ["compat_piqa"]


def test_extra_args_override_the_training_defaults():
    from adaptguard.update import UpdateConfig
    from adaptguard.update.steps import training_kwargs

    cfg = UpdateConfig(old_base="a", new_base="b", train=[], test=[], extra_args={"bf16": True, "logging_steps": 3})
    kwargs = training_kwargs(cfg, output_dir="o", learning_rate=0.1)
    assert kwargs["bf16"] is True and kwargs["logging_steps"] == 3 and kwargs["learning_rate"] == 0.1


def test_an_interrupted_update_leaves_no_half_trained_adapter(tmp_path, embedded_path, tiny_v2_path, monkeypatch):
    """Ctrl-C during a training: the adapter folder being trained does not appear, its temporary folder is removed,
    and what finished before stays whole."""
    from adaptguard.talr.trainer import TALRTrainer
    from adaptguard.update import run_update, tiny_preset
    from adaptguard.update.pick import Pick
    from adaptguard.utils.files import finished_dir

    def interrupted(self, *args, **kwargs):  # a training that wrote a checkpoint, then got Ctrl-C
        (Path(self.args.output_dir) / "checkpoint-1").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(TALRTrainer, "train", interrupted)
    monkeypatch.setattr(Pick, "measure", lambda self: {"step_s": 0.1, "item_s": 0.01})  # the plan's timing trains too
    cfg = tiny_preset(str(tmp_path / "out"))
    cfg.old_base = cfg.new_base = str(embedded_path)
    with pytest.raises(KeyboardInterrupt):
        run_update(cfg)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []

    with finished_dir(tmp_path / "done") as d:  # a completed block: renamed into place
        (d / "adapter_config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "out"]


def test_ctrl_c_during_update_ends_cleanly(tmp_path, embedded_path):
    """A real SIGINT while `adaptguard update` trains its second adapter: one line and exit 130, no traceback;
    the finished v1 adapter stays whole, the interrupted one leaves no folder (not even its `.partial`)."""
    import os
    import signal
    import time

    rows = [{"prompt": f"question : opposite of {a} ? answer :", "completion": f" {b} ."}
            for a, b in (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"))]
    config = tmp_path / "update.json"
    config.write_text(json.dumps({"old_base": str(embedded_path), "new_base": str(embedded_path), "train": rows,
                                  "test": rows, "task_epochs": 300, "batch_size": 4, "max_length": 64,
                                  "use_cpu": True}))
    out = tmp_path / "o"
    # a shell that starts jobs in the background (`cmd &`, as CI runners may) leaves SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: the child gets SIGINT's default back, as on a terminal
    proc = subprocess.Popen([sys.executable, "-m", "adaptguard.cli", "update", str(config), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        err, deadline = b"", time.monotonic() + 900
        while b"update: v2 task adapter" not in err:
            assert time.monotonic() < deadline, f"no v2 adapter training within 900 s: {err.decode()[-2000:]}"
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, f"update ended before the v2 adapter: {err.decode()[-2000:]}"
            err += chunk
        # v2 trains for 300 steps (as v1 did before it), >5 s on a fast idle machine: the signal, 1 s after its
        # training began, arrives during it
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = (err + rest).decode()
    assert proc.returncode == 130, err[-2000:]
    assert "adaptguard update: interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["v1_task_adapter"]
    assert (out / "v1_task_adapter" / "adapter_model.safetensors").stat().st_size > 0


def test_a_finished_task_adapter_is_reused_only_for_the_same_training(tmp_path, embedded_path, capsys):
    """A re-run (e.g. the same update with another mask) reuses a finished task adapter of the same base, data and
    settings; any difference trains it again."""
    import dataclasses

    from transformers import AutoTokenizer

    from adaptguard.update import UpdateConfig
    from adaptguard.update.steps import _train_task_adapter

    base, tok = str(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    rows = [{"prompt": "question : capital of a ? answer :", "completion": " b ."}] * 4
    cfg = UpdateConfig(old_base=base, new_base=base, train=[], test=[], task_epochs=1, batch_size=4, use_cpu=True)
    weights = tmp_path / "v1" / "adapter_model.safetensors"

    def train(cfg, rows):
        _train_task_adapter(cfg, base, rows, tmp_path / "v1", tok, "v1 task adapter")
        return weights.stat().st_mtime_ns, "v1 task adapter: reusing" in capsys.readouterr().out

    first, reused = train(cfg, rows)
    assert not reused
    assert train(cfg, rows) == (first, True)
    changed, reused = train(dataclasses.replace(cfg, task_learning_rate=2e-3), rows)
    assert changed != first and not reused
    assert train(dataclasses.replace(cfg, task_learning_rate=2e-3), rows[:3])[1] is False


def test_update_without_a_v2_task_adapter(tmp_path, embedded_path, tiny_v2_path):
    """The update is v2 itself (as a quantized model would be): no v2 task adapter is trained, v2 is evaluated as it
    is, and the compatibility and control adapters are trained fresh on it (both from the same LoRA init)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.update import run_update, tiny_preset
    from adaptguard.utils.generation import generate_answers

    cfg = tiny_preset(str(tmp_path / "out"))
    cfg.new_task_adapter, cfg.task_epochs, cfg.compat_epochs = False, 1, 1
    cfg.test = cfg.test[:40]
    report = run_update(cfg)
    out = tmp_path / "out"
    assert not report["new_task_adapter"] and not (out / "v2_task_adapter").exists()
    assert (out / "compat_adapter" / "adapter_config.json").exists()
    assert (out / "control_adapter" / "adapter_config.json").exists()
    answers = generate_answers(AutoModelForCausalLM.from_pretrained(cfg.new_base).eval(),
                               AutoTokenizer.from_pretrained(cfg.new_base), cfg.test, cfg.max_new_tokens)
    assert report["new_acc"] == sum(a == r["completion"].strip() for a, r in zip(answers, cfg.test)) / 40
    for key in ("control_acc", "nfr_control", "nfr_control_ci", "nfr_compat_minus_control"):
        assert report[key] is not None, key
