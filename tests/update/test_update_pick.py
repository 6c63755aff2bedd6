"""`adaptguard update` with a dev split (issue 35): every candidate trained and scored on dev, the pick by the
registered rule at matched accuracy (recomputed here from the stored per-item scores), no test item read before the
pick, resuming after a kill, the shipped adapter, and bad input refused before anything is written."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from in_process import run_cli

CANDIDATES = [{"recipe": "control", "learning_rate": [2e-3], "epochs": [1, 2]},
              {"recipe": "focal", "learning_rate": [2e-3], "epochs": [1, 2], "distill_weight": [1.0]},
              {"recipe": "kd", "learning_rate": [2e-3], "epochs": [1, 2]}]


def toy_config(tmp_path, **kw):
    """tiny → tiny-v2 on the preset task, its test rows split into dev and test; short trainings (no rate is
    asserted, only the mechanics and the numbers' provenance)."""
    from adaptguard.update import tiny_preset

    cfg = tiny_preset(str(tmp_path / "out"))
    rows = cfg.test
    cfg.task_epochs, cfg.dev, cfg.test, cfg.candidates = 2, rows[:40], rows[40:80], CANDIDATES
    for key, value in kw.items():
        setattr(cfg, key, value)
    return cfg


@pytest.fixture(scope="module")
def task_adapters(tmp_path_factory, embedded_path):
    """The toy's v1 and v2 task adapters, trained once for the module (the driver's part of a run, the same in every
    toy run: their training settings and rows do not depend on the candidates or seeds); each run reuses them."""
    from adaptguard.update.pick import Pick

    root = tmp_path_factory.mktemp("task_adapters")
    Pick(toy_config(root)).prepare()
    return root / "out"


def with_task_adapters(adapters: Path, cfg) -> None:
    """`cfg`'s output folder holding the module's task adapters (found by their marker, reused by the run)."""
    for name in ("v1_task_adapter", "v2_task_adapter"):
        shutil.copytree(adapters / name, Path(cfg.output_dir) / name)


def stored_scores(out: Path, split: str) -> dict[str, list[bool]]:
    """{model name: per-item correctness} of every stored score step of a split."""
    found = {}
    for done in (out / "steps").glob(f"score_{split}_*/done.json"):
        found[json.loads(done.read_text())["model"]] = json.loads((done.parent / "scores.json").read_text())["correct"]
    return found


def rule_by_hand(rows: list[tuple[str, str, float, float]], drop: float) -> tuple[str, str]:
    """(pick, best control) labels from (label, recipe, accuracy, NFR) rows, by the rule as registered."""
    controls = [r for r in rows if r[1] == "control"]
    best = max(controls, key=lambda r: (r[2], -r[3], -rows.index(r)))
    eligible = [r for r in rows if r[2] >= best[2] - drop - 1e-12]
    lowest = min(r[3] for r in eligible)
    tied = [r for r in eligible if r[3] == lowest]
    top = max(r[2] for r in tied)
    tied = [r for r in tied if r[2] == top]
    return ([r for r in tied if r[1] == "control"] or tied)[0][0], best[0]


def test_pick_by_the_rule_no_test_item_first_and_resume_after_a_kill(tmp_path, task_adapters, monkeypatch):
    from adaptguard.update import pick as pick_module
    from adaptguard.update import run_update

    cfg = toy_config(tmp_path, test_seeds=[0, 1])
    with_task_adapters(task_adapters, cfg)
    out = tmp_path / "out"
    test_prompts = {r["prompt"] for r in cfg.test}
    reads = []
    real_generate = pick_module.generate_answers

    def spy(model, tokenizer, rows, *args, **kwargs):
        reads.append((bool({r["prompt"] for r in rows} & test_prompts), (out / "dev_choices.json").exists()))
        return real_generate(model, tokenizer, rows, *args, **kwargs)

    trained = []
    real_train = pick_module.Pick._train

    def train(self, setting, seed, *args):
        trained.append((setting.recipe, seed))
        if setting.recipe == "focal" and ("killed", 0) not in trained:
            trained.append(("killed", 0))
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of the second run
        return real_train(self, setting, seed, *args)

    monkeypatch.setattr(pick_module, "generate_answers", spy)
    monkeypatch.setattr(pick_module.Pick, "_train", train)
    with pytest.raises(KeyboardInterrupt):
        run_update(cfg)
    assert not list(out.rglob("*.partial")) and not (out / "dev_choices.json").exists()
    before = len(trained)
    report = run_update(cfg)
    redone = trained[before:]
    assert redone[0] == ("focal", 0) and ("control", 0) not in redone  # the finished run is reused
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report, default=str))

    # no test item was read before the pick was written
    assert all(choices_written for is_test, choices_written in reads if is_test)
    assert any(is_test for is_test, _ in reads)

    # the pick is the rule's, recomputed from the stored per-item dev scores
    dev = stored_scores(out, "dev")
    v1 = dev["v1"]
    rows = []
    for row in report["dev"]["settings"]:
        correct = dev[f"{row['label']} seed 0"]
        acc = sum(correct) / len(correct)
        nfr = sum(o and not c for o, c in zip(v1, correct)) / len(correct)
        assert (row["acc"], row["nfr"]) == (pytest.approx(acc), pytest.approx(nfr))
        rows.append((row["label"], row["recipe"], acc, nfr))
    assert len(rows) == 6  # 3 recipes x 2 epochs
    pick, best_control = rule_by_hand(rows, cfg.max_accuracy_drop)
    assert report["dev"]["chosen_setting"]["label"] == pick
    assert report["dev"]["best_control_setting"]["label"] == best_control
    assert json.loads((out / "dev_choices.json").read_text())["chosen_setting"]["label"] == pick

    # the test stage: each arm's numbers are its stored test scores, over both seeds
    test = stored_scores(out, "test")
    v1_test = test["v1"]
    arms = {"control": best_control, **({"pick": pick} if pick != best_control else {})}
    for arm, label in arms.items():
        per_seed = [test[f"{label} seed {s}"] for s in (0, 1)]
        acc = sum(sum(c) / len(c) for c in per_seed) / 2
        nfr = sum(sum(o and not c for o, c in zip(v1_test, cs)) / len(cs) for cs in per_seed) / 2
        assert report["test"]["arms"][arm]["new_acc"] == pytest.approx(acc)
        assert report["test"]["arms"][arm]["nfr"] == pytest.approx(nfr)
    # the noise floor: the control's answers that flip right → wrong between its own two seeds, both directions
    c0, c1 = (test[f"{best_control} seed {s}"] for s in (0, 1))
    floor = sum((a and not b) + (b and not a) for a, b in zip(c0, c1)) / (2 * len(c0))
    assert report["test"]["control_noise_floor"] == pytest.approx(floor)
    assert f"flips {100 * floor:.1f} % of the items right → wrong" in report["verdict"]
    assert ("verdict" in report) and report["verdict"].startswith("ship ")
    assert report["verdict"] in (out / "report.md").read_text()
    assert (out / "dev_tradeoff.png").stat().st_size > 5000

    # the shipped adapter is the pick's, seed 0, at its epoch
    choice = json.loads((out / "chosen" / "adaptguard_choice.json").read_text())
    assert choice["setting"] == {k: v for k, v in report["dev"]["chosen_setting"].items()
                                 if k not in ("label", "acc", "nfr", "pfr", "btc", "seeds")}
    runs = [d for d in (out / "steps").glob(f"run_{choice['setting']['recipe']}_*")
            if json.loads((d / "done.json").read_text())["seed"] == 0]
    shipped = (out / "chosen" / "adapter_model.safetensors").read_bytes()
    assert shipped in [(d / f"epoch-{choice['setting']['epochs']}" / "adapter_model.safetensors").read_bytes()
                       for d in runs]

    # a third run trains and scores nothing
    n_trained, n_reads = len(trained), len(reads)
    again = run_update(cfg)
    assert (len(trained), len(reads)) == (n_trained, n_reads) and again["verdict"] == report["verdict"]


