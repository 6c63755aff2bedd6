"""`compat_<name>` for any lm-eval task or group (`adaptguard.compat.harness.variants`): real lm-eval runs on the embedded
tiny models; the in-harness flips must equal `adaptguard compare` on the same two runs."""

import json
import re
import shutil

import pytest
from in_process import run_cli, run_lm_eval_cli
from lm_eval_runs import samples_file
from test_compat_tasks import results
from test_new_metric_row import FLIP_RATE

from adaptguard.compat import metric_table
from adaptguard.compat.compare import compare_runs
from adaptguard.compat.reading.runs import RunError

# a generation task whose filter is named "none", like the multiple-choice task's: the group then pools both
GSM_NONE = """include: {tasks}/t_gsm.yaml
task: t_gsm_n
filter_list:
  - name: "none"
    filter:
      - function: "regex"
        regex_pattern: "(\\\\d+)"
      - function: "take_first"
"""
# a loglikelihood task (one continuation; acc = the continuation is the greedy one)
LOGLIKELIHOOD = """include: {tasks}/t_piqa.yaml
task: t_ll
output_type: loglikelihood
doc_to_target: " {{{{sol1}}}}"
doc_to_choice: null
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
PAIR = """group: t_pair
task:
  - t_piqa
  - t_gsm_n
  - t_ll
aggregate_metric_list:
  - metric: acc
    weight_by_size: true
metadata:
  version: 1.0
"""


def lm_eval(model, tasks_dir, out, tasks, *extra, wrapper=False):
    """lm-eval's own CLI, or (`wrapper`) `adaptguard lm-eval` through the in-process run_cli."""
    args = ["--model", "hf", "--model_args", f"pretrained={model}", "--tasks", tasks, "--include_path", str(tasks_dir),
            "--device", "cpu", "--batch_size", "8", "--log_samples", "--output_path", str(out), *extra]
    if wrapper:
        return run_cli("lm-eval", *args)
    return run_lm_eval_cli(*args)


@pytest.fixture(scope="module")
def variant_runs(lm_runs, embedded_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    tasks = root / "tasks"
    shutil.copytree(lm_runs / "tasks", tasks)
    (tasks / "t_gsm_n.yaml").write_text(GSM_NONE.format(tasks=tasks))
    (tasks / "t_ll.yaml").write_text(LOGLIKELIHOOD.format(tasks=tasks))
    (tasks / "t_pair.yaml").write_text(PAIR)
    for name, model in (("old", embedded_path), ("new", lm_runs / "new_model" / "model")):
        proc = lm_eval(model, tasks, root / name, "t_piqa,t_gsm_n,t_ll")
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_group_variant_flips_equal_compare(variant_runs, lm_runs):
    root = variant_runs
    out = root / "compat"
    meta = json.dumps({"compat_reference": str(root / "old"), "compat_similarity": "rouge1"})
    proc = lm_eval(lm_runs / "new_model" / "model", root / "tasks", out, "compat_t_pair", "--metadata", meta,
                   wrapper=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = results(out)
    want = compare_runs(root / "old", root / "new", n_boot=10)["tasks"]
    smooth = compare_runs(samples_file(root / "old", "t_gsm_n"), samples_file(root / "new", "t_gsm_n"),
                          similarity="rouge1", n_boot=10)["tasks"]["t_gsm_n"]
    for task in ("t_piqa", "t_gsm_n", "t_ll"):
        for key in ("nfr", "pfr", "inconsistency_flips", "btc"):
            if want[task][key] is None:  # loglikelihood: no inconsistency_flips on either side
                assert f"{key},none" not in got[f"compat_{task}"], (task, key)
            else:
                assert got[f"compat_{task}"][f"{key},none"] == pytest.approx(want[task][key]), (task, key)
        metric = "exact_match" if task == "t_gsm_n" else "acc"  # the original's own metric, scored as it is
        assert got[f"compat_{task}"][f"{metric},none"] == pytest.approx(want[task]["new_acc"])
    assert "perplexity,none" in got["compat_t_ll"]  # the loglikelihood task's other metric, kept
    for key in ("smooth_nfr", "smooth_pfr", "m_g", "m_r"):
        if smooth[key] is not None:
            assert got["compat_t_gsm_n"][f"{key},none"] == pytest.approx(smooth[key]), key
    assert want["t_gsm_n"]["nfr"] > 0  # the fine-tune broke the generation task: the pooling below is not 0 = 0
    for key in ("nfr", "pfr", "inconsistency_flips"):
        have = [t for t in want if want[t][key] is not None]  # lm-eval pools over the subtasks that report it
        pooled = sum(want[t][key] * want[t]["n"] for t in have) / sum(want[t]["n"] for t in have)
        assert got["compat_t_pair"][f"{key},none"] == pytest.approx(pooled), key


def test_variant_without_reference_reports_the_original_metrics(variant_runs, lm_runs, tmp_path):
    """Plain lm_eval on YAMLs from `adaptguard compat-tasks`: the original's scores, no flips, one warning."""
    gen = tmp_path / "gen"
    proc = run_cli("compat-tasks", "t_piqa", "--include-path", variant_runs / "tasks", "--out", gen)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in gen.iterdir()) == ["compat_t_piqa.yaml"]
    proc = lm_eval(lm_runs / "new_model" / "model", gen, tmp_path / "run", "compat_t_piqa")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = results(tmp_path / "run")["compat_t_piqa"]
    want = compare_runs(variant_runs / "old", variant_runs / "new", n_boot=10)["tasks"]["t_piqa"]
    assert got["acc,none"] == pytest.approx(want["new_acc"]) and "nfr,none" not in got
    assert proc.stderr.count("no compat_reference given") == 1


def compat_t_piqa(variant_runs, reference, tmp_path):
    """compat_t_piqa built in this process the way lm-eval builds it, naming `reference` as compat_reference."""
    from lm_eval.tasks import TaskManager

    from adaptguard.compat.harness.variants import write_compat_tasks

    tasks = [str(variant_runs / "tasks")]
    write_compat_tasks(["t_piqa"], tmp_path / "v", task_manager=TaskManager(include_path=tasks, include_defaults=False))
    manager = TaskManager(include_path=[*tasks, str(tmp_path / "v")], include_defaults=False,
                          metadata={"compat_reference": str(reference)})
    return manager.load(["compat_t_piqa"])["tasks"]["compat_t_piqa"]


def test_reference_that_does_not_cover_the_documents_fails_before_scoring(variant_runs, lm_runs, tmp_path):
    limited = tmp_path / "limited"  # as written by --limit 5: the first five documents only
    shutil.copytree(variant_runs / "old", limited)
    f = samples_file(limited, "t_piqa")
    f.write_text("".join(line + "\n" for line in f.read_text().splitlines() if json.loads(line)["doc_id"] < 5))
    # end to end once: the CLI exits 2 with the task and the document, and writes no results
    proc = lm_eval(lm_runs / "new_model" / "model", variant_runs / "tasks", tmp_path / "x", "compat_t_piqa",
                   "--metadata", json.dumps({"compat_reference": str(limited)}), wrapper=True)
    assert proc.returncode == 2 and "compat_t_piqa: doc_id 5 is not in the compat_reference run of t_piqa" \
        in proc.stderr, proc.stderr[-3000:]
    assert not list(tmp_path.glob("x/**/results_*.json"))
    # the same check in this process, before any request reaches a model
    with pytest.raises(RunError, match="compat_t_piqa: doc_id 5 is not in the compat_reference run of t_piqa"):
        compat_t_piqa(variant_runs, limited, tmp_path / "a").build_all_requests(limit=None, rank=0, world_size=1)
    compat_t_piqa(variant_runs, limited, tmp_path / "b").build_all_requests(limit=5, rank=0, world_size=1)

    tampered = tmp_path / "tampered"
    shutil.copytree(variant_runs / "old", tampered)
    f = samples_file(tampered, "t_piqa")
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    rows[2]["prompt_hash"] = "0" * 64  # as if the old run had used other few-shot examples for doc 2
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RunError, match="compat_t_piqa: doc_id 2 has another prompt"):
        compat_t_piqa(variant_runs, tampered, tmp_path / "c").build_all_requests(limit=None, rank=0, world_size=1)

    nowhere = re.escape(f"compat_t_piqa: compat_reference {tmp_path / 'nowhere'}: no such file")
    with pytest.raises(RunError, match=nowhere):
        compat_t_piqa(variant_runs, tmp_path / "nowhere", tmp_path / "d")


