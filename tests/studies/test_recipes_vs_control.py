"""Experiment E3's runner (issue 36) on the embedded toy: the registered statistics against hand counts, the budget
rule, and the whole pipeline (U1 NF4 and U3 generative, five arms on a 2 × 2 grid) — every arm's setting by the
pick rule from the stored dev scores, dev choices before any test score, resuming after a kill."""

import json
from pathlib import Path

import numpy as np
import pytest
from test_real_update import toy_task

from studies.common import export_records


def generative_toy(tmp_path):
    """Capital questions answered by the city's name (generated, exact match)."""
    rows = [json.loads(x) for x in (tmp_path / "task.jsonl").read_text().splitlines()]
    path = tmp_path / "capitals.jsonl"
    path.write_text("".join(json.dumps({"input": r["input"], "target": r["choices"][r["label"]]}) + "\n"
                            for r in rows))
    return path, len(rows)


def toy_config(tmp_path, embedded_path, **kw):
    from studies.recipes_vs_control import E3Config

    task, n = toy_task(tmp_path, embedded_path)
    generative, _ = generative_toy(tmp_path)
    few = tmp_path / "few.jsonl"  # a candidate U3 with too few items: the rule passes over it
    few.write_text("".join(json.dumps({"input": f"{i} + 1 =", "target": str(i + 1)}) + "\n" for i in range(3)))
    third = n // 3
    return E3Config(out=str(tmp_path / "e3"), model=str(embedded_path), task=str(task), n_train=third, n_dev=third,
                    n_test=n - 2 * third, updates=["quantized", "generative"], task_lr=3e-3, continued=[3, 1e-3],
                    mix_tasks=[str(task)], mix_rows_per_task=8,
                    generative_tasks=[str(few), str(generative)],
                    generative_task_lrs=[3e-3], min_generative_items=n, min_v1_accuracy=0.0, min_nfr=0.0,
                    max_new_tokens=8, arm_rows=8, fallback_arm_rows=4, learning_rates=[1e-3, 3e-3], epochs=[1, 2],
                    seeds=[0, 1], batch_size=4, max_length=32, eval_batch_size=8, **kw)


def test_summary_against_hand_counts():
    from scipy.stats import binomtest

    from studies.recipes_vs_control import arm_summary

    v1 = [True, True, True, True, False, False]
    arms = {"kd": [[True, True, True, False, False, False], [True, True, True, True, True, False]],
            "control": [[False, False, True, True, False, False], [False, True, True, True, True, True]]}
    out = arm_summary(v1, arms)
    assert out["kd"]["nfr"] == pytest.approx(0.5 / 6) and out["control"]["nfr"] == pytest.approx(1.5 / 6)
    assert out["control"]["acc"] == pytest.approx(7 / 12) and out["kd"]["pfr"] == pytest.approx(0.5 / 6)
    vs = out["kd"]["vs_control"]
    # per item, mean over seeds: kd − control negative flips = [-1, -0.5, 0, 0.5, 0, 0]; accuracy [+1, +0.5, 0, -0.5, 0, -0.5]
    assert vs["delta_nfr"] == pytest.approx(-1 / 6) and vs["delta_acc"] == pytest.approx(0.5 / 6)
    assert vs["delta_nfr_ci"][0] <= vs["delta_nfr"] <= vs["delta_nfr_ci"][1]
    assert vs["mcnemar_p_per_seed"] == [pytest.approx(binomtest(1, 3).pvalue), pytest.approx(binomtest(0, 1).pvalue)]
    assert vs["verdict"] == "inconclusive" and vs["helps"] is False  # 6 items: a CI far wider than 5 points
    # many items with the same pattern: reproduced, and it helps only while accuracy is not given up
    many = {a: [list(np.repeat(s, 100)) for s in runs] for a, runs in arms.items()}
    vs = arm_summary(list(np.repeat(v1, 100)), many)["kd"]["vs_control"]
    assert vs["verdict"] == "reproduced" and vs["helps"] is True
    worse = {"kd": [[True] * 4 + [False] * 2] * 2, "control": [[False] + [True] * 5] * 2}
    vs = arm_summary(list(np.repeat(v1, 100)), {a: [list(np.repeat(s, 100)) for s in r] for a, r in worse.items()}
                     )["kd"]["vs_control"]
    assert vs["delta_nfr"] == pytest.approx(-1 / 6) and vs["delta_acc"] == pytest.approx(-1 / 6)
    assert vs["verdict"] == "reproduced" and vs["helps"] is False  # fewer flips only by losing accuracy