def test_dev_seeds_average_each_setting_over_seeds(tmp_path, task_adapters):
    """`dev_seeds` 2: every setting's dev accuracy and NFR are the means of its two seeds' stored scores."""
    from adaptguard.update import run_update

    cfg = toy_config(tmp_path, candidates=[{"recipe": "control", "learning_rate": [2e-3], "epochs": [1]},
                                           {"recipe": "kd", "learning_rate": [2e-3], "epochs": [1]}], dev_seeds=2)
    with_task_adapters(task_adapters, cfg)
    report = run_update(cfg)
    dev = stored_scores(tmp_path / "out", "dev")
    assert report["dev"]["dev_seeds"] == [0, 1] and "means over 2 seeds" in report["dev"]["rule"]
    for row in report["dev"]["settings"]:
        runs = [dev[f"{row['label']} seed {s}"] for s in (0, 1)]
        acc = sum(sum(r) / len(r) for r in runs) / 2
        nfr = sum(sum(o and not c for o, c in zip(dev["v1"], r)) / len(r) for r in runs) / 2
        assert (row["acc"], row["nfr"], row["seeds"]) == (pytest.approx(acc), pytest.approx(nfr), 2)
    assert "Seed noise was not measured (one test seed)" in report["verdict"]
    # report.html: the verdict first, and the rows of the flipped items are the shipped adapter's flips against v1
    from page_rows import Rows

    page = (tmp_path / "out" / "report.html").read_text()
    assert page.index(report["verdict"].split(":")[0]) < page.index('id="flips"')
    test = stored_scores(tmp_path / "out", "test")
    shipped = test[f"{report['dev']['chosen_setting']['label']} seed 0"]
    want = {("test", i, "broke" if o else "fixed") for i, (o, n) in enumerate(zip(test["v1"], shipped)) if o != n}
    rows = Rows()
    rows.feed(page)
    assert set(rows.rows) == want and all(link.startswith("data:image/png") for link in rows.links)


