"""Experiment E1's runner (issue 28) on the embedded toy: the registered statistics against hand counts, the whole
pipeline (v1, a 4-bit quantized v2 and a continued-training v2, four arms) and resuming after a kill."""

import json

import numpy as np
import pytest


def toy_task(tmp_path, embedded_path):
    """Two-choice capital questions from the embedded model's facts (the right city and another one)."""
    from adaptguard.models.embedded import EMBEDDED_MODELS, world_facts

    facts = world_facts(EMBEDDED_MODELS["tiny"])
    rows = []
    for i, (country, city) in enumerate(facts):
        other = facts[(i + 1) % len(facts)][1]
        choices = [city, other] if i % 2 else [other, city]
        rows.append({"input": f"question : capital of {country} ? answer :", "choices": choices,
                     "label": choices.index(city)})
    path = tmp_path / "task.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, len(rows)


def toy_config(tmp_path, embedded_path, **kw):
    from studies.real_update import E1Config

    task, n = toy_task(tmp_path, embedded_path)
    third = n // 3
    return E1Config(out=str(tmp_path / "e1"), model=str(embedded_path), task=str(task), n_train=third, n_dev=third,
                    n_test=n - 2 * third, seeds=[0], quant_types=["nf4"], continued_settings=[[3, 1e-3]],
                    mix_tasks=[str(task)], mix_rows_per_task=8, min_nfr=0.0, task_lrs=[1e-3, 3e-3], arm_lrs=[1e-3],
                    batch_size=4, max_length=32, eval_batch_size=8, **kw)


def test_summary_against_hand_counts():
    from scipy.stats import binomtest

    from studies.real_update import summarise, verdict

    v1 = [True, True, True, True, False, False]
    v2 = [False, True, True, True, False, True]
    arms = {"compat": [[True, True, True, False, False, False], [True, True, True, True, False, False]],
            "control": [[False, False, True, True, False, False], [False, True, True, True, True, False]]}
    out = summarise(v1, v2, arms)
    assert out["v2"]["nfr"] == pytest.approx(1 / 6)
    assert out["compat"]["nfr"] == pytest.approx((1 / 6 + 0) / 2) and out["control"]["nfr"] == pytest.approx(1.5 / 6)
    # per item, mean over the two seeds: compat − control = [-1, -0.5, 0, 0.5, 0, 0]
    vs = out["compat"]["vs_control"]
    assert vs["delta_nfr"] == pytest.approx(-1 / 6)
    assert vs["ci"][0] <= vs["delta_nfr"] <= vs["ci"][1]
    assert vs["mcnemar_p_per_seed"] == [pytest.approx(binomtest(1, 3).pvalue), pytest.approx(binomtest(0, 1).pvalue)]
    assert [verdict(-0.1, -0.01), verdict(0.01, 0.1), verdict(-0.04, 0.04), verdict(-0.2, 0.1)] == \
        ["reproduced", "contradicted", "not reproduced", "inconclusive"]


def test_pipeline_resumes_after_a_kill(tmp_path, embedded_path, monkeypatch):
    from studies import real_update

    cfg = toy_config(tmp_path, embedded_path)
    trained = []
    original = real_update.train_adapter

    def counting(*args, **kwargs):
        trained.append(str(args[4].name))
        if kwargs.get("mask") == "old_only" and not any("killed" in t for t in trained):
            trained.append("killed")
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of the third arm
        return original(*args, **kwargs)

    monkeypatch.setattr(real_update, "train_adapter", counting)
    # the registered dev choices first: they read no test item, and pick the best dev setting
    choices = real_update.E1(cfg, say=lambda _: None).dev_stage()
    out = tmp_path / "e1"
    assert not (out / "scores" / "test").exists()
    accuracy = {float(k): v for k, v in choices["task_lr"]["dev_accuracy"].items()}
    assert set(accuracy) == {1e-3, 3e-3} and choices["task_lr"]["chosen"] == max(cfg.task_lrs, key=accuracy.get)
    for lr, acc in accuracy.items():  # the recorded accuracies are the stored per-item dev scores
        assert acc == pytest.approx(np.mean(json.loads((out / "scores" / "dev" / f"v1_{lr:g}" / "scores.json").read_text())))
    assert choices["update_quantized"]["setting"] == "nf4" and "arm_lr_continued" in choices
    with pytest.raises(KeyboardInterrupt):
        real_update.E1(cfg, say=lambda _: None).run_test()
    before = list(trained)
    assert not list((tmp_path / "e1").rglob("*.partial"))  # no half-written step left behind
    report = real_update.E1(cfg, say=lambda _: None).run_test()
    redone = trained[len(before):]
    killed_step, finished = before[-2], set(before[:-2])
    # the finished steps were reused: the killed arm is the first to train again, nothing finished trains twice
    assert redone[0] == killed_step and not set(redone) & finished
    assert json.loads((tmp_path / "e1" / "report.json").read_text())["updates"].keys() == {"quantized", "continued"}
    for update in ("quantized", "continued"):
        entry = report["updates"][update]
        assert set(entry) >= {"v2", "compat", "ll_l", "old_only", "control"}
        for arm in ("compat", "ll_l", "old_only"):
            assert entry[arm]["vs_control"]["verdict"] in ("reproduced", "contradicted", "not reproduced",
                                                           "inconclusive")
    md = (tmp_path / "e1" / "report.md").read_text()
    for update in ("quantized", "continued"):
        vs = report["updates"][update]["compat"]["vs_control"]
        assert f"| compat | {report['updates'][update]['compat']['new_acc']:.3f} |" in md
        assert f"{vs['delta_nfr']:+.3f} ({vs['ci'][0]:+.3f} to {vs['ci'][1]:+.3f})" in md
    # a third run trains and scores nothing
    n = len(trained)
    again = real_update.E1(cfg, say=lambda _: None).run_test()
    same = [json.loads(json.dumps(r["updates"], default=str)) for r in (again, report)]
    assert len(trained) == n and same[0] == same[1]
    assert np.isfinite(report["updates"]["quantized"]["v2"]["nfr"])


def test_quantized_base_without_bitsandbytes_names_the_extra(embedded_path, monkeypatch):
    import importlib.util

    from studies.real_update import load_base

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ImportError, match=r"quant_type='nf4'.*adaptguard\[quant\]"):
        load_base(str(embedded_path), "nf4")
