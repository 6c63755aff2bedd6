"""The task-selection experiment on the embedded default (paper 001 §3.3.2 Algorithm 1, Table 3.1 in spirit)."""

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest

from adaptguard.models.embedded import (
    ANTONYMS,
    EMBEDDED_MODELS,
    domain_rows,
    world_facts,
)
from studies.selection import (
    GRID,
    QUICK,
    ExperimentConfig,
    cycled,
    mixture_parts,
    render,
    run_selection_experiment,
    selections,
    skill_pairs,
    task_pool,
    task_rows,
)


def cloud(center, spread=1.0):
    """Eight points around `center` (2-D): center ± spread·e₁, ± spread·e₂ and the four diagonals / √2."""
    d = np.array([[1, 0], [-1, 0], [0, 1], [0, -1], [1, 1], [-1, -1], [1, -1], [-1, 1]], float)
    d[4:] /= np.sqrt(2)
    return np.asarray(center, float) + spread * d


# ------------------------------------------------------------------------------------------- tasks


def test_formats_and_skills_are_the_documented_strings():
    assert render("opposite of hot", "cold", "qa") == {"prompt": "question : opposite of hot ? answer :",
                                                       "completion": " cold ."}
    assert render("opposite of hot", "cold", "io") == {"prompt": "input: opposite of hot\noutput:",
                                                       "completion": " cold"}
    assert render("number after 41", "42", "arrow") == {"prompt": "number after 41 =>", "completion": " 42"}
    assert [len(skill_pairs(s)) for s in ("capital", "opposite", "next")] == [24, 36, 95]
    assert skill_pairs("next")[0] == ("number after 1", "2") and skill_pairs("next")[-1] == ("number after 95", "96")
    # each antonym pair is asked in both directions
    assert {(q.removeprefix("opposite of "), a) for q, a in skill_pairs("opposite")} == \
        {*ANTONYMS, *((b, a) for a, b in ANTONYMS)}


def test_the_qa_format_is_the_embedded_domain_format():
    # the capital/qa and opposite/qa tasks are exactly the embedded default's question/answer domain
    # (embedded.domain_rows, written independently), so the qa format is the domain the tiny model never saw
    spec = EMBEDDED_MODELS["tiny"]
    domain = {(r["prompt"], r["completion"]) for r in domain_rows(spec)}
    qa = {(r["prompt"], r["completion"]) for name in ("capital/qa", "opposite/qa") for r in task_rows(name)}
    assert qa == domain
    assert {r["completion"] for r in task_rows("capital/qa")} == {f" {city} ." for _, city in world_facts(spec)}


def test_distractors_are_compose_tasks_in_the_io_format():
    rows = task_rows("F", seed=3)
    assert len(rows) == 256 and len({r["prompt"] for r in rows}) == 256
    for r in rows[:20]:
        number = int(r["prompt"].removeprefix("input: ").removesuffix("\noutput:"))
        assert r["completion"] == f" {number + 1}"
    assert task_rows("F", seed=3) == rows and task_rows("F", seed=4) != rows
    pool = task_pool(ExperimentConfig(distractors=("A", "G")))
    assert list(pool) == [*GRID, "A", "G"]
    word = pool["A"][0]["prompt"].removeprefix("input: ").removesuffix("\noutput:")
    assert word.isalpha() and pool["A"][0]["completion"] == " " + word.upper()


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="not grid tasks; valid: capital/qa"):
        ExperimentConfig(targets=("capital/chat",))
    with pytest.raises(ValueError, match="targets: empty"):
        ExperimentConfig(targets=())
    with pytest.raises(ValueError, match="distractors .*'Z'.* valid: A, B"):
        ExperimentConfig(distractors=("Z",))
    with pytest.raises(ValueError, match="n_rows must be an integer >= 1"):
        ExperimentConfig(n_rows=0)
    with pytest.raises(ValueError, match="n_embed must be an integer >= 2"):
        ExperimentConfig(n_embed=1)
    with pytest.raises(ValueError, match="p must be >= 0"):
        ExperimentConfig(p=-0.1)
    with pytest.raises(ValueError, match="unknown format 'xml'; valid: qa, io, arrow"):
        render("q", "a", "xml")
    with pytest.raises(ValueError, match="unknown skill 'sum'; valid: capital, opposite, next"):
        skill_pairs("sum")
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        run_selection_experiment("unused", seed=-1)


