"""Experiment E2's runner (issue 29) on the embedded toy: the registered statistics against hand counts, the dev rule
against the stored dev scores, the test stage resuming after a kill, and bad input."""

import json

import numpy as np
import pytest


def _two_choice(rows):
    """{input, choices, label} rows from (prompt, right, wrong) triples, the right choice first on odd rows."""
    out = []
    for i, (prompt, right, wrong) in enumerate(rows):
        choices = [right, wrong] if i % 2 else [wrong, right]
        out.append({"input": prompt, "choices": choices, "label": choices.index(right)})
    return out


def toy_tasks(tmp_path):
    """The domain: the toy's facts and antonyms in a question format; general: the same knowledge in the format the
    toy was pretrained on (two JSONL tasks)."""
    from adaptguard.models.embedded import ANTONYMS, EMBEDDED_MODELS, world_facts

    facts = world_facts(EMBEDDED_MODELS["tiny"])
    pairs = [*ANTONYMS, *[(b, a) for a, b in ANTONYMS]]
    tasks = {
        "domain": _two_choice([(f"question : capital of {c} ? answer :", city, facts[(i + 1) % len(facts)][1])
                               for i, (c, city) in enumerate(facts)]
                              + [(f"question : opposite of {a} ? answer :", b, pairs[(i + 1) % len(pairs)][1])
                                 for i, (a, b) in enumerate(pairs)]),
        "capitals": _two_choice([(f"the capital of {c} is", city, facts[(i + 3) % len(facts)][1])
                                 for i, (c, city) in enumerate(facts)]),
        "opposites": _two_choice([(f"the opposite of {a} is", b, pairs[(i + 5) % len(pairs)][1])
                                  for i, (a, b) in enumerate(pairs)]),
    }
    paths = {}
    for name, rows in tasks.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def toy_config(tmp_path, embedded_path, **kw):
    from studies.talr_vs_sft import E2Config

    paths = toy_tasks(tmp_path)  # 60 domain rows, 24 capitals, 36 opposites
    settings = dict(out=str(tmp_path / "e2"), model=str(embedded_path), domain=str(paths["domain"]),
                    general_tasks=[str(paths["capitals"]), str(paths["opposites"])], n_domain_dev=12,
                    n_domain_test=16, train_sizes=[16, 32], n_general_dev=8, n_general_test=16,
                    learning_rates=[1e-3, 3e-3], seeds=[0, 1], batch_size=8, max_length=32, eval_batch_size=8)
    return E2Config(**{**settings, **kw})


def test_summary_against_hand_counts():
    from studies.talr_vs_sft import E2Config, summarise, tradeoff_verdict

    base = {"domain": [False, False, True, False], "g": [True, True, True, False]}
    runs = {("SFT", 1e-4): [{"domain": [True, True, True, False], "g": [False, False, True, False]},
                            {"domain": [True, False, True, False], "g": [False, True, True, True]}],
            ("TALR", 1e-4): [{"domain": [True, True, False, False], "g": [True, True, True, False]},
                             {"domain": [True, False, True, True], "g": [False, True, True, False]}]}
    out = summarise(base, runs, ["g"], E2Config())
    assert out["base"] == {"domain_acc": 0.25, "general_acc": 0.75, "general_tasks": {"g": 0.75}}
    sft, talr = out["arms"]
    assert (sft["arm"], talr["arm"]) == ("SFT", "TALR")
    assert sft["domain_acc"] == pytest.approx(5 / 8) and sft["general_acc"] == pytest.approx(4 / 8)
    # SFT's negative flips against the base: seed 0 items 0, 1; seed 1 item 0 -> 3 of 8; positive: seed 1 item 3
    assert sft["general_nfr"] == pytest.approx(3 / 8) and sft["general_pfr"] == pytest.approx(1 / 8)
    assert [s["general_nfr"] for s in sft["per_seed"]] == [pytest.approx(0.5), pytest.approx(0.25)]
    assert talr["general_nfr"] == pytest.approx(1 / 8)
    (cmp,) = out["comparisons"]
    # per item, mean over seeds, TALR − SFT negative flips: [(0+1)-(1+1), (0+0)-(1+0), 0, 0] / 2 = [-0.5, -0.5, 0, 0]
    assert cmp["general_nfr"]["diff"] == pytest.approx(-0.25)
    assert [s["n_a_only"] for s in cmp["general_nfr"]["per_seed"]] == [0, 0]
    assert [s["n_b_only"] for s in cmp["general_nfr"]["per_seed"]] == [2, 0]
    assert cmp["domain_acc"]["diff"] == pytest.approx(5 / 8 - 5 / 8)
    lo, hi = cmp["general_nfr"]["ci"]
    assert lo <= -0.25 <= hi
    # the bootstrap's 97.5 % point is 0 (all four draws from the two 0 items: p = 1/16): the CI holds 0, wide
    assert hi == 0 and cmp["h1_less_forgetting"] == "inconclusive"
    assert [tradeoff_verdict("reproduced", (-0.04, 0.1), 0.05), tradeoff_verdict("reproduced", (-0.2, 0.1), 0.05),
            tradeoff_verdict("reproduced", (-0.3, -0.06), 0.05), tradeoff_verdict("not reproduced", (0, 0.1), 0.05),
            tradeoff_verdict("contradicted", (0, 0.1), 0.05), tradeoff_verdict("inconclusive", (-0.1, 0.1), 0.05)] \
        == ["reproduced", "inconclusive", "not reproduced", "not reproduced", "not reproduced", "inconclusive"]


