"""The compat_* lm-eval tasks end to end through the real lm-eval CLI: old run, new run naming the old
one as reference, flips in the results table."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from in_process import run_cli

GEN = ["--gen_kwargs", "max_gen_toks=16"]


def adaptguard_lm_eval(model, out, metadata, *extra, process=False):
    """`adaptguard lm-eval` through the in-process run_cli, or (`process`) as a process of its own."""
    args = ["lm-eval", "--model", "hf", "--model_args", f"pretrained={model}", "--tasks", "compat_*", "--metadata",
            json.dumps(metadata), "--device", "cpu", "--batch_size", "8", "--log_samples", "--output_path", str(out),
            *GEN, *extra]
    if process:
        return subprocess.run([sys.executable, "-m", "adaptguard.cli", *args], capture_output=True, text=True,
                              timeout=900)
    return run_cli(*args)


def results(run):
    (found,) = run.rglob("results_*.json")
    return json.loads(found.read_text())["results"]


@pytest.fixture(scope="module")
def compat_runs(tmp_path_factory, embedded_path, lm_runs):
    from compat_fixtures import write_compat_data

    root = tmp_path_factory.mktemp("compat")
    data = write_compat_data(root / "data")
    old = adaptguard_lm_eval(embedded_path, root / "old", {"compat_data_dir": str(data)})
    assert old.returncode == 0, old.stderr[-3000:]
    new = adaptguard_lm_eval(lm_runs / "new_model" / "model", root / "new",
                             {"compat_data_dir": str(data), "compat_reference": str(root / "old")})
    assert new.returncode == 0, new.stderr[-3000:]
    return root, new.stdout


def test_old_run_has_plain_scores_only(compat_runs):
    root, _ = compat_runs
    res = results(root / "old")
    assert set(res) == {"compat_piqa", "compat_hellaswag", "compat_gsm8k", "compat_samsum"}
    assert "acc,none" in res["compat_piqa"] and "nfr,none" not in res["compat_piqa"]
    assert "rouge1,none" in res["compat_samsum"] and "smooth_nfr,none" not in res["compat_samsum"]


def test_new_run_reports_flips_equal_to_compare(compat_runs, tmp_path):
    root, stdout = compat_runs
    assert "nfr" in stdout and "btc" in stdout  # in lm-eval's own results table
    res = results(root / "new")
    proc = run_cli("compare", root / "old", root / "new", "--json", tmp_path / "c.json")
    # compat_samsum has no 0/1 metric: compare needs --similarity for it, so compare the others per file
    assert proc.returncode == 2 and "compat_samsum" in proc.stderr
    flips_seen = 0
    for task, filt in (("compat_piqa", "none"), ("compat_hellaswag", "none"), ("compat_gsm8k", "strict-match")):
        (old_f,) = (root / "old").rglob(f"samples_{task}_2*.jsonl")
        (new_f,) = (root / "new").rglob(f"samples_{task}_2*.jsonl")
        out = tmp_path / f"{task}.json"
        proc = run_cli("compare", old_f, new_f, "--json", out)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ref = json.loads(out.read_text())["tasks"][task]
        for key in ("nfr", "pfr", "inconsistency_flips", "btc"):
            got = res[task][f"{key},{filt}"]
            if ref[key] is None:
                assert got != got  # NaN: BTC undefined when the old model is never right
            else:
                assert got == pytest.approx(ref[key]), (task, key)
        flips_seen += ref["n_negative_flips"] + ref["n_positive_flips"]
    assert flips_seen > 0


def test_samsum_smooth_flips_match_recomputation(compat_runs):
    from rouge_score import rouge_scorer

    root, _ = compat_runs
    (old_f,) = (root / "old").rglob("samples_compat_samsum_2*.jsonl")
    (new_f,) = (root / "new").rglob("samples_compat_samsum_2*.jsonl")
    old = {json.loads(line)["doc_hash"]: json.loads(line) for line in open(old_f)}
    new = [json.loads(line) for line in open(new_f)]
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    d = [scorer.score(r["doc"]["summary"], r["filtered_resps"][0])["rouge1"].fmeasure
         - scorer.score(r["doc"]["summary"], old[r["doc_hash"]]["filtered_resps"][0])["rouge1"].fmeasure for r in new]
    res = results(root / "new")["compat_samsum"]
    assert res["smooth_nfr,none"] == pytest.approx(sum(x < 0 for x in d) / len(d))
    assert res["smooth_pfr,none"] == pytest.approx(sum(x > 0 for x in d) / len(d))
    assert res["rouge1,none"] == pytest.approx(sum(r["rouge1"] for r in new) / len(new))


def test_missing_reference_is_a_clear_error(embedded_path, tmp_path):
    from compat_fixtures import write_compat_data

    data = write_compat_data(tmp_path / "data")
    proc = adaptguard_lm_eval(embedded_path, tmp_path / "out", {"compat_data_dir": str(data),
                                                               "compat_reference": str(tmp_path / "nowhere")},
                              "--tasks", "compat_piqa", process=True)
    # (a process of its own: in this one, after the fixture's runs, lm-eval was seen to build compat_gsm8k too)
    assert proc.returncode == 2
    assert "compat_piqa" in proc.stderr and "nowhere" in proc.stderr and "no such file" in proc.stderr, proc.stderr[-800:]
    assert not (tmp_path / "out").exists()


def test_reference_of_other_documents_is_refused(compat_runs, tmp_path, monkeypatch):
    """A reference that scored fewer documents (--limit 3) is refused at the first document it lacks, naming the
    task; the end-to-end exit code of a refused reference is test_missing_reference_is_a_clear_error's."""
    import shutil

    from adaptguard.compat.harness import tasks as harness
    from adaptguard.compat.reading.runs import RunError

    root, _ = compat_runs
    limited = tmp_path / "limited"
    shutil.copytree(root / "old", limited)
    (f,) = limited.rglob("samples_compat_piqa_2*.jsonl")
    f.write_text("".join(line + "\n" for line in f.read_text().splitlines() if json.loads(line)["doc_id"] < 3))
    monkeypatch.setattr(harness, "_REFERENCES", {})
    docs = list(harness.load_dataset_for("compat_piqa", "baber/piqa", None, "validation", compat_data_dir=str(
        root / "data"), compat_reference=str(limited))["validation"])
    assert [harness.reference_for("compat_piqa", d) is not None for d in docs[:3]] == [True] * 3
    with pytest.raises(RunError, match="compat_piqa: .*same documents"):
        harness.reference_for("compat_piqa", docs[3])