# ---------------------------------------------------------------------------------------- mixtures


def test_cycled_uses_every_row_once_before_repeating():
    rows = [{"i": i} for i in range(4)]
    out = cycled(rows, 10, np.random.default_rng(0))
    ids = [r["i"] for r in out]
    assert sorted(ids[:4]) == sorted(ids[4:8]) == [0, 1, 2, 3] and len(set(ids[8:])) == 2
    assert Counter(ids) == Counter({i: 2 + (i in ids[8:]) for i in range(4)})


def test_mixture_rows_per_task_split_the_budget_equally_in_sorted_order():
    pool = {"b": [{"t": "b", "i": i} for i in range(3)], "a": [{"t": "a", "i": i} for i in range(50)],
            "c": [{"t": "c", "i": i} for i in range(7)]}
    parts = mixture_parts(pool, ["c", "b", "a"], 11)
    # 11 = 3·3 + 2: the first two tasks in sorted order get one row more
    assert {name: len(rows) for name, rows in parts.items()} == {"a": 4, "b": 4, "c": 3}
    assert list(parts) == ["a", "b", "c"]
    assert all(r["t"] == name for name, rows in parts.items() for r in rows)
    assert len({r["i"] for r in parts["a"]}) == 4  # a has enough rows: no repeats
    assert Counter(r["i"] for r in parts["b"]) == Counter({0: 1, 1: 1, 2: 1}) + Counter({parts["b"][3]["i"]: 1})
    # the mixture of a set does not depend on the order it was selected in, and is seeded
    assert mixture_parts(pool, ["a", "b", "c"], 11) == parts
    assert mixture_parts(pool, ["a", "b", "c"], 11, seed=1) != parts
    with pytest.raises(ValueError, match=r"selected tasks \['z'\] are not in the pool"):
        mixture_parts(pool, ["a", "z"], 11)
    with pytest.raises(ValueError, match="n_rows=2 must be at least the number of selected tasks"):
        mixture_parts(pool, ["a", "b", "c"], 2)


# --------------------------------------------------------------------------------------- selection


def test_full_picks_the_candidates_on_both_sides_of_the_target():
    # By hand: the target sits at (10, 0). "near" (10, 1) is the most consistent (cosine of the means),
    # then "across" (10, -2) on the other side, then "off" (6, 4). Each cloud has covariance I/2, which
    # shrinkage towards (tr/d)·I leaves unchanged: near alone has coverage 1 / (1² / (1/2)) = 1/2.
    # near ∪ across has mean (10, -0.5) and covariance diag(1/2, 1/2 + 1.5²) = diag(0.5, 2.75), shrunk
    # towards 1.625·I by some λ ∈ [0, 1]: its coverage lies between 1.625/0.25 = 6.5 and 2.75/0.25 = 11,
    # far above (1 + p)·1/2. Adding "off" pulls the mean away along e₁ where the union is narrow: coverage
    # drops, so the search stops there.
    target = cloud([10, 0])
    cands = {"off": cloud([6, 4]), "across": cloud([10, -2]), "near": cloud([10, 1])}
    chosen = selections(target, cands, p=0.5, n_random=4, seed=0)
    full = chosen["full"][0]
    assert full.selected == ["near", "across"]
    assert [(s["task"], s["accepted"]) for s in full.coverage_trace] == [("near", True), ("across", True),
                                                                         ("off", False)]
    covs = [s["coverage"] for s in full.coverage_trace]
    assert covs[0] == pytest.approx(0.5) and 6.5 <= covs[1] <= 11 and covs[2] < covs[1]
    assert full.coverage == covs[1]
    assert [r.selected for r in chosen["no_diversity"]] == [["near"]]
    assert len(chosen["random"]) == len(chosen["no_consistency"]) == 4
    assert all(len(r.selected) == 2 for r in chosen["random"])  # random: the size full picked
    again = selections(target, cands, p=0.5, n_random=4, seed=0)
    assert [r.selected for r in again["random"]] == [r.selected for r in chosen["random"]]
    assert [r.selected for r in again["no_consistency"]] == [r.selected for r in chosen["no_consistency"]]