def test_dev_rule_follows_the_stored_dev_scores(tmp_path, embedded_path):
    from adaptguard.compat.stats.metrics import paired_seeds_difference
    from studies.talr_vs_sft import E2

    cfg = toy_config(tmp_path, embedded_path, min_nfr=0.1)
    choices = E2(cfg, say=lambda _: None).dev_stage()
    out = tmp_path / "e2"
    assert not (out / "scores" / "test").exists()  # the dev stage reads no test item
    assert json.loads((out / "dev_choices.json").read_text()) == json.loads(json.dumps(choices))
    base = json.loads((out / "scores" / "dev" / "base" / "scores.json").read_text())
    assert set(base) == {"domain", "capitals", "opposites"} and len(base["capitals"]) == 8
    for n_train, seen in choices["sizes"].items():
        for lr, rec in seen.items():
            sft = json.loads((out / "scores" / "dev" / f"SFT_lr{lr}_seed0_n{n_train}" / "scores.json").read_text())
            old = np.concatenate([base["capitals"], base["opposites"]])
            new = np.concatenate([sft["capitals"], sft["opposites"]])
            nfr = float(np.mean(old & ~new))
            ci = paired_seeds_difference([sft["domain"]], [base["domain"]], n_boot=4000)["ci"]
            assert rec["general_nfr"] == pytest.approx(nfr) and list(rec["domain_gain_ci"]) == pytest.approx(list(ci))
            assert rec["qualifies"] == (ci[0] > 0 and nfr >= 0.1)
    qualifying = [float(lr) for lr, rec in choices["sizes"][str(choices["n_train"])].items() if rec["qualifies"]] \
        if choices["n_train"] else []
    assert choices["learning_rates"] == qualifying[:cfg.max_lrs]
    # the fallback size is tried only when no rate qualified at the first one
    assert ("32" in choices["sizes"]) == (not any(r["qualifies"] for r in choices["sizes"]["16"].values()))


def test_test_stage_resumes_after_a_kill(tmp_path, embedded_path, monkeypatch):
    from studies import talr_vs_sft

    cfg = toy_config(tmp_path, embedded_path)
    # the dev rule's outcome on the toy depends on float noise; the test stage is checked at a fixed choice
    monkeypatch.setattr(talr_vs_sft.E2, "dev_stage", lambda self: {"n_train": 16, "learning_rates": [3e-3]})
    trained = []
    original = talr_vs_sft.fine_tune

    def counting(cfg, base_path, tokenizer, rows, out, arm, lr, seed):
        trained.append((arm, lr, seed, len(rows)))
        if arm == "TALR" and seed == 1 and ("killed",) not in trained:
            trained.append(("killed",))
            raise KeyboardInterrupt  # a Ctrl-C in the middle of the test stage
        return original(cfg, base_path, tokenizer, rows, out, arm, lr, seed)

    monkeypatch.setattr(talr_vs_sft, "fine_tune", counting)
    with pytest.raises(KeyboardInterrupt):
        talr_vs_sft.E2(cfg, say=lambda _: None).run_test()
    assert not list((tmp_path / "e2").rglob("*.partial")) and not (tmp_path / "e2" / "report.json").exists()
    before = list(trained)
    report = talr_vs_sft.E2(cfg, say=lambda _: None).run_test()
    redone = trained[len(before):]
    assert redone[0] == ("TALR", 3e-3, 1, 16) and not set(redone) & set(before[:-2])
    assert len(set(before[:-1]) | set(redone)) == 3 * 2  # every arm x seed trained exactly once
    assert [(c["arm"], c["lr"]) for c in report["comparisons"]] == [("TALR", 3e-3), ("DFT", 3e-3)]
    for c in report["comparisons"]:
        assert c["h1_less_forgetting"] in ("reproduced", "contradicted", "not reproduced", "inconclusive")
        assert len(c["general_nfr"]["per_seed"]) == 2
    # the report's numbers are the stored per-item test scores
    sft = [json.loads((tmp_path / "e2" / "scores" / "test" / f"SFT_lr0.003_seed{s}_n16" / "scores.json").read_text())
           for s in (0, 1)]
    arm = next(a for a in report["arms"] if a["arm"] == "SFT")
    assert arm["domain_acc"] == pytest.approx(np.mean([s["domain"] for s in sft]))
    assert (tmp_path / "e2" / "tradeoff.png").stat().st_size > 0
    md = (tmp_path / "e2" / "report.md").read_text()
    for c in report["comparisons"]:
        assert f"| 0.003 | {c['arm']} | {c['general_nfr']['diff']:+.3f} " in md and c["h1_less_forgetting"] in md
    n = len(trained)
    again = talr_vs_sft.E2(cfg, say=lambda _: None).run_test()  # a third run trains and scores nothing
    assert len(trained) == n and json.loads(json.dumps(again["arms"])) == json.loads(json.dumps(report["arms"]))


def test_bad_input_names_the_field(tmp_path, embedded_path):
    from studies.talr_vs_sft import E2

    with pytest.raises(ValueError, match="general_tasks: .*capitals.jsonl has 24 items, the splits need 25"):
        E2(toy_config(tmp_path, embedded_path, n_general_dev=9), say=lambda _: None)
    with pytest.raises(ValueError, match="domain .*60 items, the splits need 61"):
        E2(toy_config(tmp_path, embedded_path, n_domain_test=17), say=lambda _: None)
    with pytest.raises(ValueError, match="domain: no such file"):
        E2(toy_config(tmp_path, embedded_path, domain=str(tmp_path / "missing.jsonl")), say=lambda _: None)
    with pytest.raises(ValueError, match="learning_rates must be positive"):
        E2(toy_config(tmp_path, embedded_path, learning_rates=[0.0]), say=lambda _: None)