def test_the_budget_rule_is_decided_once_from_measured_costs(tmp_path, embedded_path):
    from studies.recipes_vs_control import E3

    cfg = toy_config(tmp_path, embedded_path, budget_hours=1e-9)  # any measured cost exceeds it
    e3 = E3(cfg, say=lambda _: None)
    assert e3.arm_rows() == 4
    budget = json.loads((tmp_path / "e3" / "e3" / "budget.json").read_text())
    # the projection from the two measured costs, by the registered formula
    c = cfg
    train = budget["v2_train_seconds"] / c.n_train * c.arm_rows * 2 * (2 * 5) * (1 + 0.5 * 4 / 5)
    assert budget["projected_hours"] == pytest.approx((train + budget["v2_dev_scoring_seconds"] * 20) / 3600)
    # decided once: a later run with a larger budget keeps it (arms already ran with it)
    assert E3(toy_config(tmp_path, embedded_path), say=lambda _: None).arm_rows() == 4


def test_pipeline_tunes_every_arm_alike_and_resumes_after_a_kill(tmp_path, embedded_path, monkeypatch):
    from adaptguard.update.candidates import pick_setting
    from studies import recipes_vs_control as rc

    # one learning rate: each arm's grid is then its two epoch counts (both kept from one run: what the rule and the
    # resume are checked on), half the trainings and scorings of the two-rate grid of `toy_config`
    cfg = rc.dataclasses.replace(toy_config(tmp_path, embedded_path), learning_rates=[3e-3])
    trained, reads = [], []
    original_train, original_scores = rc.E3._train, rc.GenerativeE1.scores

    def counting(self, e, kind, setting, arm, lr, seed, run_epochs, tmp):
        trained.append((e.common["task"], kind, arm, lr, seed, run_epochs))
        if arm == "focal" and kind == "quantized" and not any(t == "killed" for t in trained):
            trained.append("killed")
            raise KeyboardInterrupt  # a Ctrl-C in the middle of the U1 grid
        return original_train(self, e, kind, setting, arm, lr, seed, run_epochs, tmp)

    def watched(self, name, settings, split, model_fn):
        reads.append((split, (tmp_path / "e3" / "e3" / "dev_choices.json").exists()))
        return original_scores(self, name, settings, split, model_fn)

    monkeypatch.setattr(rc.E3, "_train", counting)
    monkeypatch.setattr(rc.GenerativeE1, "scores", watched)
    with pytest.raises(KeyboardInterrupt):
        rc.E3(cfg, say=lambda _: None).run("test")
    before = list(trained)
    assert not list((tmp_path / "e3").rglob("*.partial"))
    assert not (tmp_path / "e3" / "scores" / "test").exists()  # the kill came during U1's dev grid
    report = rc.E3(cfg, say=lambda _: None).run("test")
    redone = trained[len(before):]
    assert redone[0] == before[-2] and not set(redone) & set(before[:-2])  # nothing finished trained twice
    out = tmp_path / "e3"
    choices = json.loads((out / "e3" / "dev_choices.json").read_text())
    assert choices.keys() == {"quantized", "generative"}
    # U3: the first candidate has too few items → passed over with the rule's reason; the capitals task is chosen
    tried = choices["generative"]["chosen_by"]["tried"]
    assert tried[0]["task"].endswith("few.jsonl") and tried[0]["outcome"] == f"3 items < {cfg.min_generative_items}"
    assert choices["generative"]["kind"] == "quantized" and tried[1]["outcome"] == "chosen: quantized update nf4"
    assert all(after for split, after in reads if split == "test")  # U3's test items only after its dev choices
    for name, entry in choices.items():
        grid = entry["grid"]
        assert [(g["recipe"], g["learning_rate"], g["epochs"]) for g in grid] == [
            (a, lr, ep) for a in rc.ARMS for lr in sorted(cfg.learning_rates) for ep in (1, 2)]
        for arm, chosen in entry["chosen"].items():  # each arm's setting = the rule on the stored dev rows
            assert {k: chosen[k] for k in ("recipe", "learning_rate", "epochs")} == \
                {k: grid[pick_setting(grid, 0.01, arm)["chosen"]][k] for k in ("recipe", "learning_rate", "epochs")}
        u = report["updates"][name]
        # the report's numbers are the stored per-item test scores of each arm's chosen setting, found by the
        # settings each score was stored with
        task = cfg.task if name == "quantized" else entry["chosen_by"]["task"]
        stored = [(json.loads((p / "done.json").read_text()), json.loads((p / "scores.json").read_text()))
                  for p in (out if name == "quantized" else out / "e3" / "generative" / "capitals").joinpath(
                      "scores", "test").iterdir()]
        for arm, chosen in entry["chosen"].items():
            runs = {s["seed"]: v for s, v in stored if s.get("experiment") == "E3" and s["task"] == task and
                    s["arm"] == arm and s["arm_lr"] == chosen["learning_rate"] and s["epoch"] == chosen["epochs"]}
            assert sorted(runs) == [0, 1]
            assert u["arms"][arm]["acc"] == pytest.approx(np.mean([runs[0], runs[1]]))
            v1 = next(v for s, v in stored if s.get("step") is None and s["task"] == task and "arm" not in s
                      and s.get("lr") == (3e-3) and "quant_type" not in s and "continued" not in s)
            nfr = np.mean([[o and not n for o, n in zip(v1, runs[seed])] for seed in (0, 1)])
            assert u["arms"][arm]["nfr"] == pytest.approx(nfr)
        assert len(u["test_grid_seed0"]) == len(rc.ARMS) * len(cfg.learning_rates) * 2 and set(u["arms"]) == set(rc.ARMS)
    assert (out / "e3" / "report.md").exists() and (out / "e3" / "tradeoff.png").stat().st_size > 0
    md = (out / "e3" / "report.md").read_text()
    for u in report["updates"].values():
        vs = u["arms"]["kd"]["vs_control"]
        assert f"{vs['delta_nfr']:+.3f} ({vs['delta_nfr_ci'][0]:+.3f} to {vs['delta_nfr_ci'][1]:+.3f})" in md
    # the exported records (what a session commits) restore the dev choices elsewhere without training anything
    copy = tmp_path / "restored"
    assert export_records(out, copy) > 0 and not list(copy.rglob("*.safetensors"))
    (copy / "e3" / "dev_choices.json").unlink()  # recomputed from the restored per-item scores
    n = len(trained)
    restored = rc.E3(rc.dataclasses.replace(cfg, out=str(copy)), say=lambda _: None).run("dev")
    assert len(trained) == n and json.loads(json.dumps(restored, default=str)) == choices
    # a third run trains and scores nothing: no stored step is written again
    steps = {p: p.stat().st_mtime_ns for p in out.rglob("done.json")}
    n = len(trained)
    again = rc.E3(cfg, say=lambda _: None).run("test")
    assert len(trained) == n and {p: p.stat().st_mtime_ns for p in out.rglob("done.json")} == steps
    assert json.dumps(again["updates"], default=str) == json.dumps(report["updates"], default=str)