# -------------------------------------------------------------------------------------- end to end

MICRO = ExperimentConfig(targets=("opposite/io",), n_embed=4, n_random=1, n_rows=8, epochs=1, batch_size=8,
                         max_new_tokens=3, include_all=False)


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory, embedded_path):
    out = tmp_path_factory.mktemp("selection")
    return out, run_selection_experiment(out, seed=0, config=MICRO)


def test_micro_run_writes_the_report_and_the_full_mixture(micro_run):
    out, report = micro_run
    assert json.loads((out / "selection.json").read_text()) == json.loads(json.dumps(report))
    assert set(report) >= {"config", "seed", "model", "embedder", "candidates", "targets", "summary",
                           "trainings", "seconds"}
    assert report["config"] == dataclasses.asdict(MICRO)
    t = report["targets"]["opposite/io"]
    assert t["n_test"] == 36
    assert set(t["methods"]) == {"full", "no_consistency", "no_diversity", "random", "base"}
    assert set(report["summary"]) == set(t["methods"])
    assert set(t["consistency"]) == set(report["candidates"]) - {"opposite/io"}
    for m in t["methods"].values():
        for run in m["runs"]:
            assert 0 <= run["exact_match"] <= run["word_exact_match"] <= 1  # an exact match is a full word match
            assert "opposite/io" not in run["selected"]
        assert m["exact_match"] == pytest.approx(np.mean([r["exact_match"] for r in m["runs"]]))
    full = t["methods"]["full"]["runs"][0]["selected"]
    assert t["methods"]["no_diversity"]["runs"][0]["selected"] == \
        [max(t["consistency"], key=t["consistency"].get)]
    assert len(t["methods"]["random"]["runs"][0]["selected"]) == len(full)
    # the written mixture: exactly n_rows rows, split equally over the tasks full selected
    assert t["mixture"] == "mixtures/opposite-io.jsonl"
    rows = [json.loads(line) for line in (out / t["mixture"]).read_text().splitlines()]
    assert len(rows) == MICRO.n_rows == sum(t["mixture_rows"].values())
    assert Counter(r["task"] for r in rows) == Counter(t["mixture_rows"])
    assert sorted(t["mixture_rows"]) == sorted(full)
    assert max(t["mixture_rows"].values()) - min(t["mixture_rows"].values()) <= 1
    pool = task_pool(MICRO)
    assert all({"prompt": r["prompt"], "completion": r["completion"]} in pool[r["task"]] for r in rows)
    md = (out / "selection.md").read_text()
    assert "| full |" in md and "## Target opposite/io (36 items)" in md and ", ".join(full) in md


def test_base_scores_are_recomputed_independently(micro_run, tiny):
    from adaptguard.utils.generation import generate_answers
    from adaptguard.utils.threads import torch_threads

    _, report = micro_run
    model, tok = tiny
    rows = task_rows("opposite/io")
    with torch_threads(MICRO.threads):  # the run's thread count: a greedy near-tie must not flip
        preds = generate_answers(model, tok, rows, max_new_tokens=MICRO.max_new_tokens, batch_size=64)
    em = sum(p.split("\n")[0].strip() == r["completion"].strip() for p, r in zip(preds, rows)) / len(rows)
    assert report["targets"]["opposite/io"]["methods"]["base"]["exact_match"] == pytest.approx(em)


def test_a_second_run_with_the_same_seed_gives_the_same_report(micro_run, tmp_path):
    _, report = micro_run
    again = run_selection_experiment(tmp_path, seed=0, config=MICRO)

    assert {**again, "seconds": 0} == {**report, "seconds": 0}
    assert (tmp_path / "mixtures" / "opposite-io.jsonl").read_text() == \
        (micro_run[0] / "mixtures" / "opposite-io.jsonl").read_text()


def test_quick_preset_is_a_smaller_default():
    assert QUICK.targets == ("opposite/io",) and QUICK.n_random < ExperimentConfig().n_random
    assert dataclasses.replace(QUICK, targets=ExperimentConfig().targets, n_random=3, include_all=True) == \
        ExperimentConfig()