def test_unknown_names_and_folders_are_refused(variant_runs, tmp_path):
    proc = run_cli("compat-tasks", "no_such_task", "--include-path", variant_runs / "tasks", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "lm-eval knows no task, group or tag 'no_such_task'" in proc.stderr
    assert not (tmp_path / "o").exists()
    proc = run_cli("compat-tasks", "t_piqa", "--include-path", tmp_path / "missing", "--out", tmp_path / "o")
    assert proc.returncode == 2 and f"--include-path {tmp_path / 'missing'}: no such directory" in proc.stderr


def test_a_new_row_is_a_metric_of_the_variant_and_pooled_in_its_group(variant_runs, lm_runs, monkeypatch):
    """`flip_rate`, added as one row of the metric table (test_new_metric_row.py), is reported by the variant of each
    task — the share of documents whose answer changed, counted here from the two runs' samples — and pooled by
    size in the group's."""
    monkeypatch.setitem(metric_table.METRICS, "flip_rate", FLIP_RATE)
    root = variant_runs
    out = root / "compat_flip_rate"
    meta = json.dumps({"compat_reference": str(root / "old")})
    proc = lm_eval(lm_runs / "new_model" / "model", root / "tasks", out, "compat_t_pair", "--metadata", meta,
                   wrapper=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = results(out)
    changed, sizes = {}, {}
    for task in ("t_piqa", "t_gsm_n", "t_ll"):
        metric = "exact_match" if task == "t_gsm_n" else "acc"
        old, new = ({s["doc_id"]: s[metric] for s in map(json.loads, samples_file(root / side, task).read_text()
                                                           .splitlines()) if s["filter"] == "none"}
                    for side in ("old", "new"))
        changed[task], sizes[task] = sum(old[d] != new[d] for d in old), len(old)
        assert got[f"compat_{task}"]["flip_rate,none"] == pytest.approx(changed[task] / sizes[task]), task
    assert got["compat_t_pair"]["flip_rate,none"] == pytest.approx(sum(changed.values()) / sum(sizes.values()))
