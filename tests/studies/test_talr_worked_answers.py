"""Experiment E4's runner (issue 37) on the embedded toy: the regime statistics against a hand computation, and the
whole pipeline (MedCalc-style domain, best-epoch checkpoints, the dev rule over calculator sets and learning rates,
E2's statistics) against the stored per-item scores."""

import dataclasses
import json

import numpy as np
import pytest
from test_talr_vs_sft import toy_tasks

pytest.importorskip("medcalc")


def toy_config(tmp_path, embedded_path, **kw):
    from studies.talr_worked_answers import E4Config

    paths = toy_tasks(tmp_path)
    e2 = tmp_path / "e2_domain.jsonl"  # stands in for hyperbaton: E2's pool starts after its 600 dev/test items
    e2.write_text("".join(json.dumps({"input": f"question : capital of item {i} ? answer :",
                                      "choices": ["paris", "rome"], "label": i % 2}) + "\n" for i in range(640)))
    settings = dict(out=str(tmp_path / "e4"), model=str(embedded_path),
                    calculator_sets=["bmi,mean_arterial_pressure", "mean_arterial_pressure"],
                    train_per_calculator=[8, 8], dev_per_calculator=4, test_per_calculator=6,
                    general_tasks=[str(paths["capitals"]), str(paths["opposites"])], n_general_dev=8,
                    n_general_test=16, learning_rates=[1e-3, 3e-3], seeds=[0, 1], batch_size=8, max_length=256,
                    max_new_tokens_factor=0.1, e2_domain=str(e2), e2_train_rows=16, eval_batch_size=8)
    return E4Config(**{**settings, **kw})


def test_token_regime_against_a_hand_computation(embedded_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from studies.talr_worked_answers import token_regime

    model = AutoModelForCausalLM.from_pretrained(embedded_path).eval()
    tok = AutoTokenizer.from_pretrained(embedded_path)
    rows = [{"prompt": "the capital of france is", "completion": " paris"},
            {"prompt": "question : opposite of hot ? answer :", "completion": " cold and the capital of spain is madrid"}]
    out = token_regime(model, tok, rows)
    nll, probs = [], []
    for r in rows:  # each row alone, no padding
        prompt = tok(r["prompt"])["input_ids"]
        target = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = torch.tensor([prompt + target])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        row = [-float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(target)]
        nll.append(np.array(row))
        probs += list(np.exp(-np.array(row)))
    tau = np.median([x.mean() for x in nll])
    assert out["n_tokens"] == len(probs) == sum(r["tokens"] for r in out["rows"])
    assert out["p_median"] == pytest.approx(np.median(probs), rel=1e-4)
    assert out["share_p_above_0.9"] == pytest.approx(np.mean(np.array(probs) > 0.9))
    assert sum(out["p_histogram"]) == len(probs)
    for x, r in zip(nll, out["rows"]):
        w = np.sort(np.maximum(np.exp(-x / tau), 0.01))
        k = max(1, int(np.ceil(0.1 * len(w))))
        assert r["low_decile_weight_share"] == pytest.approx(w[:k].sum() / w.sum(), rel=1e-4)
        assert (r["w_min"], r["w_max"]) == (pytest.approx(w[0], rel=1e-4), pytest.approx(w[-1], rel=1e-4))


def test_pipeline_checkpoints_dev_rule_and_report(tmp_path, embedded_path):
    from adaptguard.compat.stats.metrics import paired_seeds_difference
    from studies import talr_worked_answers as e4m

    cfg = toy_config(tmp_path, embedded_path)
    report = e4m.E4(cfg, say=lambda _: None).run_test()
    out = tmp_path / "e4"
    choices = json.loads((out / "dev_choices.json").read_text())
    base = {}
    for spec, seen in choices["sets"].items():
        index = cfg.calculator_sets.index(spec)
        base[index] = json.loads((out / "scores" / "dev" / "domain" / f"base_set{index}" / "scores.json").read_text())
        assert seen["base_domain_acc"] == pytest.approx(np.mean(base[index]["correct"]))
        for lr_key, row in seen["lrs"].items():
            run = out / "models" / f"SFT_lr{float(lr_key):g}_seed0_set{index}"
            epochs = json.loads((run / "epochs.json").read_text())
            # the kept checkpoint is the best on domain dev (tie: the earlier), recomputed from the stored scores
            dev = {e: json.loads((out / "scores" / "dev" / "domain" / f"SFT_lr{float(lr_key):g}_seed0_set{index}_epoch{e}"
                                  / "scores.json").read_text())["correct"] for e in (1, 2)}
            assert epochs["chosen"] == max((1, 2), key=lambda e: (np.mean(dev[e]), -e))
            assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["model"]  # the other epoch is not kept
            gain = paired_seeds_difference([dev[epochs["chosen"]]], [base[index]["correct"]], n_boot=4000)
            assert row["domain_acc"] == pytest.approx(np.mean(dev[epochs["chosen"]]))
            assert row["qualifies"] == bool(gain["ci"][0] > 0 and row["general_nfr"] >= cfg.min_nfr)
    # generated grouped by calculator, stored in row order: each row's answer is its own prompt's
    from transformers import AutoModelForCausalLM

    from adaptguard.utils.generation import generate_answers

    runner = e4m.E4(cfg, say=lambda _: None)
    rows = runner.domain(0)["dev"]
    grouped = [i for calc in sorted({r["calculator"] for r in rows}) for i, r in enumerate(rows)
               if r["calculator"] == calc]
    assert grouped != list(range(len(rows)))  # the rows are interleaved: the order is really restored
    preds, finished = generate_answers(AutoModelForCausalLM.from_pretrained(embedded_path), runner.tokenizer,
                                       [rows[i] for i in grouped], runner.max_new_tokens(0),
                                       cfg.generation_batch_size, stop_strings=["Patient note:"], with_finished=True)
    assert [base[0]["pred"][i] for i in grouped] == preds and [base[0]["finished"][i] for i in grouped] == finished
    # the walk stops at the first qualifying (set, lr); with none, both sets and every lr were tried
    tried = [(s, lr) for s, seen in choices["sets"].items() for lr in seen["lrs"]]
    if choices["set"] is None:
        assert len(tried) == 4 and "no setting" in report["verdict"]
    else:
        assert tried[-1] == (choices["calculators"], f"{choices['learning_rates'][0]:g}")
        assert all(not choices["sets"][s]["lrs"][lr]["qualifies"] for s, lr in tried[:-1])
        index = choices["set"]
        lr = choices["learning_rates"][0]
        # the report's SFT domain accuracy is the stored test scores' mean over the seeds
        sft = next(a for a in report["arms"] if a["arm"] == "SFT")
        stored = [json.loads((out / "scores" / "test" / "domain" / f"SFT_lr{lr:g}_seed{s}_set{index}" / "scores.json")
                             .read_text())["correct"] for s in cfg.seeds]
        assert sft["domain_acc"] == pytest.approx(np.mean(stored))
        ended = [json.loads((out / "scores" / "test" / "domain" / f"SFT_lr{lr:g}_seed{s}_set{index}" / "scores.json")
                            .read_text())["finished"] for s in cfg.seeds]
        assert report["domain_finished"][f"SFT {lr:g}"] == pytest.approx(np.mean(ended))
        assert {c["arm"] for c in report["comparisons"]} == {"TALR", "DFT"}
        assert (out / "tradeoff.png").stat().st_size > 0
    assert set(report["regime"]) == {"E4", "E2"} and report["regime"]["E2"]["median_tokens_per_row"] >= 1
    assert (out / "regime.png").stat().st_size > 0 and "## The regime" in (out / "report.md").read_text()
    # the report shows every tried dev setting with its verdict, whichever way the walk ended
    table = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]
    for spec, lr in tried:
        mark = "yes" if choices["sets"][spec]["lrs"][lr]["qualifies"] else "no"
        assert sum(line.startswith(f"| {spec} | {lr} |") and line.endswith(f"| {mark} |") for line in table) == 1
    # a re-run trains and scores nothing; it exports the small records (after each step, and at the end)
    steps = {p: p.stat().st_mtime_ns for p in out.rglob("done.json")}
    again = e4m.E4(cfg, say=lambda _: None)
    again.export_to = tmp_path / "records"
    again.run_test()
    assert {p: p.stat().st_mtime_ns for p in out.rglob("done.json")} == steps
    # the records alone (no weights), as a new machine gets them from git, resume the study without training
    assert not list((tmp_path / "records").rglob("*.safetensors"))
    resumed = e4m.E4(dataclasses.replace(cfg, out=str(tmp_path / "records")), say=lambda _: None).run_test()
    assert not list((tmp_path / "records").rglob("*.safetensors"))  # no run was trained again
    assert resumed["dev_choices"] == report["dev_choices"] and resumed.get("comparisons") == report.get("comparisons")