def test_the_sentence_says_when_the_control_was_the_only_candidate():
    """With the default candidates (the control alone since E5) the sentence must not claim that a recipe lost."""
    from adaptguard.update.pick_report import verdict

    control = {"recipe": "control", "label": "control (lr 0.002, 1 epoch)", "acc": 0.8, "nfr": 0.1}
    focal = {"recipe": "focal", "label": "focal (lr 0.002, 1 epoch)", "acc": 0.7, "nfr": 0.05}
    test = {"arms": {"control": {"nfr": 0.125, "new_acc": 0.75}}, "pick_vs_control": None, "seeds": [0]}
    alone = verdict({"chosen_setting": control, "best_control_setting": control, "settings": [control]}, test)
    assert alone.status is None  # nothing was tested against a control
    alone = alone.sentence
    assert alone.startswith("ship the control (lr 0.002, 1 epoch): no other recipe was a candidate (name them in "
                            "`candidates`") and "no recipe beat it" not in alone
    assert "on test its NFR is 0.125 at accuracy 0.750." in alone
    both = verdict({"chosen_setting": control, "best_control_setting": control, "settings": [control, focal]},
                   test).sentence
    assert "no recipe beat it on dev (lowest dev NFR among the others: focal (lr 0.002, 1 epoch), 0.050 at dev " \
           "accuracy 0.700)" in both


def test_the_rule_compares_at_matched_accuracy():
    """A recipe with fewer flips wins only within max_accuracy_drop of the best control's dev accuracy."""
    from adaptguard.update.candidates import pick_setting

    rows = [{"recipe": "control", "acc": 0.80, "nfr": 0.10}, {"recipe": "control", "acc": 0.70, "nfr": 0.02},
            {"recipe": "focal", "acc": 0.795, "nfr": 0.06}, {"recipe": "kd", "acc": 0.60, "nfr": 0.00}]
    assert pick_setting(rows, 0.01) == {"chosen": 2, "best_control": 0, "accuracy_floor": pytest.approx(0.79),
                                        "matched": True}
    assert pick_setting(rows, 0.0)["chosen"] == 0  # focal is 0.5 points below the control: not eligible
    assert pick_setting(rows, 0.25)["chosen"] == 3
    tie = [{"recipe": "focal", "acc": 0.8, "nfr": 0.1}, {"recipe": "control", "acc": 0.8, "nfr": 0.1}]
    assert pick_setting(tie, 0.01)["chosen"] == 1  # a tie goes to the control


