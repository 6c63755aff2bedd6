"""The real-model experiments (issue 14): the evals-wheel reader, and each example script's code path run end to end
on the embedded tiny models with small stand-in data (the real runs are in studies/results.md, not CI tests)."""

import dataclasses
import importlib.util
import json
import math
import sys
import zipfile

import pytest
import torch
from bigbench_tasks import QA, TOY
from conftest import ROOT

MEDMCQA = {"input": [{"role": "system", "content": "You are a doctor.\nOnly write the answer down."},
                     {"role": "user", "content": "Subject: Anatomy\n\nWhich bone?\n\na) Femur\nb) Tibia\nc) Ulna\n"
                                                 "d) Skull"}], "ideal": "c) Ulna"}
LOGIQA = {"input": [{"role": "system", "content": "Instructions: pick one."},
                    {"role": "user", "content": "\nPassage: All cats sleep. Question: Which follows?\nA. A.Cats sleep.\n"
                                                "B. B.Dogs fly.\nC. C.None.\nD. D.All.\nAnswer:"}], "ideal": "A"}


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_parse_sample_reads_both_option_layouts():
    from studies.openai_evals import as_letter_choices, as_prompt_completion, parse_sample

    med = parse_sample(MEDMCQA, "x")
    assert med == {"input": "You are a doctor.\nOnly write the answer down.\n\nSubject: Anatomy\n\nWhich bone?\n\n"
                            "a) Femur\nb) Tibia\nc) Ulna\nd) Skull\nAnswer:",
                   "choices": ["a) Femur", "b) Tibia", "c) Ulna", "d) Skull"], "label": 2}
    logi = parse_sample(LOGIQA, "x")
    assert logi["choices"] == ["A. A.Cats sleep.", "B. B.Dogs fly.", "C. C.None.", "D. D.All."]
    assert logi["label"] == 0 and logi["input"].endswith("D. D.All.\nAnswer:")  # the set's own "Answer:" not doubled
    assert as_prompt_completion([med]) == [{"prompt": med["input"], "completion": " c) Ulna"}]
    assert as_letter_choices([med])[0]["choices"] == ["a", "b", "c", "d"]


@pytest.mark.parametrize("sample, message", [
    ({"input": "text", "ideal": "a"}, "field 'input' must be a list of chat messages"),
    ({**MEDMCQA, "ideal": "e) Other"}, r"field 'ideal' 'e\) Other' names no option"),
    ({"input": [{"role": "user", "content": "no options here"}], "ideal": "a"}, "expected options"),
])
def test_parse_sample_names_the_bad_field(sample, message):
    from studies.openai_evals import parse_sample

    with pytest.raises(ValueError, match=f"samples.jsonl line 3: {message}"):
        parse_sample(sample, "samples.jsonl line 3")


def fake_wheel(path, members: dict[str, bytes], record_overrides: dict[str, bytes] | None = None):
    """A wheel with `members` and a RECORD of their sha256 (of `record_overrides[name]` where given)."""
    from adaptguard.models.wheels import sha256_b64

    with zipfile.ZipFile(path, "w") as wheel:
        record = ""
        for name, data in members.items():
            wheel.writestr(name, data)
            record += f"{name},sha256={sha256_b64((record_overrides or {}).get(name, data))},{len(data)}\n"
        wheel.writestr("evals-3.0.1.post1.dist-info/RECORD", record)
    return path


def test_load_set_reads_the_wheel_once_and_rejects_a_corrupted_one(tmp_path, monkeypatch):
    from studies.openai_evals import MEMBERS, load_set

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    data = (json.dumps(MEDMCQA) + "\n" + json.dumps({**MEDMCQA, "ideal": "a) Femur"}) + "\n").encode()
    wheel = fake_wheel(tmp_path / "evals.whl", {MEMBERS["medmcqa"]: data})
    rows = load_set("medmcqa", wheel=wheel)
    assert [r["label"] for r in rows] == [2, 0]
    wheel.unlink()  # cached: the wheel is not read again
    assert load_set("medmcqa") == rows

    bad = fake_wheel(tmp_path / "bad.whl", {MEMBERS["logiqa"]: json.dumps(LOGIQA).encode()},
                     record_overrides={MEMBERS["logiqa"]: b"something else"})
    with pytest.raises(RuntimeError, match="does not match the wheel's RECORD hash"):
        load_set("logiqa", wheel=bad)
    assert not bad.exists()  # a corrupted download is removed, to be fetched again
    assert not (tmp_path / "cache" / "openai_evals" / "logiqa.jsonl").exists()
    with pytest.raises(ValueError, match="unknown evals set 'mmlu'"):
        load_set("mmlu")