def test_bad_config_names_the_field(tmp_path, embedded_path):
    from studies.talr_worked_answers import E4

    with pytest.raises(ValueError, match=r"train_per_calculator \(\[8\]\) needs one size per calculator set"):
        E4(toy_config(tmp_path, embedded_path, train_per_calculator=[8]))
    with pytest.raises(ValueError, match="epochs must be a whole number"):
        E4(toy_config(tmp_path, embedded_path, epochs=1.5))


def test_report_without_a_qualifying_setting_shows_the_dev_walk_and_the_verdict():
    from studies.talr_worked_answers import E4Config, markdown

    q = {"domain_acc": 0.5, "domain_gain": 0.5, "domain_gain_ci": (0.402, 0.598), "general_nfr": 11 / 300,
         "general_pfr": 0.04, "qualifies": False}
    regime = {"n_tokens": 10, "median_tokens_per_row": 2, "p_median": 0.5, "share_p_above_0.9": 0.1,
              "share_p_below_0.1": 0.2, "median_low_decile_weight_share": 0.01}
    report = {"config": dataclasses.asdict(E4Config()), "regime": {"E4": regime, "E2": regime},
              "dev_choices": {"seed": 0, "set": None, "learning_rates": [],
                              "sets": {"centor,bmi": {"base_domain_acc": 0.0, "lrs": {"3e-05": q}}}},
              "verdict": "no setting where SFT both learns the domain and forgets on dev"}
    text = markdown(report)
    assert "Dev choice: none (no setting qualified); seeds [0, 1, 2]" in text
    assert "| centor,bmi | 3e-05 | 0.500 (0.000) | +50.0 (+40.2 to +59.8) | 3.7% | 4.0% | no |" in text
    assert text.rstrip().endswith(report["verdict"])