def test_the_rule_per_recipe_tunes_each_arm_alike():
    """E3's use: each arm's own setting by the same floor; the control's arm is chosen by the rule too."""
    from adaptguard.update.candidates import pick_setting

    rows = [{"recipe": "control", "acc": 0.80, "nfr": 0.10}, {"recipe": "control", "acc": 0.795, "nfr": 0.05},
            {"recipe": "kd", "acc": 0.60, "nfr": 0.00}, {"recipe": "kd", "acc": 0.70, "nfr": 0.01},
            {"recipe": "focal", "acc": 0.79, "nfr": 0.04}, {"recipe": "focal", "acc": 0.79, "nfr": 0.04},
            {"recipe": "focal", "acc": 0.95, "nfr": 0.04}]
    assert pick_setting(rows, 0.01, "control") == {"chosen": 1, "best_control": 0,
                                                   "accuracy_floor": pytest.approx(0.79), "matched": True}
    # no kd setting reaches the floor: its most accurate one, flagged
    assert (pick_setting(rows, 0.01, "kd")["chosen"], pick_setting(rows, 0.01, "kd")["matched"]) == (3, False)
    assert pick_setting(rows, 0.01, "focal")["chosen"] == 6  # equal NFR: the higher accuracy
    rows[6]["acc"] = 0.79
    assert pick_setting(rows, 0.01, "focal")["chosen"] == 4  # a full tie: the earlier row (smaller lr, fewer epochs)
    with pytest.raises(ValueError, match="no row of recipe 'muscle'"):
        pick_setting(rows, 0.01, "muscle")


@pytest.mark.parametrize("change, error", [
    (dict(candidates=[{"recipe": "focl", "learning_rate": 1e-3, "epochs": 1}]),
     r"Unknown update recipe 'focl'; known recipes: control, focal, kd, ll_l, ll_l_ce, muscle, muscle_ce"),
    (dict(candidates=[{"recipe": "focal", "learning_rate": 1e-3, "epochs": 1}]), r"no 'control' candidate"),
    (dict(candidates=[{"recipe": "control", "learning_rate": [1e-3], "epochs": [1]},
                      {"recipe": "kd", "learning_rate": [1e-3, 3e-3], "epochs": [1]}]),
     r"candidates\[1\] \(kd\): learning_rate \[0.001, 0.003\] differs from the control's \[0.001\]"),
    (dict(candidates=[{"recipe": "control", "learning_rate": 1e-3, "epochs": 1, "distill_weight": 1}]),
     r"candidates\[0\] \(control\): unknown keys \['distill_weight'\]"),
    (dict(candidates=[{"recipe": "control", "learning_rate": 1e-3, "epochs": 1.5}]), r"epochs: whole numbers"),
    (dict(dev=None), r"candidates: choosing among them needs a dev split"),
    (dict(lm_eval_tasks=["compat_piqa"]), r"lm_eval_tasks: the lm-eval flips are reported without a dev split"),
    (dict(new_base={"quantization": {"library": "gptq", "bits": 4}}),
     r"new_base.quantization.library: unknown 'gptq'; known: bitsandbytes, torchao, quanto"),
    (dict(new_base={"quantization": {"load_in_4bit": True}}), r"new_base.quantization: a dict with 'library'"),
])
def test_bad_config_is_one_clear_line_and_writes_nothing(tmp_path, change, error):
    """Through the CLI, as a user meets it: exit 2, one line naming the field, no output directory."""
    from adaptguard.update import tiny_preset

    cfg = tiny_preset(str(tmp_path / "out"))
    fields = {"old_base": "embedded:tiny", "new_base": "embedded:tiny-v2", "train": cfg.train[:8],
              "dev": cfg.test[:4], "test": cfg.test[4:8], "candidates": CANDIDATES[:1], "output_dir": str(tmp_path / "out"),
              **change}
    (tmp_path / "c.json").write_text(json.dumps(fields))
    # the CLI's main in this process (warnings and log lines captured as a process shows them); a fresh process's
    # own start (import-time noise) is checked once, below
    proc = run_cli("update", tmp_path / "c.json")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("adaptguard update: error: "), proc.stderr
    assert __import__("re").search(error, lines[0]), lines[0]
    assert not (tmp_path / "out").exists()