def test_plain_lm_eval_with_tasks_dir(embedded_path, tmp_path):
    """Plain `lm_eval` in a fresh process (nothing of adaptguard imported before lm-eval reads the YAMLs) scores a task
    of each shipped folder with its own metrics: what each YAML's `!function` imports is all they need. (The other
    tests of these tasks run lm-eval in the test process.)"""
    from compat_fixtures import write_compat_data

    tasks_dir = subprocess.run([sys.executable, "-m", "adaptguard.cli", "tasks-dir"], capture_output=True,
                               text=True, timeout=120).stdout.strip()
    assert (ROOT / "lm_eval_tasks").resolve() == __import__("pathlib").Path(tasks_dir).resolve()
    data = write_compat_data(tmp_path / "data")
    metrics = {"compat_piqa": "acc,none", "compose_logic_ab_composite": "word_exact_match,none",
               "compose_translation_t1_composite": "wer,none", "drift_bsc_next_bit": "nll,none"}
    proc = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
                           f"pretrained={embedded_path}", "--tasks", ",".join(metrics), "--include_path", tasks_dir,
                           "--metadata", json.dumps({"compat_data_dir": str(data)}), "--device", "cpu",
                           "--limit", "5", "--output_path", str(tmp_path / "plain")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scored = results(tmp_path / "plain")
    for task, metric in metrics.items():
        assert 0 <= scored[task][metric] < float("inf"), (task, scored[task])


def test_gathered_include_path_holds_every_task_dir(tmp_path):
    """`adaptguard lm-eval` passes lm-eval one --include_path: a folder gathering the user's task directory and every
    plugin's. lm-eval's own TaskManager must find the tasks of both there, nothing being patched."""
    from lm_eval.tasks import TaskManager

    from adaptguard.compat.harness.tasks import gathered_include_path
    from adaptguard.plugins import lm_eval_task_dirs

    user = tmp_path / "my_tasks"
    (user / "sub").mkdir(parents=True)
    (user / "sub" / "my_task.yaml").write_text((ROOT / "lm_eval_tasks" / "compat" / "compat_piqa.yaml").read_text()
                                               .replace("task: compat_piqa", "task: my_task"))
    (user / "sub" / "utils.py").write_text((ROOT / "lm_eval_tasks" / "compat" / "utils.py").read_text())
    gathered = gathered_include_path([user, *lm_eval_task_dirs()], tmp_path / "gathered")
    assert (gathered / "0-my_tasks" / "sub" / "my_task.yaml").read_text() == (user / "sub" / "my_task.yaml").read_text()
    manager = TaskManager(include_path=str(gathered))
    assert {"my_task", "compat_piqa", "compat_gsm8k", "drift_bsc_next_bit"} <= set(manager.all_tasks)


def test_lm_eval_cli_refuses_a_missing_include_path(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "lm-eval", "--tasks", "compat_piqa",
                           "--include_path", str(tmp_path / "nope")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and f"--include_path {tmp_path / 'nope'}: no such directory" in proc.stderr


def test_no_group_or_tag_collides_with_the_wildcard():
    import fnmatch

    import yaml

    names = []
    for f in (ROOT / "lm_eval_tasks").rglob("*.yaml"):
        text = f.read_text()
        cfg = yaml.safe_load("\n".join(line for line in text.splitlines() if "!function" not in line))
        for key in ("group", "tag"):
            values = cfg.get(key) or []
            names += [values] if isinstance(values, str) else values
    assert not [n for n in names if fnmatch.fnmatch(n, "compat_*")]