def stand_in_data(cache, n=24):
    """MedMCQA-like questions and two BIG-bench tasks in the caches the experiments read."""
    (cache / "openai_evals").mkdir(parents=True)
    words = ["paris", "rome", "cat", "dog", "red", "blue", "one", "two"]
    rows = [{"input": f"question : capital of {words[i % 8]} ?\na) {words[i % 8]}\nb) {words[(i + 1) % 8]}\n"
                      f"c) {words[(i + 2) % 8]}\nd) {words[(i + 3) % 8]}\nAnswer:",
             "choices": [f"a) {words[(i + j) % 8]}" if j == 0 else f"{'abcd'[j]}) {words[(i + j) % 8]}"
                         for j in range(4)], "label": i % 4} for i in range(n)]
    (cache / "openai_evals" / "medmcqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cache / "bigbench").mkdir()
    for name, task in (("general_knowledge", TOY), ("sports_understanding", QA)):
        (cache / "bigbench" / f"{name}.json").write_text(json.dumps(task))
    return rows


def test_paper003_tradeoff_code_path(tmp_path, monkeypatch, embedded_path):
    """Two methods on the tiny model: the pooled general NFR is the n-weighted mean of the tasks' NFRs, each
    run's general score the mean of its tasks' accuracies, and the report, plot and token analysis are written."""
    example = load_example("paper003_tradeoff")
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    stand_in_data(tmp_path / "cache")
    args = example.Args(model=str(embedded_path), methods="SFT,TALR", learning_rates="1e-3", train_rows=8,
                        test_rows=8, epochs=2, general_tasks="general_knowledge,sports_understanding",
                        general_limit=4, batch_size=4, out=str(tmp_path / "out"))
    report = example.main(args)
    assert [r["method"] for r in report["runs"]] == ["SFT", "TALR"]
    for run in report["runs"]:
        flips = run["general_flips"]
        n = sum(f["n"] for f in flips.values())
        assert n == 3  # TOY has 2 multiple-choice items, QA 1
        assert run["general_nfr"] == pytest.approx(sum(f["nfr"] * f["n"] for f in flips.values()) / n)
        general = [t for t in run["tasks"] if t.startswith("bb_")]
        assert run["general"] == pytest.approx(sum(run["tasks"][t] for t in general) / 2)
        assert run["domain"] == run["tasks"]["domain_medmcqa"]
    assert report["token_analysis"]["learning_rate"] == 1e-3
    assert [e["epoch"] for e in report["token_analysis"]["epochs"] if "frac_p_gt_0.2" in e][-1] == 2
    for name in ("report.json", "report.md", "tradeoff.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    with pytest.raises(ValueError, match="--methods: unknown"):
        example.main(example.Args(model=str(embedded_path), methods="SFT,RLHF", out=str(tmp_path / "o2")))


def test_quantization_flips_code_path(tmp_path, monkeypatch, embedded_path):
    """fp32 against itself flips nothing (lm-eval's scores are deterministic), int8 dynamic quantization runs on the
    tiny model and is compared item by item, and the report names the command that reruns it."""
    example = load_example("quantization_flips")
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    stand_in_data(tmp_path / "cache")
    args = example.Args(model=str(embedded_path), tasks="general_knowledge,sports_understanding", limit=4,
                        variants="fp32,int8", batch_size=2, out=str(tmp_path / "out"))
    report = example.main(args)
    assert sorted(report["tasks"]) == ["bb_general_knowledge fp32", "bb_general_knowledge int8",
                                       "bb_sports_understanding fp32", "bb_sports_understanding int8"]
    for task, n in (("bb_general_knowledge", 2), ("bb_sports_understanding", 1)):  # TOY has 2 multiple-choice items, QA 1
        same = report["tasks"][f"{task} fp32"]
        assert (same["n"], same["nfr"], same["pfr"], same["btc"] if same["old_acc"] else 1.0) == (n, 0.0, 0.0, 1.0)
        assert same["new_acc"] == same["old_acc"]
        assert report["tasks"][f"{task} int8"]["n"] == n
    assert report["command"] == f"python studies/quantization_flips.py --model {embedded_path} --tasks " \
        f"general_knowledge,sports_understanding --limit 4 --variants fp32,int8 --batch_size 2 --out {tmp_path / 'out'}"
    for name in ("report.json", "report.md", "flips.png", "report_int8.html", "report_fp32.html"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # the saved runs are lm-eval --log_samples runs: `compare` on them gives the in-memory comparison's numbers
    from adaptguard.compat.compare import compare_runs

    saved = compare_runs(tmp_path / "out" / "runs" / "reference", tmp_path / "out" / "runs" / "int8")["tasks"]
    first = json.loads(next((tmp_path / "out" / "runs" / "int8").glob("samples_*.jsonl")).read_text().splitlines()[0])
    assert set(first["arguments"]) == {f"gen_args_{i}" for i in range(len(first["arguments"]))}  # as lm-eval logs
    assert set(first["arguments"]["gen_args_0"]) == {"arg_0", "arg_1"}
    for task, entry in saved.items():
        mine = report["tasks"][f"{task} int8"]
        assert (entry["n"], entry["nfr"], entry["pfr"], entry["new_acc"]) == (mine["n"], mine["nfr"], mine["pfr"],
                                                                             mine["new_acc"])
    with pytest.raises(ValueError, match="--variants: unknown variant 'int4'; use int8, bf16, fp32"):
        example.main(dataclasses.replace(args, variants="int8,int4", out=str(tmp_path / "bad")))
    assert not (tmp_path / "bad").exists()  # refused before any evaluation or output


def test_quantization_schemes_runner_records_resumes_and_reports(tmp_path, monkeypatch, embedded_path, capsys):
    """E6's runner on the tiny model: fp32, its floor rerun and two schemes, a generated task and KL texts; each
    scheme's records land whole, a second run skips them (resume), a scheme whose library is missing is reported
    with its error, and the report's pooled NFR, H1 statistic and KL are recomputed here from the records."""
    example = load_example("quantization_flips")
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    stand_in_data(tmp_path / "cache")
    rows = [{"input": f"Q: What is {i} plus 1?\nA:", "target": str(i + 1), "subtask": "add"} for i in range(6)]
    (tmp_path / "cache" / "bigbench" / "arithmetic.generative.json").write_text(json.dumps(rows))
    texts = [{"input": f"A passage about {w} and more {w}s.\nAnswer:", "choices": ["A. x", "B. y"], "label": 0}
             for w in ("cats", "rain", "maps")]
    (tmp_path / "cache" / "openai_evals" / "logiqa.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))
    monkeypatch.setitem(example.SCHEMES, "missing_lib", {"library": "quanto", "weights": "int8"})
    import adaptguard.models.loading as loading

    monkeypatch.setattr(loading, "_installed", lambda module, _was=loading._installed: module != "optimum.quanto"
                        and _was(module))  # as on a machine without optimum-quanto
    records = tmp_path / "records"
    args = example.Args(model=str(embedded_path), tasks="general_knowledge,sports_understanding", limit=4,
                        schemes="bf16,int8_dynamic,missing_lib", generated="arithmetic", generated_limit=6,
                        floor=True, kl_texts=3, records=str(records), batch_size=2, out=str(tmp_path / "out"),
                        scheme_floors=True)
    report = example.main(args)
    tag = example.cpu_tag()
    reruns = [f"{s}_{tag}{k}" for s in ("fp32", "bf16", "int8_dynamic") for k in ("", "_floor")]
    assert sorted(p.name for p in records.iterdir()) == sorted(
        ["bf16", "fp32", "fp32_floor", "int8_dynamic", "missing_lib", *reruns])  # a scheme that did not run: no rerun
    for run in reruns:  # amendment 3: the recorded setting here, then batch 5 on one thread
        meta = json.loads((records / run / "meta.json").read_text())
        assert (meta["batch_size"], meta["threads"]) == ((5, 1) if run.endswith("_floor") else (2, torch.get_num_threads()))
        assert "kl.json" not in {p.name for p in (records / run).iterdir()}
    kept = report["kept_tasks"]
    from adaptguard.compat.compare import compare_runs

    for scheme in ("bf16", "int8_dynamic"):
        row = report["floors"]["schemes"][scheme]
        if not kept:
            assert "own_floor" not in row
            continue
        here, floor = (example.item_scores(records / f"{scheme}_{tag}{k}") for k in ("", "_floor"))
        pairs = [(here[t][d], floor[t][d]) for t in kept for d in here[t]]
        assert row["own_floor"]["pooled"]["changed"] == sum(a != b for a, b in pairs)
        assert row["flips_by_batch_alone"] == any(a != b for a, b in pairs)
        # the excess NFR is compare's replicate mode on the same runs, at 95 % (alpha 0.025: level 1 − 2α)
        compared = compare_runs(records / f"fp32_{tag}", [[records / f"{scheme}_{tag}", records / f"{scheme}_{tag}_floor"]],
                                alpha=0.025)
        for task, mine in row["excess"]["per_task"].items():
            theirs = compared["tasks"][task]["replicates"]
            assert mine["excess_nfr"] == pytest.approx(theirs["excess_nfr"])
            assert mine["ci"] == pytest.approx(list(theirs["ci"]))
    assert "quanto is not installed" in report["not_runnable"]["missing_lib"]
    ref = example.item_scores(records / "fp32")
    assert sorted(ref) == ["bb_arithmetic", "bb_general_knowledge", "bb_sports_understanding"]
    assert report["schemes"]["fp32_floor"]["pooled"]["nfr"] == 0.0  # the same model, batch 5, one thread
    for scheme in ("bf16", "int8_dynamic"):
        new = example.item_scores(records / scheme)
        keys = [(t, d) for t in report["kept_tasks"] for d in ref[t]]
        old_v = [ref[t][d] for t, d in keys]
        new_v = [new[t][d] for t, d in keys]
        nfr = sum(o and not n for o, n in zip(old_v, new_v)) / len(keys)
        pooled = report["schemes"][scheme]["pooled"]
        assert pooled["n"] == len(keys) and pooled["nfr"] == pytest.approx(nfr)
        assert report["H1"]["per_scheme"][scheme]["statistic"] == pytest.approx(
            nfr - abs(sum(new_v) / len(keys) - sum(old_v) / len(keys)))
        kl = json.loads((records / scheme / "kl.json").read_text())
        assert report["schemes"][scheme]["kl_mean"] == pytest.approx(sum(kl["sum"]) / sum(kl["tokens"]))
        assert len(kl["sum"]) == 3 and report["schemes"][scheme]["kl_mean"] > 0
    from transformers import AutoModelForCausalLM

    def stored_bytes(model):  # plain tensors: every parameter and buffer at its dtype's size
        return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])

    for scheme, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        want = stored_bytes(AutoModelForCausalLM.from_pretrained(embedded_path, dtype=dtype))
        assert json.loads((records / scheme / "meta.json").read_text())["weight_bytes"] == want
    assert report["schemes"]["bf16"]["weight_bytes"] < 0.51 * json.loads(
        (records / "fp32" / "meta.json").read_text())["weight_bytes"]  # half, but rotary buffers stay float32
    assert json.loads((records / "fp32" / "kl.json").read_text())["sum"] == [0.0, 0.0, 0.0]  # fp32 against itself
    first = json.loads(next((records / "fp32").glob("samples_bb_general_knowledge_*.jsonl")).read_text().splitlines()[0])
    assert "doc" not in first and all(set(a) == {"arg_1"} for a in first["arguments"].values())
    capsys.readouterr()
    again = example.main(args)  # resume: every scheme is recorded, nothing is evaluated again
    assert capsys.readouterr().out.count("skipped") == 5 + len(reruns)
    assert again["schemes"] == report["schemes"]
    assert (tmp_path / "out" / "report_bf16.html").stat().st_size > 0
    with pytest.raises(ValueError, match="--schemes: unknown 'int3'"):
        example.main(dataclasses.replace(args, schemes="bf16,int3", out=str(tmp_path / "bad")))
    assert not (tmp_path / "bad").exists()


def test_paper000_drift_code_path_and_base_loss(tmp_path, monkeypatch, embedded_path):
    """The base loss the experiment reports equals the mean over questions of each answer's mean token NLL,
    computed here by hand."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    example = load_example("paper000_drift")
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    rows = stand_in_data(tmp_path / "cache")
    args = example.Args(model=str(embedded_path), similarities="0,1", seeds=2, train_rows=8, test_rows=6, epochs=1,
                        batch_size=4, out=str(tmp_path / "out"))
    report = example.main(args)
    assert [(r["r"], r["seed"]) for r in report["runs"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["kept_fraction"] for r in report["runs"] if r["r"] == 1] == [1.0, 1.0]
    for p in report["per_r"]:
        losses = [r["loss"] for r in report["runs"] if r["r"] == p["r"]]
        assert (p["min"], p["max"]) == (min(losses), max(losses))

    import random

    random.Random(0).shuffle(rows)
    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    total = count = 0.0
    for r in example.question_answer_rows(rows[:6]):
        prompt, completion = f"Question: {r['question']}\nAnswer:", f" {r['answer']}"
        p_ids = tok(prompt)["input_ids"]
        ids = tok(prompt + completion)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logp = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        targets = torch.tensor(ids[1:])
        nll = -logp.gather(1, targets[:, None])[:, 0][len(p_ids) - 1:]
        total, count = total + nll.mean().item(), count + 1
    assert report["base_loss"] == pytest.approx(total / count, rel=1e-4)
    assert math.isfinite(report["worst_r"])


def test_paper001_composition_code_path(tmp_path, embedded_path):
    example = load_example("paper001_composition")
    report = example.main(example.Args(model=str(embedded_path), pairs="af,t1", k=2, n_test=3, n_test_translation=2,
                                       out=str(tmp_path / "out")))
    assert [(r["pair"], r["separable"]) for r in report["pairs"]] == [("af", True), ("t1", True)]
    assert [r["n"] for r in report["pairs"]] == [3, 2]
    for r in report["pairs"]:
        assert r["icl_minus_composite"] == pytest.approx(
            r["exact_match"]["composite_icl"] - r["exact_match"]["composite"])
    assert r["word_metric"] == "wer"
    assert (tmp_path / "out" / "composition.png").stat().st_size > 0
    with pytest.raises(ValueError, match="--pairs: unknown"):
        example.main(example.Args(model=str(embedded_path), pairs="zz", out=str(tmp_path / "o2")))


def test_paper002_update_reuses_the_task_adapters_for_the_second_mask(tmp_path, monkeypatch, embedded_path,
                                                                      tiny_v2_path, capsys):
    example = load_example("paper002_update")
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    stand_in_data(tmp_path / "cache")
    args = example.Args(old_model=str(embedded_path), new_model=str(tiny_v2_path), train_rows=8, test_rows=6,
                        task_epochs=1, compat_epochs=1, batch_size=4, out=str(tmp_path / "out"))
    report = example.main(args)
    printed = capsys.readouterr().out
    assert "update: v1 task adapter: reusing" in printed and "update: v2 task adapter: reusing" in printed
    first, second = (report["masks"][m] for m in example.MASKS)
    # the second run reused the first run's task adapters: the same v1 and v2 answers, so the same v1 -> v2 flips
    for key in ("old_acc", "new_acc", "nfr", "pfr"):
        assert first[key] == second[key]
    for mask in example.MASKS:
        marker = tmp_path / "out" / mask / "v1_task_adapter" / "adaptguard_task_adapter.json"
        assert json.loads(marker.read_text())["task_learning_rate"] == 1e-3
        assert (tmp_path / "out" / mask / "flips.png").exists()
    assert "| student_wrong |" in (tmp_path / "out" / "report.md").read_text()


def test_e6_report_recomputes_from_the_committed_records(tmp_path):
    """studies/results/e6/report.json (README's E6 rows are tested against it) is what the committed records give:
    the table, the churn split and the three registered decisions, recomputed here."""
    example = load_example("quantization_flips")
    committed = json.loads((ROOT / "studies" / "results" / "e6" / "report.json").read_text())
    again = example.main(example.Args(e6=True, report=True, records=str(ROOT / "studies" / "results" / "e6_records"),
                                      out=str(tmp_path)))
    for key in ("command", "records"):  # where it was written from, not what it says
        committed.pop(key), again.pop(key)
    assert_close_tree(json.loads(json.dumps(again)), committed)  # as written: tuples become lists


def assert_close_tree(a, b, path="report") -> None:
    """Equal dicts and lists, floats to 1e-9 relative (the bootstrap and Spearman run in float64 on any CPU)."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and sorted(a) == sorted(b), path
        for k in b:
            assert_close_tree(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close_tree(x, y, f"{path}[{i}]")
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path