def test_bad_config_from_a_fresh_process_is_one_line_too(tmp_path):
    """The same refusal as `adaptguard update` starts in a new process: nothing its imports print comes first."""
    from adaptguard.update import tiny_preset

    cfg = tiny_preset(str(tmp_path / "out"))
    fields = {"old_base": "embedded:tiny", "new_base": "embedded:tiny-v2", "train": cfg.train[:8], "dev": None,
              "test": cfg.test[4:8], "candidates": CANDIDATES[:1], "output_dir": str(tmp_path / "out")}
    (tmp_path / "c.json").write_text(json.dumps(fields))
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "update", str(tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0] == ("adaptguard update: error: candidates: choosing among them needs a dev split (set dev); the "
                        "test split is only scored after the pick"), lines[0]
    assert not (tmp_path / "out").exists()


def test_overlapping_splits_and_a_missing_quantization_library_write_nothing(tmp_path, monkeypatch):
    from adaptguard.models import loading
    from adaptguard.update import UpdateConfig, run_update

    cfg = toy_config(tmp_path)
    cfg.dev = cfg.test[:5] + cfg.dev[5:]
    with pytest.raises(ValueError, match=r"dev and test overlap: 5 prompts are in both"):
        run_update(cfg)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(loading, "_installed", lambda module: False)
    with pytest.raises(ImportError, match=r"new_base.quantization: bitsandbytes is not installed: "
                                          r"pip install 'adaptguard\[quant\]'"):
        UpdateConfig(old_base="embedded:tiny", new_base={"quantization": {"library": "bitsandbytes",
                                                                          "load_in_4bit": True}},
                     train=cfg.train, test=cfg.test, output_dir=str(tmp_path / "q"))
    assert not (tmp_path / "q").exists()


def test_generated_answers_of_conversational_rows_and_a_tokenizer_without_pad(embedded_path):
    """Conversational prompt/completion rows (TRL's other format) are rendered with the chat template and scored by
    the completion message's text; a tokenizer without a pad token (Llama's) pads with EOS and is left as it was."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.utils.generation import answer_text, exact_match, generate_answers, prompt_key

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    questions = ["question : opposite of big ? answer :", "the opposite of hot is", "count : 4 5 6"]
    chat = [{"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": " x "}]}
            for q in questions]
    rendered = [{"prompt": tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                 "completion": "x"} for r in chat]
    assert tok.bos_token is None  # so the rendered text tokenizes to the same ids with or without special tokens
    answers = generate_answers(model, tok, chat, max_new_tokens=6)
    assert answers == generate_answers(model, tok, rendered, max_new_tokens=6)
    assert answer_text(chat[0]["completion"]) == "x" and exact_match(["x", "y", "x"], chat) == [True, False, True]
    assert prompt_key(chat[0]["prompt"]) != prompt_key(chat[1]["prompt"])
    tok.pad_token = None
    assert generate_answers(model, tok, rendered, max_new_tokens=6) == answers and tok.pad_token is None


def test_generation_stops_at_a_stop_string_and_says_which_rows_ran_out(embedded_path):
    """A stop string ends that row's generation (the text before it is the answer, other rows are untouched);
    `finished` is False exactly for rows that used up `max_new_tokens` without EOS or a stop string."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.utils.generation import generate_answers

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    rows = [{"prompt": p, "completion": ""} for p in ["the capital of france is", "question : opposite of big ? "
                                                      "answer :", "count : 4 5 6"]]
    full, ran = generate_answers(model, tok, rows, max_new_tokens=5, with_finished=True)
    for row, done in zip(rows, ran):  # each row alone, read from the raw tokens
        ids = tok(row["prompt"], return_tensors="pt")
        new = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
        new = new[0, ids["input_ids"].shape[1]:]
        assert done == (len(new) < 5 or bool((new == tok.eos_token_id).any()))
    words = full[0].split()
    assert len(words) >= 3, full
    stop = words[2]
    stopped, finished = generate_answers(model, tok, rows, max_new_tokens=5, stop_strings=[stop],
                                         with_finished=True)
    assert stopped[0] == full[0][:full[0].index(stop)].strip() and finished[0]
    for i in (1, 2):
        assert stopped[i] == (full[i][:full[i].index(stop)].strip() if stop in full[i] else full[i])
        assert finished[i] == (stop in full[i] or ran[i])