def test_u3_continued_fallback_uses_u2s_base(tmp_path, embedded_path):
    """Registered: U3's continued-training fallback is U2's base. The base is built once, in the multiple-choice
    store, and U3's steps (its own store) train their task adapter on that very folder."""
    from studies import recipes_vs_control as rc

    cfg = toy_config(tmp_path, embedded_path)
    e3 = rc.E3(cfg, say=lambda _: None)
    u3 = e3.generative(cfg.generative_tasks[1])
    path, quant, extra = u3.update_base("continued", list(cfg.continued))
    assert (path, quant, extra) == e3.multiple_choice().update_base("continued", list(cfg.continued))
    assert Path(path).parent == Path(cfg.out) and (Path(path) / "done.json").exists()
    assert not list((Path(cfg.out) / "e3" / "generative").rglob("continued_base_*"))
    assert u3.update_base("quantized", "nf4")[1] == "nf4"  # the quantized update is untouched


def test_u3_items_longer_than_max_length_are_left_out_of_every_split(tmp_path, embedded_path):
    """Amendment 2026-11-26: a U3 candidate's items are those whose prompt + answer fit `max_length`, counted as
    SFTTrainer tokenizes them (checked against TRL's own untruncated tokenization); the item gate counts what is
    kept, and only a candidate that lost items gets a store key of its own."""
    import dataclasses

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from studies import recipes_vs_control as rc
    from studies.common import training_rows

    cfg = toy_config(tmp_path, embedded_path)
    capitals = [json.loads(x) for x in Path(cfg.generative_tasks[1]).read_text().splitlines()]
    padding = " ".join(["the capital question"] * 10)
    longer = [{**r, "input": f"{padding} {r['input']}" if i % 3 == 0 else r["input"]} for i, r in enumerate(capitals)]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in longer))
    cfg = dataclasses.replace(cfg, generative_tasks=[str(path)])

    rows = rc.generative_rows(str(path))
    tokenizer = AutoTokenizer.from_pretrained(embedded_path)
    trl = SFTTrainer(model=str(embedded_path), processing_class=tokenizer,
                     args=SFTConfig(output_dir=str(tmp_path / "trl"), max_length=None, report_to="none", bf16=False,
                                   use_cpu=True),
                     train_dataset=Dataset.from_list(training_rows(rows)))
    lengths = [len(x) for x in trl.train_dataset["input_ids"]]
    expected = [n <= cfg.max_length for n in lengths]
    assert any(expected) and not all(expected)  # the toy holds both kinds
    assert rc.fits_max_length(rows, tokenizer, cfg.max_length) == expected

    e3 = rc.E3(cfg, say=lambda _: None)
    kept, total = e3.generative_items(str(path))
    assert total == len(rows) and kept == [r for r, ok in zip(rows, expected) if ok]
    tried = e3.choose_generative()["tried"]  # fewer kept items than the gate asks: passed over, nothing trained
    assert tried == [{"task": str(path), "items": len(kept), "items_in_source": len(rows),
                      "outcome": f"{len(kept)} items < {cfg.min_generative_items}"}]
    assert not (Path(cfg.out) / "e3" / "generative").exists() or not list(
        (Path(cfg.out) / "e3" / "generative").rglob("done.json"))

    third = len(kept) // 3
    e3 = rc.E3(dataclasses.replace(cfg, n_train=third, n_dev=third, n_test=len(kept) - 2 * third), say=lambda _: None)
    split = e3.generative(str(path))
    inputs = [r["input"] for part in split.rows.values() for r in part]
    assert sorted(inputs) == sorted(r["input"] for r in kept)
    assert split.common["items"] == f"prompt + answer <= {cfg.max_length} tokens"
    assert "items" not in e3.generative(str(generative_toy(tmp_path)[0])).common  # every item fits: key unchanged


def test_the_records_keys_keep_smollm2s_stored_name():
    """SmolLM2 is `built:smollm2` now, and E3/E5's runs were stored under `embedded:smollm2`: the default config
    still reaches them (each committed score's folder hash recomputes from its settings, the model among them), so
    the runs resume and the records recompute."""
    from studies.common import store_model_name
    from studies.real_update import _key
    from studies.recipes_vs_control import E3Config

    markers = sorted((Path(__file__).parents[2] / "studies" / "results").glob("e[35]_records/scores/*/e3_*/done.json"))
    assert len(markers) >= 100
    assert E3Config().model == "built:smollm2"
    for marker in markers:
        settings = json.loads(marker.read_text())
        assert settings["model"] == store_model_name(E3Config().model), marker
        assert marker.parent.name.endswith(_key({k: v for k, v in settings.items() if k != "split"})), marker