def test_default_candidates_follow_e5(tmp_path):
    """Registered (studies/preregistration.md § E5, Product): the default candidates are the control plus every recipe
    that helps on some update in E5's committed report, decided over its registered seeds (8 per arm on U1 and U2 and
    for U3's control and focal), with E3's settings (the runner's arms at T 2) on one budget."""
    from adaptguard import MUSCLEConfig
    from adaptguard.muscle.recipes import RECIPE_FIELDS
    from adaptguard.update import UpdateConfig
    from adaptguard.update.candidates import expand_candidates
    from studies.recipes_vs_control import ARMS

    report = json.loads((ROOT / "studies/results/e5_report.json").read_text())["E3"]
    for name, update in report["updates"].items():  # the family is complete: every registered seed is in
        for arm, r in update["arms"].items():
            registered = 8 if name != "generative" or arm in ("control", "focal") else 3
            assert len(r["seeds"]) == registered, (name, arm)
    assert report["family"] == 12
    recipe_of = {"muscle": "muscle_ce", "ll_l": "ll_l_ce", "kd": "kd", "focal": "focal"}  # E3's arms: eq. 1 / LL_L + CE
    arm_of = {r: a for a, r in recipe_of.items()}
    helps = {c["arm"] for u in report["updates"].values() for c in (r.get("vs_control") for r in u["arms"].values())
             if c and c["verdict"] == "reproduced" and c["acc_ci"][0] > -0.02}
    assert helps == set(report["helps"])
    reproduced = {recipe_of[a] for a in helps}
    cfg = UpdateConfig(old_base="embedded:tiny", new_base="embedded:tiny-v2", train=[], test=[], dev=[],
                       compat_learning_rate=3e-4, compat_epochs=2)
    settings = expand_candidates(cfg.default_candidates())
    assert {s.recipe for s in settings} == {"control"} | reproduced
    assert {(s.learning_rate, s.epochs) for s in settings} == {(3e-4, 2)}
    for s in settings:
        extra = dict(s.fields)
        assert extra.get("ce_weight", 1.0) == 1.0 and (s.recipe == "control" or extra["temperature"] == 2.0)
        if s.recipe != "control":  # the fields a trainer resolves are E3's arm's
            default, e3 = ({f: getattr(c, f) for f in (*RECIPE_FIELDS, "temperature")} for c in (
                MUSCLEConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, recipe=recipe, **fields)
                for recipe, fields in ((s.recipe, extra), (arm_of[s.recipe], {"temperature": 2.0,
                                                                               **ARMS[arm_of[s.recipe]]}))))
            assert default == e3, s.recipe


def test_a_quantized_new_base_is_quantized_once_per_run_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    """The run keeps its bitsandbytes new base quantized once; every later load reads that copy (quantizing is
    refused here to show it) and gives the weights and logits of a base quantized anew."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("the quantized update needs the [quant] extra")
    import torch

    from adaptguard.models import loading
    from adaptguard.update import UpdateConfig
    from adaptguard.update.steps import load_new_base, new_base_copy, resolved, store_new_base

    rows = toy_config(tmp_path).test
    cfg = UpdateConfig(old_base="embedded:tiny", new_base={"quantization": {
        "library": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}},
        train=rows[:4], test=rows[4:8], output_dir=str(tmp_path / "q"), use_cpu=True)
    cfg = resolved(cfg)
    fresh = load_new_base(cfg)  # no copy yet: quantized as transformers loads it
    store_new_base(cfg)
    folder, key = new_base_copy(cfg)
    assert json.loads((folder / "done.json").read_text()) == key and list(folder.glob("*.safetensors"))
    monkeypatch.setattr(loading, "quantization_config", lambda spec: pytest.fail("quantized again"))
    stored = load_new_base(cfg)
    assert type(stored.model.layers[0].mlp.down_proj).__name__ == "Linear4bit"
    a, b = fresh.state_dict(), stored.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, fresh.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, stored(ids).logits)
    assert new_base_copy(dataclasses.replace(cfg, new_base="embedded:tiny-v2")) is None  # not quantized: no copy
